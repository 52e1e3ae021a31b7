"""What the classification tasks share (``uea``, the ``lra_*`` tasks, ``vision``): :class:`ClassificationTask`, whose
Lightning module, results and report are those of a classifier scored by accuracy, and the split helpers.

The contract (:class:`~primaldual.tasks.base.Task`) stays on the floor under the runner; this module sits above it
(it builds :class:`~primaldual.train.module.ClassificationModule`), beside the task packages that use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset, Subset

from ..data.splits import stratified_split
from ..utils.errors import ConfigError
from .base import Task, data_info
from .protocols import Protocol

if TYPE_CHECKING:
    from ..train.config import RunConfig

__all__ = ["SPLIT_SEED", "ClassificationTask", "carve", "from_data", "labels_of", "majority_baseline"]

SPLIT_SEED = 0  # data splits do not depend on the run seed


class ClassificationTask(Task):
    """A task whose model classifies: cross-entropy, accuracy, the classification Lightning module.

    Subclasses name their data module and model (:meth:`~Task.datamodule`, :meth:`~Task.model`) and may override
    the rest. With ``majority_baseline = True`` the summary also records the data's ``info`` and the test accuracy
    of always predicting the most frequent training class.
    """

    def module(self, cfg: RunConfig, dm: Any) -> Any:
        from ..train.module import ClassificationModule

        total = cfg.trainer.max_steps if cfg.step_based else None
        return ClassificationModule(self.model(cfg, dm), cfg.optim, dm.eval_splits, cfg.schedule, total)

    def results(
        self, cfg: RunConfig, dm: Any, module: Any, protocol: Protocol, best: dict[str, Any], test: dict | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.majority_baseline:
            out.update(data=data_info(dm), majority_class_test_acc=majority_baseline(dm))
        if test is None:
            return {**out, "test_acc": best["test/acc"], "test_loss": best["test/loss"]}
        return {
            **out,
            "val_acc": best["val/acc"],
            "test_acc": float(test["test/acc"]),
            "test_loss": float(test["test/loss"]),
        }

    def report(self, cfg: RunConfig, summary: dict[str, Any], protocol: Protocol) -> str:
        s = summary
        where = (
            f"step {s['best_step']} of {s['steps']}" if cfg.step_based else f"epoch {s['best_epoch']} of {s['epochs']}"
        )
        base = s.get("majority_class_test_acc")
        base_txt = f"; majority class {100 * base:.2f}%" if base is not None else ""
        return (
            f"\n{cfg.data.name} {cfg.name} [{protocol.label}]: test accuracy {100 * s['test_acc']:.2f}% "
            f"({where}{base_txt})\nrun directory: {s['run_dir']} "
            f"(config.yaml, history.csv, logs/*/metrics.csv, checkpoints/, summary.json)"
        )


def labels_of(ds: Dataset) -> np.ndarray:
    """Labels of a dataset (through ``Subset`` views) without loading its inputs."""
    if isinstance(ds, Subset):
        return labels_of(ds.dataset)[np.asarray(ds.indices, dtype=np.int64)]
    return np.asarray(ds.labels)


def carve(ds: Dataset, fraction: float, source: str) -> tuple[Subset, Subset]:
    """Stratified (train, val) subsets of a dataset that ships without a validation split."""
    tr, va = stratified_split(labels_of(ds), fraction, SPLIT_SEED)
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


def majority_baseline(dm: Any) -> float:
    """Test accuracy of always predicting the most frequent training class."""
    majority = np.bincount(labels_of(dm.datasets["train"])).argmax()
    return float((labels_of(dm.datasets["test"]) == majority).mean())
