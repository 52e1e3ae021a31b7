"""Where datasets live on disk, and the error raised when data is missing.

The cache root is ``$PRIMALDUAL_DATA`` if set, else ``~/.cache/primaldual``. Every dataset owns one
sub-directory (``listops/``, ``pathfinder32/``, ``fashion_mnist/``, ...). Dataset writers fill it with the atomic
helpers of :mod:`primaldual.utils.io`, so an interrupted ``primaldual data generate`` either produced the dataset or
nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MissingDataError", "data_root", "dataset_dir"]


class MissingDataError(FileNotFoundError):
    """Raised when a dataset is not on disk; the message says exactly how to obtain it."""


def data_root() -> Path:
    """The cache root: ``$PRIMALDUAL_DATA`` or ``~/.cache/primaldual``."""
    env = os.environ.get("PRIMALDUAL_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "primaldual"


def dataset_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    """The directory of dataset ``name`` under ``root`` (default: :func:`data_root`); not created."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name: expected a plain directory name, got {name!r}")
    return (Path(root).expanduser() if root is not None else data_root()) / name
