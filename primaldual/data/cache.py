"""Where datasets live on disk, atomic writes, and the error raised when data is missing.

The cache root is ``$PRIMALDUAL_DATA`` if set, else ``~/.cache/primaldual``. Every dataset owns one
sub-directory (``listops/``, ``pathfinder32/``, ``fashion_mnist/``, ...). Writers never leave a half-written file
or directory behind: they write to a temporary sibling and ``os.replace`` it into place, which is atomic on POSIX
file systems, so an interrupted ``primaldual data generate`` either produced the dataset or nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "MissingDataError",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "data_root",
    "dataset_dir",
]


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


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary sibling, fsync, an atomic rename, and a directory fsync."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # persist the rename itself
        dfd = os.open(path.parent, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """UTF-8 version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory in a temporary sibling, then rename it to ``path`` when the block succeeds.

    Args:
        path: final directory.
        overwrite: replace an existing ``path``; otherwise an existing one is an error.

    Yields:
        The temporary directory to fill. On an exception it is removed and ``path`` is left untouched.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists (pass overwrite=True / --force to regenerate it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            # Move the old copy aside first so that the final rename is a single atomic step.
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
