"""Task ``vision``: ViT / DeiT image classification (step-based, heldout protocol, the ``augment`` section).

Data and the DeiT-recipe Lightning module: :mod:`primaldual.tasks.vision.training`. Model:
:class:`~primaldual.models.VisionClassifier` (pre-LN, CLS token, patches or a convolutional stem).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...options import check_int, check_name, check_number
from ...train.config import ConfigError, RunConfig
from ..base import register_task
from ..checks import (
    ImageKeys,
    NumClassesKey,
    ValFractionKey,
    ValSizeKey,
    ViTKeys,
    check_num_classes,
    check_val_fraction,
    check_val_size,
)
from ..classification import ClassificationTask
from . import VISION_IDX_DATASETS
from .config import AugmentConfig

__all__ = ["VisionTask"]


@register_task("vision")
class VisionTask(ClassificationTask):
    model_kinds = ("vit",)
    majority_baseline = True
    config = {
        "data": (ImageKeys, ValSizeKey, ValFractionKey),
        "model": (ViTKeys, NumClassesKey),
        "augment": AugmentConfig,
    }

    def check(self, cfg: RunConfig) -> None:
        d, m = cfg.data, cfg.model
        check_name("data.name", d.name)
        check_int("data.image_size", d.image_size, low=1, allow_none=True)
        check_number("data.crop_pct", d.crop_pct, low=0, high=1, low_open=True)
        check_val_fraction(d)
        check_val_size(d)
        check_num_classes(m)
        check_int("model.patch_size", m.patch_size, low=1)
        check_number("model.drop_path", m.drop_path, low=0, high=1, high_open=True)
        check_int("model.patch_kernel", m.patch_kernel, low=m.patch_size, allow_none=True)
        if m.patch_kernel is not None and (m.patch_kernel - m.patch_size) % 2:
            raise ConfigError(
                f"model.patch_kernel: expected model.patch_size ({m.patch_size}) plus an even number, got "
                f"{m.patch_kernel}"
            )
        if m.stem not in ("patch", "conv"):
            raise ConfigError(f"model.stem: expected 'patch' or 'conv', got {m.stem!r}")
        if m.stem == "conv" and (m.patch_size < 2 or m.patch_size & (m.patch_size - 1) or m.patch_kernel is not None):
            raise ConfigError(
                f"model.stem: 'conv' needs model.patch_size a power of two (got {m.patch_size}) and "
                f"model.patch_kernel null (got {m.patch_kernel})"
            )
        if d.name not in VISION_IDX_DATASETS and d.image_size is None:
            raise ConfigError("data.image_size: an image-folder dataset needs the side the model sees (e.g. 224)")
        if d.image_size is not None and d.image_size % m.patch_size:
            raise ConfigError(f"model.patch_size: {m.patch_size} must divide data.image_size ({d.image_size})")
        try:
            cfg.augment.settings()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"augment: {e}") from None

    def datamodule(self, cfg: RunConfig) -> Any:
        from .training import VisionDataModule

        return VisionDataModule(cfg.data, cfg.seed)

    def model(self, cfg: RunConfig, dm: Any) -> nn.Module:
        from ...models import VisionClassifier
        from ..classification import from_data

        m = cfg.model
        classes = from_data(m.num_classes, dm.num_classes, "model.num_classes")
        if dm.image_size % m.patch_size:
            raise ConfigError(f"model.patch_size: {m.patch_size} must divide the image side ({dm.image_size})")
        return VisionClassifier(
            dm.image_size,
            m.patch_size,
            classes,
            in_channels=dm.channels,
            drop_path=m.drop_path,
            patch_kernel=m.patch_kernel,
            stem=m.stem,
            mean=dm.mean,
            std=dm.std,
            **m.backbone_kwargs(),
        )

    def module(self, cfg: RunConfig, dm: Any) -> Any:
        from .training import VisionModule

        total = cfg.trainer.max_steps if cfg.step_based else None
        return VisionModule(
            self.model(cfg, dm),
            cfg.optim,
            cfg.schedule,
            total,
            cfg.augment,
            num_classes=dm.num_classes,
            image_size=dm.image_size,
            seed=cfg.seed,
        )
