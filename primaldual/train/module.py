"""The Lightning module: any classifier + cross-entropy + the layers' auxiliary losses (KSVD), logged apart."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..aux_loss import collect_aux_loss
from .config import OptimConfig

__all__ = ["ClassificationModule"]

_OPTIMIZERS = {"radam": torch.optim.RAdam, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


class ClassificationModule(L.LightningModule):
    """Wraps a task model called as ``model(*inputs) -> logits (B, classes)`` on batches ``(*inputs, y)``.

    The training loss is ``cross_entropy + collect_aux_loss(model)``; the aux term is already weighted by each
    layer's eta (None, i.e. 0, for mechanisms without one). Logged: ``train/loss``, ``train/task_loss``,
    ``train/aux_loss``, ``train/acc`` and ``<split>/loss``, ``<split>/acc`` for every evaluated split.

    Args:
        model: the task model. optim: optimiser settings. eval_splits: names of the validation dataloaders, in order.
    """

    def __init__(self, model: nn.Module, optim: OptimConfig, eval_splits: list[str] | None = None) -> None:
        super().__init__()
        self.model = model
        self.optim = optim
        self.eval_splits = list(eval_splits or ["val"])

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.model(*inputs)

    def _losses(self, batch: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        *inputs, y = batch
        logits = self.model(*inputs)  # (B, classes)
        task = F.cross_entropy(logits, y)
        aux = collect_aux_loss(self.model)  # always collected, so no stale term survives an eval pass
        acc = (logits.argmax(-1) == y).float().mean()
        return task, task if aux is None else task + aux, aux, acc

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        task, loss, aux, acc = self._losses(batch)
        # sync_dist: under DDP the logged values are means over all ranks, not rank 0's shard.
        kw: dict[str, Any] = {"batch_size": batch[-1].shape[0], "sync_dist": True}
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, **kw)
        self.log("train/task_loss", task, on_step=False, on_epoch=True, **kw)
        self.log("train/aux_loss", 0.0 if aux is None else aux.detach(), on_step=False, on_epoch=True, **kw)
        self.log("train/acc", acc, on_step=False, on_epoch=True, **kw)
        return loss

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

    def configure_optimizers(self) -> torch.optim.Optimizer:
        cls = _OPTIMIZERS[self.optim.name]
        return cls(self.parameters(), lr=self.optim.lr, weight_decay=self.optim.weight_decay)
