"""The Lightning module: any classifier + cross-entropy + the layers' auxiliary losses (KSVD), logged apart."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..aux_loss import collect_aux_loss_parts
from .config import OptimConfig, ScheduleConfig

__all__ = ["ClassificationModule", "build_optimizer", "log_ksvd", "lr_factor"]

_OPTIMIZERS = {"radam": torch.optim.RAdam, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def build_optimizer(optim: OptimConfig, params: Any) -> torch.optim.Optimizer:
    """The optimiser of ``optim`` (betas / eps passed to the Adam family only) over ``params``."""
    kw: dict[str, Any] = {"lr": optim.lr, "weight_decay": optim.weight_decay}
    if optim.name != "sgd":
        if optim.betas is not None:
            kw["betas"] = tuple(optim.betas)
        if optim.eps is not None:
            kw["eps"] = optim.eps
    return _OPTIMIZERS[optim.name](params, **kw)


class ClassificationModule(L.LightningModule):
    """Wraps a task model called as ``model(*inputs) -> logits (B, classes)`` on batches ``(*inputs, y)``.

    The training loss is ``cross_entropy + collect_aux_loss(model)``; the aux term is already weighted by each
    layer's eta (None, i.e. 0, for mechanisms without one). Logged: ``train/loss``, ``train/task_loss``,
    ``train/aux_loss``, ``train/acc`` and ``<split>/loss``, ``<split>/acc`` for every evaluated split.

    Args:
        model: the task model. optim: optimiser settings. eval_splits: names of the validation dataloaders, in order.
        schedule: learning-rate schedule (None: constant). total_steps: the schedule's length when
            ``schedule.total_steps`` is None (the trainer's ``max_steps``).
    """

    def __init__(
        self,
        model: nn.Module,
        optim: OptimConfig,
        eval_splits: list[str] | None = None,
        schedule: ScheduleConfig | None = None,
        total_steps: int | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.optim = optim
        self.eval_splits = list(eval_splits or ["val"])
        self.schedule = schedule or ScheduleConfig()
        self.total_steps = self.schedule.total_steps or total_steps

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.model(*inputs)

    def _losses(self, batch: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        *inputs, y = batch
        logits = self.model(*inputs)  # (B, classes)
        task = F.cross_entropy(logits, y)
        # always collected, so no stale term survives an eval pass
        aux, self.aux_parts = collect_aux_loss_parts(self.model)
        acc = (logits.argmax(-1) == y).float().mean()
        return task, task if aux is None else task + aux, aux, acc

    def training_loss(self, batch: tuple[Tensor, ...], batch_idx: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """``(loss, task loss, aux loss or None, accuracy)`` of one training batch: the training step without logging
        (``primaldual bench steps`` times it)."""
        task, loss, aux, acc = self._losses(batch)
        return loss, task, aux, acc

    def training_inputs(self, batch: tuple[Tensor, ...], generator: torch.Generator) -> tuple[Tensor, ...]:
        """The model's inputs for a training batch ``(*inputs, y)`` as the training step feeds them (after any batch
        augmentation, drawn from ``generator``): what a conversion's stage 1 runs the teacher on."""
        return tuple(batch[:-1])

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        loss, task, aux, acc = self.training_loss(batch, batch_idx)
        self.log_train(loss, task, aux, acc, batch[-1].shape[0])
        return loss

    def log_train(self, loss: Tensor, task: Tensor, aux: Tensor | None, acc: Tensor, batch_size: int) -> None:
        """The training-step metrics (``train/loss`` per step and epoch; the parts and accuracy per epoch)."""
        # sync_dist: under DDP the logged values are means over all ranks, not rank 0's shard.
        kw: dict[str, Any] = {"batch_size": batch_size, "sync_dist": True}
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, **kw)
        self.log("train/task_loss", task, on_step=False, on_epoch=True, **kw)
        self.log("train/aux_loss", 0.0 if aux is None else aux.detach(), on_step=False, on_epoch=True, **kw)
        self.log("train/acc", acc, on_step=False, on_epoch=True, **kw)
        log_ksvd(self, kw)

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int, dataloader_idx: int = 0) -> None:
        task, _, _, acc = self._losses(batch)
        split, bs = self.eval_splits[dataloader_idx], batch[-1].shape[0]
        # Epoch values are batch-size-weighted means, i.e. exact split accuracy / mean loss.
        kw: dict[str, Any] = {"on_epoch": True, "batch_size": bs, "sync_dist": True, "add_dataloader_idx": False}
        self.log(f"{split}/loss", task, **kw)
        self.log(f"{split}/acc", acc, prog_bar=True, **kw)

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        task, _, _, acc = self._losses(batch)
        bs = batch[-1].shape[0]
        self.log("test/loss", task, on_epoch=True, batch_size=bs, sync_dist=True)
        self.log("test/acc", acc, on_epoch=True, batch_size=bs, sync_dist=True)

    def configure_optimizers(self) -> Any:
        return self.with_schedule(build_optimizer(self.optim, self.parameters()))

    def with_schedule(self, opt: torch.optim.Optimizer) -> Any:
        """What ``configure_optimizers`` returns for ``opt``: it alone, or it with the per-step learning-rate schedule."""
        sch = self.schedule
        if sch.warmup_steps == 0 and sch.decay == "constant":
            return opt
        if sch.decay in ("linear", "cosine") and not self.total_steps:
            raise ValueError(f"schedule.decay {sch.decay!r} needs schedule.total_steps or trainer.max_steps")
        factor = partial(lr_factor, warmup=sch.warmup_steps, decay=sch.decay, total=self.total_steps or 0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def lr_factor(step: int, *, warmup: int, decay: str, total: int) -> float:
    """Learning-rate multiplier at optimiser step ``step`` (0-based): linear warm-up from 1/warmup to 1 over
    ``warmup`` steps, then constant, or linear / cosine decay reaching 0 at step ``total``, or ``inverse_sqrt``:
    ``sqrt(warmup / u)`` at update ``u = step + 1 > warmup`` (fairseq's ``inverse_sqrt`` with
    ``warmup_init_lr`` 0: ``u / warmup`` up to ``u = warmup``, then ``lr * sqrt(warmup) / sqrt(u)``)."""
    if step < warmup:
        return (step + 1) / warmup
    if decay == "constant":
        return 1.0
    if decay == "inverse_sqrt":
        return math.sqrt(warmup / (step + 1))
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return 1.0 - frac if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))


def log_ksvd(module: L.LightningModule, kw: dict[str, Any]) -> None:
    """``train/ksvd_J2``: the mean over the primal layers of their unweighted KSVD term J^2 in this step (what
    ``eta`` multiplies; ``train/aux_loss`` is the weighted sum), when the model has such layers. Per step and per
    epoch, so that the history of step- and epoch-based runs both carry it."""
    parts = getattr(module, "aux_parts", None) or {}
    if "ksvd" in parts:
        module.log("train/ksvd_J2", parts["ksvd"], on_step=True, on_epoch=True, **kw)
