"""Checkpoint files: safe loading, the rotated previous checkpoint, and the choice of what a run resumes from.

* **Safe loading.** A checkpoint is a pickle; unpickling an arbitrary file can run arbitrary code. Every checkpoint
  primaldual reads (``fit`` resume, ``validate`` / ``test``, ``analyze``, and Lightning's own loads, which go through
  :class:`~primaldual.train.callbacks.AtomicCheckpointIO`) is read by :func:`load_checkpoint` with
  ``torch.load(weights_only=True)``: tensors, numbers, strings and containers only, plus the types of
  :data:`SAFE_GLOBALS`. Our own checkpoints need nothing more (the allow-list is empty; the tests load every kind of
  checkpoint the harness writes), so anything else in a file is refused with one line, before it can run.
* **The previous checkpoint.** Each time ``last.ckpt`` is replaced, the old file is first hard-linked (or copied) to
  ``last.prev.ckpt`` through a temporary name and an atomic rename, so both names always hold a complete checkpoint.
* **Resume choice** (:func:`resume_checkpoint`): ``last.ckpt`` when it loads; else ``last.prev.ckpt`` (the unreadable
  ``last.ckpt`` is kept as ``last.ckpt.corrupt``); else a one-line error naming ``--fresh``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SAFE_GLOBALS",
    "CheckpointError",
    "check_fits",
    "corrupt_copy_path",
    "keep_previous",
    "load_checkpoint",
    "previous_path",
    "resume_checkpoint",
]

# Types (beyond tensors, numbers, strings and containers) a checkpoint may hold. Empty: the checkpoints the harness
# writes hold nothing else. A type added here must be plain data: it is constructed from the file's contents.
SAFE_GLOBALS: tuple[Any, ...] = ()


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (unsafe content, truncated or corrupt, or not our format); names the file."""


def _reason(exc: BaseException) -> str:
    """A short reason from a (possibly very long) torch / pickle error message."""
    text = str(exc).strip()
    m = re.search(r"GLOBAL (\S+) was not an allowed global", text)
    if m:
        return f"it names {m[1]}, which is not an allowed type"
    m = re.search(r"^\s*(Unsupported [^\n]*?)\.?\s*$", text, re.M)
    if m:
        return m[1]
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else ""
    if not first:
        return type(exc).__name__
    return f"{type(exc).__name__}: {first}" if len(first) < 12 else first


def load_checkpoint(
    path: str | os.PathLike, map_location: Any = "cpu", weights_key: str | None = "state_dict"
) -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True`` with the :data:`SAFE_GLOBALS` allow-list). ``weights_key``: the
    mapping of weights the checkpoint must hold (``state_dict`` for Lightning's, ``model`` for offline RL's; None: the
    file is that mapping itself, a saved ``state_dict``).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: the file holds objects other than plain data (refused, nothing of it runs), is truncated or
            corrupt, or is not a Lightning checkpoint (a mapping with ``state_dict``).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    guard = getattr(torch.serialization, "safe_globals", None)
    ctx = guard(list(SAFE_GLOBALS)) if guard is not None and SAFE_GLOBALS else contextlib.nullcontext()
    try:
        with ctx:
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        reason = _reason(e)
        what = (
            "it holds Python objects other than tensors and plain data"
            if "not an allowed type" in reason
            else "not a checkpoint in the format primaldual writes (corrupt or foreign)"
        )
        raise CheckpointError(
            f"{path}: refused to load: {what} ({reason}); checkpoints are only read in the safe mode "
            "(weights_only), so nothing in the file was run"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, KeyError, IndexError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt: {_reason(e)})") from None
    if not isinstance(ckpt, dict) or (weights_key is not None and not isinstance(ckpt.get(weights_key), dict)):
        raise CheckpointError(f"{path}: not a primaldual checkpoint (no {weights_key or 'mapping of weights'})")
    return ckpt


def check_fits(
    module: torch.nn.Module,
    ckpt: dict[str, Any],
    path: str | os.PathLike,
    config: str,
    hint: str = "it was trained with another config",
) -> None:
    """Raise :class:`CheckpointError` when the checkpoint's weights do not fit ``module`` (names and shapes); the
    message ends with ``hint``."""
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items() if isinstance(v, torch.Tensor)}
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    shapes = [k for k in sorted(set(want) & set(have)) if want[k] != have[k]]
    if missing or extra or shapes:
        what = (
            f"{shapes[0]} has shape {have[shapes[0]]} in the checkpoint, {want[shapes[0]]} in the model"
            if shapes
            else f"parameters missing: {missing[:3]}"
            if missing
            else f"unexpected parameters: {extra[:3]}"
        )
        raise CheckpointError(f"{path} does not fit the model of {config} ({what}); {hint}")


def corrupt_copy_path(path: str | os.PathLike) -> Path:
    """Where a corrupt ``path`` is kept: ``<name>.corrupt``, or ``<name>.corrupt.1``, ``.2``, ... when earlier copies
    exist (none is ever replaced)."""
    path = Path(path)
    kept = path.with_name(path.name + ".corrupt")
    n = 0
    while kept.exists() or kept.is_symlink():
        n += 1
        kept = path.with_name(f"{path.name}.corrupt.{n}")
    return kept


def previous_path(path: str | os.PathLike) -> Path:
    """``.../last.ckpt`` -> ``.../last.prev.ckpt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def keep_previous(path: str | os.PathLike) -> None:
    """Make ``last.prev.ckpt`` a copy of the current ``path`` (hard link, else copy), replaced atomically."""
    path = Path(path)
    if not path.is_file():
        return
    prev = previous_path(path)
    tmp = prev.with_name(f".{prev.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        try:
            os.link(path, tmp)
        except OSError:  # no hard links on this file system
            shutil.copyfile(path, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, prev)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def resume_checkpoint(
    run_dir: str | os.PathLike, note: Callable[[str], None] = print, weights_key: str = "state_dict"
) -> Path | None:
    """The checkpoint a run resumes from: ``last.ckpt``, else ``last.prev.ckpt``, else None (a fresh start).

    Both are verified with :func:`load_checkpoint` first. An unreadable ``last.ckpt`` with a good previous one is
    renamed to ``last.ckpt.corrupt`` (so that the next save does not rotate it over the good one) and ``note`` says
    so.

    Raises:
        CheckpointError: no usable checkpoint, though one exists; the message names ``--fresh``.
    """
    ckdir = Path(run_dir) / "checkpoints"
    last = ckdir / "last.ckpt"
    prev = previous_path(last)
    problem: CheckpointError | None = None
    if last.is_file():
        try:
            load_checkpoint(last, weights_key=weights_key)
            return last
        except CheckpointError as e:
            problem = e
    if prev.is_file():
        try:
            load_checkpoint(prev, weights_key=weights_key)
        except CheckpointError as e:
            if problem is None:
                problem = e
            else:
                raise CheckpointError(
                    f"{problem}; the previous checkpoint is unusable too ({e}); pass --fresh to start the run over"
                ) from None
        else:
            if problem is not None:
                kept = corrupt_copy_path(last)
                os.replace(last, kept)
                note(f"{problem}\nresuming from the previous checkpoint {prev} (the bad file is kept as {kept.name})")
            return prev
    if problem is not None:
        raise CheckpointError(
            f"{problem}; there is no previous checkpoint to fall back on; pass --fresh to start the run over "
            f"(or restore {last})"
        )
    return None
