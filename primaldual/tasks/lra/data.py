"""Lightning data module for the Long-Range Arena tasks.

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

from ...data.cache import MissingDataError
from ...train.config import DataConfig
from ...train.datamodule import SplitDataModule
from ..classification import SPLIT_SEED

__all__ = ["LRADataModule", "finish_splits"]


def finish_splits(cfg: DataConfig, build: Callable[[DataConfig], dict[str, Dataset]]) -> dict[str, Dataset]:
    """``build(cfg)`` with the stand-in hint on missing data, and the validation split trimmed to ``val_size``."""
    try:
        splits = build(cfg)
    except MissingDataError as e:
        hint = f" Or run the obtainable stand-in: --data.name {cfg.stand_in}." if cfg.stand_in else ""
        raise MissingDataError(f"{e}{hint}") from None
    if cfg.val_size is not None and len(splits["val"]) > cfg.val_size:
        pick = np.random.default_rng(SPLIT_SEED).choice(len(splits["val"]), cfg.val_size, replace=False)
        splits["val"] = Subset(splits["val"], np.sort(pick).tolist())
    return splits


def _attr(ds: Dataset, name: str, default: Any = None) -> Any:
    """An attribute of the dataset under any ``Subset`` views."""
    while isinstance(ds, Subset):
        ds = ds.dataset
    return getattr(ds, name, default)


class LRADataModule(SplitDataModule):
    """LRA batches for :class:`~primaldual.models.SequenceClassifier` / :class:`~primaldual.models.RetrievalClassifier`.

    Shuffling as :class:`~primaldual.tasks.uea.data.UEADataModule`: a seeded sampler whose order depends only on
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
