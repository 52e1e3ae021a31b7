"""File helpers: atomic writes of files and directories, JSON, and SHA-256 checksums (standard library only).

Writers never leave a half-written file or directory behind: they write to a temporary sibling, ``fsync`` it and
``os.replace`` it into place, which is atomic on POSIX file systems, so an interrupted write leaves either the old
content or the new one. A temporary *sibling* (not a file in the system temp dir) keeps the final rename on one file
system, where it is a rename rather than a copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DIR_MARK",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "sha256_file",
]

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary sibling, fsync, an atomic rename, and a directory fsync.

    Parent directories are created. Returns ``path`` as a :class:`~pathlib.Path`.
    """
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
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """UTF-8 version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, allow_nan: bool = True) -> Path:
    """``json.dumps(obj, indent=indent)`` plus a final newline, written with :func:`atomic_write_bytes`.

    ``allow_nan=False`` refuses NaN / infinity (``ValueError``) instead of writing non-standard JSON.
    """
    return atomic_write_text(path, json.dumps(obj, indent=indent, allow_nan=allow_nan) + "\n")


#: the file :func:`atomic_dir` leaves in every directory it builds: only a directory holding it is ever replaced
DIR_MARK = ".primaldual-data"


@contextlib.contextmanager
def atomic_dir(
    path: str | os.PathLike, *, overwrite: bool = False, mark: str = DIR_MARK, owned: bool = False
) -> Iterator[Path]:
    """Build a directory in a temporary sibling, then rename it to ``path`` when the block succeeds.

    Every directory built here holds ``mark`` (written unless the block wrote its own), and an existing ``path`` is
    replaced only when it holds ``mark`` too, or is empty: a directory primaldual did not write is never deleted.

    Args:
        path: final directory.
        overwrite: replace an existing ``path`` (one that holds ``mark``, or an empty one); otherwise an existing
            one is an error.
        mark: the name of the marker file.
        owned: the caller has checked that an existing ``path`` is primaldual's by other means (a generator's
            metadata naming it, from before the mark), so it is replaced without ``mark``.

    Yields:
        The temporary directory to fill. On an exception it is removed and ``path`` is left untouched.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false, or it holds files without ``mark``.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists (--force, or overwrite=True, replaces it)")
    unmarked = not (path / mark).is_file() and (not path.is_dir() or any(path.iterdir()))
    if path.exists() and unmarked and not owned:
        raise FileExistsError(
            f"{path} exists and holds files primaldual did not write (no {mark} in it); nothing in it was touched. "
            "Choose another directory, or empty or remove this one yourself"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if not (tmp / mark).exists():
            (tmp / mark).write_text("written by primaldual; a directory holding this file may be replaced by it\n")
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would make a shared cache private to this user
        if path.exists():
            # the old copy goes aside under a fresh name (never a name someone else may hold), so that the final
            # rename is a single atomic step
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | os.PathLike, *, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 digest of a file, read in chunks of ``chunk_size`` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()
