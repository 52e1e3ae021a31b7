"""Training on PyTorch Lightning (the ``train`` extra): what every task shares (runner, run directory, lock,
checkpoints, callbacks, compile, the config engine). The tasks and their data modules live in :mod:`primaldual.tasks`.

The core layers never import this package, and this package imports Lightning only when one of its names is
used (``primaldual.train.fit``...), so the ``primaldual`` command works without the ``train`` extra.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AtomicCheckpointIO": "callbacks",
    "EpochHistory": "callbacks",
    "EpochSeed": "callbacks",
    "CheckpointError": "checkpoints",
    "load_checkpoint": "checkpoints",
    "RunLock": "lock",
    "RunLockedError": "lock",
    "ConfigError": "config",
    "RunConfig": "config",
    "load_config": "config",
    "ClassificationModule": "module",
    "default_run_dir": "run",
    "evaluate": "run",
    "fit": "run",
    "format_table": "seeds",
    "run_seeds": "seeds",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
