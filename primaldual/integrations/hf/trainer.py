"""Training a converted model with the Hugging Face ``Trainer``: add the auxiliary (KSVD) loss to the task loss.

The ``Trainer`` optimises what the model returns as ``loss``. A converted primal layer records its KSVD term
during every forward with gradients (see :mod:`primaldual.aux_loss`); :class:`PrimalDualTrainer` adds
``collect_aux_loss(model)`` to the loss of each training step (and logs it as ``aux_loss``), so swapping
``Trainer`` for ``PrimalDualTrainer`` is the only change a training script needs. Evaluation runs without
gradients, records nothing and reports the task loss alone.

Gradient accumulation: the ``Trainer`` divides a per-micro-batch loss by the number of accumulation steps unless
the loss is already normalised over the whole accumulated batch (token-count normalisation); the auxiliary term
is a per-micro-batch mean, so it is divided in the second case too, and always weighs the same.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ...aux_loss import collect_aux_loss
from .compat import Trainer, trainer_accumulation_steps, trainer_loss_is_normalised

__all__ = ["PrimalDualTrainer", "add_aux_loss"]


def add_aux_loss(loss: Tensor, model: nn.Module) -> Tensor:
    """``loss + collect_aux_loss(model)`` (``loss`` unchanged when no layer recorded a term); for custom loops."""
    aux = collect_aux_loss(model)
    return loss if aux is None else loss + aux.to(loss.device, loss.dtype)


class PrimalDualTrainer(Trainer):
    """A ``transformers.Trainer`` whose training loss includes the converted layers' auxiliary losses.

    Use exactly as ``Trainer``. The logged ``loss`` is the total (task + auxiliary); ``aux_loss`` is the
    auxiliary part alone, averaged over the steps since the last log.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._aux_total: Tensor | float = 0.0  # summed on the device; read (one sync) only when logging
        self._aux_steps = 0

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Any]:
        """The ``Trainer``'s loss plus ``collect_aux_loss(model)`` (which also clears the recorded terms)."""
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        aux = collect_aux_loss(model)
        if aux is not None:
            aux = aux.to(loss.device, loss.dtype)
            self._aux_total = self._aux_total + aux.detach()
            self._aux_steps += 1
            if trainer_loss_is_normalised(self, num_items_in_batch):
                aux = aux / trainer_accumulation_steps(self)
            loss = loss + aux
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Adds ``aux_loss`` (mean since the last log) to training logs."""
        if self._aux_steps and "loss" in logs:
            logs = {**logs, "aux_loss": float(self._aux_total) / self._aux_steps}
            self._aux_total, self._aux_steps = 0.0, 0
        super().log(logs, *args, **kwargs)
