"""Evaluation protocols: which data trains, which split selects the epoch, and how the result is labelled.

* ``heldout`` (default, honest): a stratified validation split (``data.val_fraction``, seeded) is carved out of
  TRAIN; the epoch with the best validation accuracy (ties: lower validation loss, then the earlier epoch) is
  selected and its checkpoint is evaluated once on TEST.
* ``paper`` (the UEA reference protocol of Flowformer / Time-Series-Library / Primal-Attention): trains on all of
  TRAIN, evaluates TEST after every epoch and reports the best TEST accuracy over epochs. It selects on the test
  split, so every output carries the label ``paper protocol (selects on test)``.

A task names the protocol it uses (:meth:`primaldual.tasks.Task.protocol`): language modelling uses ``heldout``
with selection by the lowest validation loss (token cross-entropy; ties: the earlier step), :data:`LM_HELDOUT`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["LM_HELDOUT", "PROTOCOLS", "Protocol"]


@dataclass(frozen=True)
class Protocol:
    """name; label (printed with every result); eval_split: the split evaluated each epoch ("val" or "test");
    select_on: ``acc`` (highest accuracy, ties: lower loss), ``loss`` (lowest loss) or ``last`` (the latest row:
    nothing is selected); test_once: the selected checkpoint is evaluated once on test after training (when
    ``eval_split`` is not already test)."""

    name: str
    label: str
    eval_split: str
    select_on: str = "acc"
    test_once: bool = True

    def sort_key(self, row: dict[str, Any]) -> tuple[float, ...]:
        """Smaller is better: the best row of a history is ``min(rows, key=sort_key)`` (ties: the earlier step)."""
        s = self.eval_split
        if self.select_on == "last":
            return (-int(row["step"]),)
        if self.select_on == "loss":
            return (float(row[f"{s}/loss"]), int(row["step"]))
        return (-float(row[f"{s}/acc"]), float(row[f"{s}/loss"]), int(row["step"]))

    def best(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        if not rows:
            raise ValueError("no completed epoch to select from")
        return min(rows, key=self.sort_key)


PROTOCOLS: dict[str, Protocol] = {
    "heldout": Protocol(
        "heldout", "heldout protocol (validation split selects the checkpoint; test evaluated once)", "val"
    ),
    "paper": Protocol("paper", "paper protocol (selects on test)", "test"),
}


LM_HELDOUT = Protocol(
    "heldout", "heldout protocol (lowest validation loss selects the checkpoint; test evaluated once)", "val", "loss"
)
