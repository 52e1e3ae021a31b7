"""Task ``uea``: multivariate time-series classification on the UEA archive (epoch-based; heldout or paper protocol).

Data: :class:`~primaldual.tasks.uea.data.UEADataModule` (``.ts`` files by exact name, JapaneseVowels fetched and
verified on first use). Model: :class:`~primaldual.models.TimeSeriesClassifier` (post-LN, flatten head).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...options import check_name
from ...train.config import RunConfig
from ..base import register_task
from ..checks import FetchKey, ValFractionKey, check_fetch, check_val_fraction
from ..classification import ClassificationTask

__all__ = ["UEATask"]


@register_task("uea")
class UEATask(ClassificationTask):
    model_kinds = ("timeseries",)
    step_based = False
    protocols = ("heldout", "paper")
    config = {"data": (FetchKey, ValFractionKey)}

    def check(self, cfg: RunConfig) -> None:
        check_name("data.name", cfg.data.name)
        check_fetch(cfg.data)
        check_val_fraction(cfg.data)

    def datamodule(self, cfg: RunConfig) -> Any:
        from .data import UEADataModule

        return UEADataModule(cfg.data, cfg.protocol, cfg.seed)

    def model(self, cfg: RunConfig, dm: Any) -> nn.Module:
        from ...models import TimeSeriesClassifier

        return TimeSeriesClassifier(dm.num_channels, dm.num_classes, dm.max_len, **cfg.model.backbone_kwargs())
