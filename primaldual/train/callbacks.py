"""Lightning plug-ins that make runs durable and reproducible.

* :class:`AtomicCheckpointIO`: Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose
  temporary file lives in the system temp dir; when that is another file system, the final ``shutil.move`` is a
  copy into the destination, which a SIGKILL can leave half-written. We write to a temporary file *in the
  checkpoint's own directory*, fsync it and ``os.replace`` it into place (atomic on POSIX), with
  :func:`primaldual.utils.io.atomic_write_bytes`; before ``last.ckpt`` is replaced, the old one becomes
  ``last.prev.ckpt`` (the fallback when ``last.ckpt`` is unreadable). Every load goes through
  :func:`~primaldual.train.checkpoints.load_checkpoint` (``weights_only=True``), whatever Lightning asks for.
* :class:`EpochSeed`: reseeds torch / numpy / random before every training step from (seed, step, rank), so
  dropout masks after a resume are the ones an uninterrupted run would draw.
* :class:`EpochHistory`: one row per epoch (or, in step-based runs, per periodic evaluation) with train and
  evaluation metrics, kept in the checkpoint so a resumed run has the full history; writes ``history.csv``
  atomically, selects the best row by the protocol and saves ``checkpoints/best.ckpt``; prints one progress line
  per row.
"""

from __future__ import annotations

import csv
import io
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ..tasks.protocols import Protocol
from ..utils.io import atomic_write_bytes
from .checkpoints import keep_previous, load_checkpoint

__all__ = ["AtomicCheckpointIO", "EpochHistory", "EpochSeed", "StepTimer"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints are serialised in memory and renamed into place: a crash leaves the old file or the new one.

    Args:
        rotate: file names (default ``last.ckpt``) whose current version is kept as ``<stem>.prev.ckpt``
            (hard link, atomic rename) before each replacement.
    """

    def __init__(self, rotate: tuple[str, ...] = ("last.ckpt",)) -> None:
        super().__init__()
        self.rotate = tuple(rotate)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options, got {storage_options!r}")
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        data = buf.getvalue()  # serialised before the rotation: a failure here leaves both files as they were
        if Path(path).name in self.rotate:
            keep_previous(path)
        atomic_write_bytes(path, data)

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Always the safe load (``weights_only=True``, see :mod:`primaldual.train.checkpoints`)."""
        return load_checkpoint(path, map_location=map_location)


class EpochSeed(L.Callback):
    """Reseed every RNG before each training step from ``(seed, global step, global rank)``.

    Per step rather than per epoch: after a restart Lightning skips some epoch hooks of the epoch it resumes at,
    so anything keyed to them would drift; the step counter is restored exactly. With gradient accumulation
    (``accumulate`` > 1 batches per optimiser step) the batch's place in its step enters the seed too, so the
    batches of one step draw different dropout masks.
    """

    def __init__(self, seed: int, accumulate: int = 1) -> None:
        self.seed, self.accumulate = seed, accumulate

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        s = self.seed * 1_000_003 + trainer.global_step * 1_009 + trainer.global_rank
        if self.accumulate > 1:
            s = s * 131 + batch_idx % self.accumulate
        s %= 2**31 - 1
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)


class StepTimer(L.Callback):
    """Wall time of each training step and the peak memory of training, for ``summary.json``.

    A step is timed from ``on_train_batch_start`` to ``on_train_batch_end`` (forward, backward, optimiser; CUDA is
    synchronised at both ends so the time is the device's); evaluations and checkpoint writes fall outside. The
    first ``warmup`` steps of an attempt (allocator growth, ``torch.compile``) are left out of the median. Memory:
    :class:`~primaldual.utils.memory.PeakMemory` from the start of training (CUDA ``max_memory_allocated`` above
    what was allocated then, or the process's peak resident set above its size then, on the CPU).
    """

    def __init__(self, warmup: int = 10) -> None:
        self.warmup = warmup
        self.times: list[float] = []
        self.memory: Any = None
        self._t0 = 0.0

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from ..utils.memory import PeakMemory

        self.memory = PeakMemory(pl_module.device)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        self._sync(pl_module)
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int):
        self._sync(pl_module)
        self.times.append(time.perf_counter() - self._t0)

    def summary(self) -> dict[str, Any]:
        """``train_step_seconds`` (median after the warm-up), the count timed, and the peak memory in MiB."""
        timed = self.times[self.warmup :] or self.times
        out: dict[str, Any] = {"train_steps_timed": len(timed)}
        if timed:
            out["train_step_seconds"] = round(float(np.median(timed)), 6)
        if self.memory is not None:
            out["peak_memory_mb"] = round(self.memory.mb(), 1)
            out["peak_memory_method"] = self.memory.method
        return out


_TRAIN_KEYS = ("train/loss_epoch", "train/task_loss", "train/aux_loss", "train/ksvd_J2_epoch", "train/acc")
# step-based rows: the loss (and the primal layers' unweighted KSVD term J^2) of the last training step
_STEP_TRAIN_KEYS = ("train/loss_step", "train/ksvd_J2_step")


class EpochHistory(L.Callback):
    """Per-epoch (or per-evaluation) metrics, best-row selection and ``best.ckpt`` (state saved in every checkpoint).

    Args:
        run_dir: the run directory (``history.csv``, ``checkpoints/best.ckpt``).
        protocol: selects the best row. eval_splits: splits logged at each evaluation.
        verbose: print one line per row on rank 0.
        every: ``"epoch"`` (a row at the end of every epoch) or ``"val"`` (a row after every periodic evaluation of
            a step-based run).
        metrics: the metrics recorded per evaluated split (``<split>/<metric>``; language models: loss and ppl).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        protocol: Protocol,
        eval_splits: list[str],
        verbose: bool = True,
        every: str = "epoch",
        metrics: tuple[str, ...] = ("loss", "acc"),
    ):
        if every not in ("epoch", "val"):
            raise ValueError(f"every: expected 'epoch' or 'val', got {every!r}")
        self.run_dir = Path(run_dir)
        self.protocol, self.eval_splits, self.verbose, self.every = protocol, eval_splits, verbose, every
        self.metrics = tuple(metrics)
        self.rows: list[dict[str, Any]] = []

    @property
    def best_path(self) -> Path:
        return self.run_dir / "checkpoints" / "best.ckpt"

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every == "epoch":
            self._record(trainer, _TRAIN_KEYS)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every == "val" and trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._record(trainer, _STEP_TRAIN_KEYS)

    def _record(self, trainer: L.Trainer, train_keys: tuple[str, ...]) -> None:
        m = trainer.callback_metrics
        row: dict[str, Any] = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        for key in train_keys + tuple(f"{s}/{k}" for s in self.eval_splits for k in self.metrics):
            if key in m:
                row[key.replace("_epoch", "")] = float(m[key])
        self.rows.append(row)
        is_best = self.protocol.best(self.rows) is row
        if is_best:  # collective: every rank calls it, rank 0 writes; weights_only here = a full-state save, no load
            trainer.save_checkpoint(self.best_path, weights_only=False)
        if trainer.is_global_zero:
            self._write_csv()
            if self.verbose:
                shown = "  ".join(f"{k} {v:.4f}" for k, v in row.items() if "/" in k)
                mark = "  *best*" if is_best and self.protocol.select_on != "last" else ""
                where = (
                    f"epoch {row['epoch'] + 1}/{trainer.max_epochs}"
                    if self.every == "epoch"
                    else f"step {row['step']}/{trainer.max_steps}"
                )
                print(f"{where}  {shown}{mark}", file=sys.stdout, flush=True)

    def _write_csv(self) -> None:
        keys: list[str] = []
        for r in self.rows:
            keys += [k for k in r if k not in keys]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=keys)
        w.writeheader()
        w.writerows(self.rows)
        atomic_write_bytes(self.run_dir / "history.csv", buf.getvalue().encode())

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = [dict(r) for r in state_dict["rows"]]
