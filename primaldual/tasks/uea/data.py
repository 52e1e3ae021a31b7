"""The UEA data module: load by name, split (per protocol), normalise on train, pad, batch.

The shuffling and sharding rules are the shared ones of :class:`~primaldual.train.datamodule.TrainerEpochSampler`.
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from ...data.splits import stratified_split
from ...data.uea import ChannelNormalizer, find_uea_files, load_uea, pad_series
from ...train.config import DataConfig
from ...train.datamodule import TrainerEpochSampler
from ..base import get_protocol

__all__ = ["UEADataModule"]


class UEADataModule(L.LightningDataModule):
    """Batches ``(x (B, N, C) float32, mask (B, N) bool, y (B,) int64)`` with N = the dataset's max length.

    Args:
        cfg: data settings. protocol: ``heldout`` or ``paper``. seed: split and shuffle seed.
    """

    def __init__(self, cfg: DataConfig, protocol: str = "heldout", seed: int = 0) -> None:
        super().__init__()
        self.cfg, self.protocol, self.seed = cfg, get_protocol(protocol), seed
        self.datasets: dict[str, TensorDataset] = {}

    def prepare_data(self) -> None:
        """Fetch JapaneseVowels when missing and allowed (other datasets come from ``data.root``)."""
        if self.cfg.name == "JapaneseVowels" and self.cfg.root is None and self.cfg.fetch:
            from ...data.uea_fetch import fetch_japanese_vowels

            fetch_japanese_vowels()
        find_uea_files(self.cfg.name, self.cfg.root)  # a clear MissingDataError otherwise

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        train, test = load_uea(self.cfg.name, self.cfg.root)
        # Pad to the longest series of the dataset (TRAIN and TEST), as the reference protocol: the flatten head
        # needs one fixed length. Only lengths are read from TEST, never values or labels.
        self.max_len = max(train.max_length, test.max_length)
        self.num_channels, self.num_classes = train.num_channels, train.num_classes
        self.class_names = train.class_names
        if self.protocol.name == "heldout":
            tr_idx, va_idx = stratified_split(train.labels, self.cfg.val_fraction, self.seed)
            if len(va_idx) == 0:
                raise ValueError(
                    f"{train.path}: cannot hold out a stratified validation split (data.val_fraction "
                    f"{self.cfg.val_fraction}): every class has a single case; use --protocol paper or more data"
                )
        else:
            tr_idx, va_idx = np.arange(len(train)), np.zeros(0, dtype=np.int64)
        parts = {
            "train": ([train.series[i] for i in tr_idx], train.labels[tr_idx]),
            "val": ([train.series[i] for i in va_idx], train.labels[va_idx]),
            "test": (test.series, test.labels),
        }
        where = f"{train.path}" + (" (heldout: validation cases excluded)" if len(va_idx) else "")
        self.normalizer = ChannelNormalizer().fit(parts["train"][0], where)  # statistics of the training cases only
        for split, (series, labels) in parts.items():
            if not series:
                continue
            x, mask = pad_series(self.normalizer.transform(series), self.max_len)
            self.datasets[split] = TensorDataset(torch.from_numpy(x), torch.from_numpy(mask), torch.from_numpy(labels))
        self.sizes = {k: len(v) for k, v in self.datasets.items()}

    @property
    def eval_splits(self) -> list[str]:
        """Splits evaluated after every epoch, in val-dataloader order."""
        return [self.protocol.eval_split]

    def _world(self) -> tuple[int, int]:
        t = self.trainer
        return (t.world_size, t.global_rank) if t is not None else (1, 0)

    def train_dataloader(self) -> DataLoader:
        world, rank = self._world()
        ds = self.datasets["train"]
        sampler = TrainerEpochSampler(
            ds, self.trainer, self.cfg.batch_size, num_replicas=world, rank=rank, shuffle=True, seed=self.seed
        )
        return DataLoader(ds, batch_size=self.cfg.batch_size, sampler=sampler, num_workers=self.cfg.num_workers)

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(self.datasets[split], batch_size=self.cfg.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> list[DataLoader]:
        return [self._eval_loader(s) for s in self.eval_splits]

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
