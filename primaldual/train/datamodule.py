"""What every task's data module shares: the resumable, rank-sharded epoch sampler and the split-loader base.

Shuffling uses a ``DistributedSampler`` in every case (one replica without DDP) seeded with the run seed: the order
of an epoch depends only on (seed, epoch), so a resumed run sees exactly the batches an uninterrupted one would,
and a 2-process run splits each global batch of the 1-process run between its ranks. Lightning's own sampler
replacement is therefore switched off (``use_distributed_sampler=False``). Evaluation loaders are not sharded:
every rank evaluates the whole split, so metrics are exact.
"""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .config import DataConfig

__all__ = ["SplitDataModule", "TrainerEpochSampler"]


class TrainerEpochSampler(DistributedSampler):
    """A seeded ``DistributedSampler`` whose epoch is the trainer's ``current_epoch`` when iteration starts.

    Lightning's own ``set_epoch`` call uses a loop counter; reading ``current_epoch`` (restored from the checkpoint)
    ties the permutation to the epoch number itself, in fresh and resumed runs alike. After a resume from a
    checkpoint written in the middle of an epoch (step-based runs evaluate and checkpoint every K steps), the
    batches the interrupted run already trained on are skipped, so the run continues with the very batch an
    uninterrupted run would see next. Lightning counts them in ``batch_progress`` (restored before the iterator is
    created); ``batch_size`` is needed to turn that count into samples.

    ``accumulate`` > 1 (gradient accumulation): each epoch is cut to a whole number of optimiser updates
    (``batch_size * accumulate`` samples each; the rest of the permutation is left out of that epoch), so no update
    straddles an epoch boundary and evaluations / checkpoints every K updates fall on update boundaries.
    """

    def __init__(
        self, dataset: Dataset, trainer: L.Trainer | None, batch_size: int = 1, accumulate: int = 1, **kwargs
    ) -> None:
        super().__init__(dataset, **kwargs)
        self._trainer = trainer
        self.batch_size = batch_size
        per_update = batch_size * accumulate
        self.kept = (
            self.num_samples if accumulate <= 1 else max(per_update, self.num_samples // per_update * per_update)
        )

    def __len__(self) -> int:
        return min(self.kept, self.num_samples)

    def set_epoch(self, epoch: int) -> None:
        if self._trainer is None:
            super().set_epoch(epoch)

    def _done_batches(self) -> int:
        """Batches of the current epoch already trained on (0 unless resuming in the middle of an epoch)."""
        if self._trainer is None:
            return 0
        done = self._trainer.fit_loop.epoch_loop.batch_progress.current.completed
        batches = -(-len(self) // self.batch_size)
        return done if 0 < done < batches else 0

    def __iter__(self):
        if self._trainer is None:
            return iter(list(super().__iter__())[: len(self)])
        self.epoch = self._trainer.current_epoch
        indices = list(super().__iter__())[: len(self)]
        return iter(indices[self._done_batches() * self.batch_size :])


class SplitDataModule(L.LightningDataModule):
    """Loaders over ``self.datasets`` (``{"train", "val", "test"}``) for step-based tasks (LRA, language modelling):
    the training split through a :class:`TrainerEpochSampler` (seeded, resumable mid-epoch, one share per rank,
    epochs cut to whole optimiser updates), the evaluation splits in order. Subclasses fill ``datasets`` in
    ``setup``.

    Args:
        cfg: data settings. seed: shuffle seed.
    """

    def __init__(self, cfg: DataConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.datasets: dict[str, Dataset] = {}

    @property
    def eval_splits(self) -> list[str]:
        return ["val"]

    def train_dataloader(self) -> DataLoader:
        t = self.trainer
        world, rank = (t.world_size, t.global_rank) if t is not None else (1, 0)
        ds = self.datasets["train"]
        accumulate = t.accumulate_grad_batches if t is not None else 1
        sampler = TrainerEpochSampler(
            ds, t, self.cfg.batch_size, accumulate, num_replicas=world, rank=rank, shuffle=True, seed=self.seed
        )
        return DataLoader(ds, batch_size=self.cfg.batch_size, sampler=sampler, num_workers=self.cfg.num_workers)

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(self.datasets[split], batch_size=self.cfg.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> list[DataLoader]:
        return [self._eval_loader("val")]

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
