"""Task ``vision``: ViT / DeiT image classification on image folders (ImageNet-style) or Fashion-MNIST / MNIST.

Data (``data.name``):

* ``fashion_mnist`` / ``mnist``: the real idx files (:class:`~primaldual.data.images.IdxImages`), 55k train / 5k
  validation (500 per class from the training files, fixed seed) / 10k test, 1 x 28 x 28, normalised with the
  training images' mean and standard deviation.
* any other name: an image-folder tree at ``data.root`` (:class:`~primaldual.data.images.ImageFolderDataset`), RGB,
  ImageNet's mean / std. ``train/<class>/*`` trains; with a ``test/`` folder, ``val/`` validates and ``test/`` is
  the test split; without one (ImageNet-100 / ImageNet-1K as released: ``train/`` and ``val/``), a stratified
  ``data.val_fraction`` of ``train/`` (seed 0, the same for every run) validates and ``val/``, on which the papers
  report top-1, is the test split, evaluated once on the best-validation checkpoint (heldout protocol).
  Training images are decoded at ``image_size / crop_pct`` (shorter side, centre square) for the random resized
  crop; evaluation images are the centre ``image_size`` crop of that (DeiT's resize 256, crop 224).

Batches are ``(images (B, C, S, S) uint8, y (B,))``: the model holds the normalisation (``mean`` / ``std``), so
its checkpoints and ``primaldual analyze`` take raw pixels. Training batches go through
:class:`~primaldual.data.augment.BatchAugment` (the ``augment`` section: DeiT's random resized crop, flip,
RandAugment, random erasing, mixup / cutmix with label smoothing) in the training step, on the device, with a
generator seeded from (run seed, optimiser step, accumulation micro-batch, rank): a resumed run draws the same
augmentations as an uninterrupted one. The loss is soft-target cross-entropy plus the layers' auxiliary (KSVD)
terms; AdamW without weight decay on biases, norms, the CLS token and the positions (timm's rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Subset

from ...aux_loss import collect_aux_loss_parts
from ...data.cache import MissingDataError
from ...data.splits import stratified_split
from ...train.config import ConfigError, OptimConfig, ScheduleConfig
from ...train.datamodule import SplitDataModule
from ...train.module import ClassificationModule, build_optimizer
from . import VISION_IDX_DATASETS
from .config import AugmentConfig

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "VisionDataModule", "VisionModule"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_SPLIT_SEED = 0  # data splits do not depend on the run seed


class VisionDataModule(SplitDataModule):
    """Image batches ``(images (B, C, S, S) uint8, y (B,))`` (training: ``S = image_size / crop_pct`` for folders).

    After :meth:`setup`: ``datasets``, ``num_classes``, ``channels``, ``image_size``, ``mean``, ``std``, ``sizes``,
    ``info``, ``classes``.

    Args:
        cfg: data settings. seed: shuffle seed (splits do not depend on it).
    """

    def prepare_data(self) -> None:
        """Nothing to download: idx files come from the Debian package or a folder, image folders from ``data.root``."""

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        from ...data import images

        cfg = self.cfg
        if cfg.name in VISION_IDX_DATASETS:
            if cfg.image_size not in (None, 28):
                raise ConfigError(
                    f"data.image_size: {cfg.name} images are 28 x 28; set it to null or 28, got {cfg.image_size}"
                )
            self.datasets = {s: images.IdxImages(s, dataset=cfg.name, root=cfg.root) for s in ("train", "val", "test")}
            train = self.datasets["train"]
            self.image_size, self.channels = 28, 1
            self.mean, self.std = tuple(train.mean), tuple(train.std)
            self.classes = list(train.classes)
            self.info = dict(self.datasets["test"].info)
        else:
            self._setup_folder(images)
        if cfg.val_size is not None and len(self.datasets["val"]) > cfg.val_size:
            pick = np.random.default_rng(_SPLIT_SEED).choice(len(self.datasets["val"]), cfg.val_size, replace=False)
            self.datasets["val"] = Subset(self.datasets["val"], np.sort(pick).tolist())
        self.num_classes = len(self.classes)
        self.sizes = {k: len(v) for k, v in self.datasets.items()}

    def _setup_folder(self, images: Any) -> None:
        cfg = self.cfg
        if cfg.root is None:
            raise MissingDataError(
                f"data.name {cfg.name!r}: an image-folder dataset, which primaldual cannot download; set data.root "
                "to the folder holding train/<class>/* and val/<class>/* (and optionally test/<class>/*)"
            )
        if cfg.image_size is None:
            raise ConfigError(f"data.image_size: the image-folder dataset {cfg.name!r} needs the side (e.g. 224)")
        root = Path(cfg.root)
        kw = {"image_size": cfg.image_size, "crop_pct": cfg.crop_pct}
        train = images.ImageFolderDataset(root / "train", train=True, **kw)
        classes = list(train.classes)
        if (root / "test").is_dir():
            val = images.ImageFolderDataset(root / "val", classes=classes, **kw)
            test = images.ImageFolderDataset(root / "test", classes=classes, **kw)
            how = "val/ validates, test/ is the test split"
        else:
            test = images.ImageFolderDataset(root / "val", classes=classes, **kw)
            tr, va = stratified_split(np.asarray(train.labels), cfg.val_fraction, _SPLIT_SEED)
            if len(va) == 0:
                raise ValueError(
                    f"{root / 'train'}: cannot carve a stratified validation split (data.val_fraction "
                    f"{cfg.val_fraction}): every class has a single image"
                )
            # the held-out images are read with the evaluation transform (centre crop), not the training one
            val = Subset(images.ImageFolderDataset(root / "train", classes=classes, **kw), va.tolist())
            train = Subset(train, tr.tolist())
            how = f"{cfg.val_fraction:g} of train/ (stratified, seed {_SPLIT_SEED}) validates, val/ is the test split"
        self.datasets = {"train": train, "val": val, "test": test}
        self.image_size, self.channels = cfg.image_size, 3
        self.mean, self.std = IMAGENET_MEAN, IMAGENET_STD
        self.classes = classes
        self.info = {
            "dataset": cfg.name,
            "source": f"image folder {root}",
            "splits": how,
            "image_size": cfg.image_size,
            "num_classes": len(classes),
        }


class VisionModule(ClassificationModule):
    """:class:`ClassificationModule` with the batch augmentation and soft targets of the DeiT recipe.

    Args:
        model: a :class:`~primaldual.models.VisionClassifier` built with ``mean`` / ``std`` (it takes raw pixels).
        optim, schedule, total_steps: as :class:`ClassificationModule`. augment: the ``augment`` section.
        num_classes: classes (soft-target width). image_size: the side the model sees. seed: augmentation seed.
    """

    def __init__(
        self,
        model: nn.Module,
        optim: OptimConfig,
        schedule: ScheduleConfig | None,
        total_steps: int | None,
        augment: AugmentConfig,
        *,
        num_classes: int,
        image_size: int,
        seed: int,
    ) -> None:
        super().__init__(model, optim, ["val"], schedule, total_steps)
        from ...data.augment import BatchAugment

        mean = model.mean.flatten().tolist()
        std = model.std.flatten().tolist()
        self.augment = BatchAugment(augment.settings(), image_size, num_classes, mean, std)
        self.seed = seed

    def _generator(self, batch_idx: int) -> torch.Generator:
        """A CPU generator for this micro-batch: (seed, optimiser step, micro-batch, rank) -> one stream."""
        t = self._trainer
        accumulate = t.accumulate_grad_batches if t is not None else 1
        rank = t.global_rank if t is not None else 0
        key = np.random.SeedSequence([self.seed, int(self.global_step), batch_idx % accumulate, rank])
        return torch.Generator().manual_seed(int(key.generate_state(1, np.uint64)[0]) >> 1)

    def training_loss(self, batch: tuple[Tensor, ...], batch_idx: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        from ...data.augment import soft_target_cross_entropy

        images, y = batch
        x, targets = self.augment(images, y, self._generator(batch_idx))  # (B, C, S, S), (B, classes)
        logits = self.model(x)  # (B, classes)
        task = soft_target_cross_entropy(logits, targets)
        aux, self.aux_parts = collect_aux_loss_parts(self.model)  # the parts: log_ksvd logs them
        loss = task if aux is None else task + aux
        acc = (logits.argmax(-1) == y).float().mean()  # against the unmixed labels
        return loss, task, aux, acc

    def training_inputs(self, batch: tuple[Tensor, ...], generator: torch.Generator) -> tuple[Tensor, ...]:
        images, y = batch
        return (self.augment(images, y, generator)[0],)  # (B, C, S, S): cropped, flipped, mixed as in training

    def configure_optimizers(self) -> Any:
        # timm's rule: no weight decay on biases, norms (1-D parameters), the CLS token and the positions
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            skip = p.ndim <= 1 or name == "cls" or name.startswith("pos.")
            (no_decay if skip else decay).append(p)
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        return self.with_schedule(build_optimizer(self.optim, groups))
