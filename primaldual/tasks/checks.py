"""Checks of the config keys that several tasks read (each task checks the keys it declares, in :meth:`Task.check`;
the generic checks of :mod:`primaldual.train.validate` cover the keys every task reads).

A key that a task does not declare never reaches these: it is refused for that task unless at its default."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..models.init import INITS
from ..options import check_bool, check_choice, check_int, check_number

if TYPE_CHECKING:
    from ..train.schema import DataConfig, ModelConfig

__all__ = [
    "check_fetch",
    "check_init",
    "check_num_classes",
    "check_token_model",
    "check_val_fraction",
    "check_val_size",
]


def check_fetch(d: DataConfig) -> None:
    check_bool("data.fetch", d.fetch)


def check_val_fraction(d: DataConfig) -> None:
    check_number("data.val_fraction", d.val_fraction, low=0, high=1, low_open=True, high_open=True)


def check_val_size(d: DataConfig) -> None:
    check_int("data.val_size", d.val_size, low=1, allow_none=True)


def check_num_classes(m: ModelConfig) -> None:
    check_int("model.num_classes", m.num_classes, low=2, allow_none=True)


def check_token_model(m: ModelConfig) -> None:
    """The keys of a model over token ids (LRA's classifiers, the causal LM): positions, layer norm, vocabulary."""
    if m.positions not in ("learned", "sinusoidal"):
        raise ValueError(f"model.positions: expected 'learned' or 'sinusoidal', got {m.positions!r}")
    check_bool("model.norm_first", m.norm_first)
    check_int("model.vocab_size", m.vocab_size, low=1, allow_none=True)


def check_init(m: ModelConfig) -> None:
    check_choice("model.init", m.init, INITS)
