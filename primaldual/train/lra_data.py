"""Lightning data module for the Long-Range Arena tasks, and what the classification tasks share about splits.

The task (:mod:`primaldual.tasks.lra`) reads its splits; :class:`LRADataModule` trims the validation split to
``data.val_size`` (a fixed random subset: cheaper periodic evaluation; the test split is always used whole), adds
the config's stand-in to a missing-data error, and batches. Batches are ``(tokens (B, N) int64, mask (B, N) bool,
y (B,))`` or, for retrieval, ``(tokens_a, tokens_b, mask_a, mask_b, y)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Subset

from ..data.cache import MissingDataError
from ..data.splits import stratified_split
from .config import ConfigError, DataConfig
from .datamodule import SplitDataModule

__all__ = ["LRADataModule", "carve", "finish_splits", "from_data", "labels_of", "majority_baseline"]

_SPLIT_SEED = 0  # data splits do not depend on the run seed


def labels_of(ds: Dataset) -> np.ndarray:
    """Labels of a dataset (through ``Subset`` views) without loading its inputs."""
    if isinstance(ds, Subset):
        return labels_of(ds.dataset)[np.asarray(ds.indices, dtype=np.int64)]
    return np.asarray(ds.labels)


def carve(ds: Dataset, fraction: float, source: str) -> tuple[Subset, Subset]:
    """Stratified (train, val) subsets of a dataset that ships without a validation split."""
    tr, va = stratified_split(labels_of(ds), fraction, _SPLIT_SEED)
    if len(va) == 0:
        raise ValueError(
            f"{source}: cannot carve a stratified validation split from train (data.val_fraction {fraction}): "
            "every class has a single example"
        )
    return Subset(ds, tr.tolist()), Subset(ds, va.tolist())


def from_data(cfg_value: int | None, data_value: int, key: str) -> int:
    """A size the config may leave to the data (None) or state, in which case it must agree."""
    if cfg_value is not None and cfg_value != data_value:
        raise ConfigError(f"{key}: the config says {cfg_value} but the data has {data_value}; set it to null or that")
    return data_value


def finish_splits(cfg: DataConfig, build: Callable[[DataConfig], dict[str, Dataset]]) -> dict[str, Dataset]:
    """``build(cfg)`` with the stand-in hint on missing data, and the validation split trimmed to ``val_size``."""
    try:
        splits = build(cfg)
    except MissingDataError as e:
        hint = f" Or run the obtainable stand-in: --data.name {cfg.stand_in}." if cfg.stand_in else ""
        raise MissingDataError(f"{e}{hint}") from None
    if cfg.val_size is not None and len(splits["val"]) > cfg.val_size:
        pick = np.random.default_rng(_SPLIT_SEED).choice(len(splits["val"]), cfg.val_size, replace=False)
        splits["val"] = Subset(splits["val"], np.sort(pick).tolist())
    return splits


def majority_baseline(dm: Any) -> float:
    """Test accuracy of always predicting the most frequent training class."""
    majority = np.bincount(labels_of(dm.datasets["train"])).argmax()
    return float((labels_of(dm.datasets["test"]) == majority).mean())


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
        cfg: data settings. build: ``cfg -> {"train", "val", "test"}`` datasets (the task's). seed: shuffle seed.
    """

    def __init__(self, cfg: DataConfig, build: Callable[[DataConfig], dict[str, Dataset]], seed: int = 0) -> None:
        super().__init__(cfg, seed)
        self.build = build

    def prepare_data(self) -> None:
        """Nothing to download up front: :meth:`setup` fetches the stand-ins that are fetchable."""

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.datasets = finish_splits(self.cfg, self.build)
        train = self.datasets["train"]
        sample = train[0]
        self.max_len = int(sample[0].shape[0])
        self.vocab_size = int(_attr(train, "vocab_size"))
        self.num_classes = int(_attr(train, "num_classes"))
        self.sizes = {k: len(v) for k, v in self.datasets.items()}
        self.info = dict(_attr(self.datasets["test"], "info", {}))
