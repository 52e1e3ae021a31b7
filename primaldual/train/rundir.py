"""The run directory: its default name, preparing it (``--fresh``, ``config.yaml``), and reading a run's config.

Run directory (default ``runs/<task>/<dataset>/<name>-<protocol>-seed<k>-<config hash>``)::

    config.yaml            the resolved config (a restart with a different config is refused)
    run.lock               present while a ``fit`` runs (its PID, host, start time and command)
    history.csv            one row per epoch / evaluation (train / eval metrics), complete across resumes
    logs/version_<i>/      Lightning CSVLogger output (metrics.csv per step/epoch, hparams.yaml); one per attempt
    checkpoints/last.ckpt  written after every epoch / evaluation, atomically; the same command resumes from it
    checkpoints/last.prev.ckpt  the one before (the fallback when last.ckpt is unreadable)
    checkpoints/best.ckpt  the epoch / evaluation the protocol selects
    summary.json           the result (protocol label, best epoch or step, test accuracy or perplexity, ...)
    tokenizer.json / dict.txt   language models: the run's tokenizer (for ``primaldual generate``)
    convert.yaml, convert/      a conversion's record and stage 1 (``primaldual convert``, :mod:`.convert`)
    analysis/              ``primaldual analyze RUN``'s spectra and head redundancy of this run
    .primaldual-run        the mark: primaldual created this directory (its version and the time)

primaldual deletes or replaces files only in a directory it marked, and only its own entries (the names above). A
directory that holds anything else (a project folder given as ``--run-dir``, a ``config.yaml`` of another tool) is
refused before anything in it is touched, ``--fresh`` included; so is clearing a directory where a file that
primaldual did not write sits inside one of its folders (a note in ``logs/``, a symlink in ``checkpoints/``). A run directory written before the mark existed
(only the names above, a ``config.yaml`` among them) is adopted and marked. Temporary files of primaldual's atomic
writes that a killed run left (``.<name>.<random>.tmp`` beside an entry above, or beside a checkpoint) are its own
too: the next ``fit`` deletes them, under the lock, before it starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import yaml

from ..utils.io import atomic_write_text
from .config import ConfigError, RunConfig, dump_config, load_config
from .lock import LOCK_NAME
from .schema import every_default

__all__ = ["MARK", "check_run_dir", "default_run_dir", "is_launcher_process", "prepare_run_dir", "run_config"]

MARK = ".primaldual-run"
# every entry primaldual writes into a run directory (the lock's temporary files start with the lock's name)
OWN = {
    MARK,
    "config.yaml",
    LOCK_NAME,
    "history.csv",
    "logs",
    "checkpoints",
    "summary.json",
    "tokenizer.json",
    "dict.txt",
    "convert.yaml",
    "convert",
    "analysis",
}
# what primaldual's atomic writes leave when a run is killed mid-write: ``.<name>.<random>.tmp`` beside ``<name>``
# (:func:`~primaldual.utils.io.atomic_write_bytes`, the checkpoint rotation's ``.<name>.<pid>.tmp``)
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp$")


# what primaldual (and the loggers it starts) write inside its folders, as paths relative to the folder: ``--fresh``
# deletes a folder only when everything in it matches, so a user's file put there is never lost
_TMP = r"\.[^/]+\.[A-Za-z0-9_]+\.tmp"
_OWN_INSIDE = {
    "checkpoints": re.compile(rf"(last|last\.prev|best)\.ckpt(\.corrupt(\.\d+)?)?|{_TMP}"),
    "logs": re.compile(
        r"(version_\d+|tensorboard(/version_\d+)?)(/(metrics\.csv|hparams\.yaml|events\.out\.tfevents\.[^/]+))?"
        r"|tensorboard|wandb(/.*)?"
    ),
    "convert": re.compile(rf"stage1\.(pt|json|csv|partial\.pt)|{_TMP}"),
    "analysis": re.compile(rf"analysis\.json|spectra\.png|{_TMP}"),
}


def _own_temporary(name: str, own: set[str] | None = None) -> bool:
    """Whether ``name`` is a leftover temporary file of an atomic write of one of ``own`` (default :data:`OWN`)."""
    m = _TEMPORARY.match(name)
    return bool(m) and (own is None and m["name"] in OWN or own is not None and m["name"] in own)


def default_run_dir(cfg: RunConfig, base: str | os.PathLike = "runs") -> Path:
    """``<base>/<task>/<dataset>/<name>-<protocol>-seed<k>-<hash>``: the same command always maps to the same dir."""
    return Path(base) / cfg.task / cfg.data.name / f"{cfg.name}-{cfg.protocol}-seed{cfg.seed}-{cfg.fingerprint()}"


def is_launcher_process() -> bool:
    """True in the process the user started (not a DDP worker re-launched by Lightning)."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def _has_progress(run_dir: Path) -> bool:
    """Whether a run directory holds anything a restart would resume or report (a checkpoint or a summary)."""
    ck = run_dir / "checkpoints"
    return (run_dir / "summary.json").is_file() or any(
        (ck / n).is_file() for n in ("last.ckpt", "last.prev.ckpt", "best.ckpt")
    )


def _foreign(run_dir: Path) -> list[str]:
    """The entries of ``run_dir`` that primaldual does not write (sorted names). A temporary file of an atomic write
    counts as primaldual's even when it is gone by the time it is looked at: a live run renames it into place."""
    return sorted(
        p.name
        for p in run_dir.iterdir()
        if p.name not in OWN
        and not p.name.startswith(LOCK_NAME)
        and not (_own_temporary(p.name) and not p.is_dir() and not p.is_symlink())
    )


def _foreign_inside(run_dir: Path) -> list[str]:
    """The paths below ``run_dir`` that primaldual did not write: in its folders (``checkpoints/``, ``logs/``, ...),
    every entry that is not one of its own names, and any symlink (but W&B's own ``debug.log`` links in
    ``logs/wandb/``, removed as links, never followed); a folder where it writes a file. Sorted, relative to
    ``run_dir``."""
    out: list[str] = []
    for name in OWN:
        top = run_dir / name
        if name not in _OWN_INSIDE:
            if top.is_dir() and not top.is_symlink():
                out.append(name + "/")
            continue
        if top.is_symlink() or not top.is_dir():
            continue  # a symlink itself is unlinked, never followed
        pattern = _OWN_INSIDE[name]
        for folder, dirs, files in os.walk(top, followlinks=False):
            base = Path(folder).relative_to(top)
            for entry in dirs + files:
                rel = (base / entry).as_posix()
                link = (top / rel).is_symlink() and not (name == "logs" and rel.startswith("wandb/"))
                if link or not pattern.fullmatch(rel):
                    out.append(f"{name}/{rel}")
            dirs[:] = [d for d in dirs if pattern.fullmatch((base / d).as_posix())]
    return sorted(out)


def _has_checkpoint(run_dir: Path) -> bool:
    ck = run_dir / "checkpoints"
    return any((ck / n).is_file() for n in ("last.ckpt", "last.prev.ckpt", "best.ckpt"))


def _not_a_record(run_dir: Path, entries: list[Path]) -> str:
    shown = ", ".join(sorted(p.name for p in entries)[:5])
    return (
        f"{run_dir} is not a primaldual run directory: it holds {shown} but no mark ({MARK}) and no full run record "
        "(a config.yaml and a checkpoint), so nothing in it is touched. Pass a new or empty --run-dir"
    )


def check_run_dir(run_dir: str | os.PathLike, fresh: bool = False) -> Path:
    """Refuse a run directory primaldual may not write to (before anything in it is touched); return it as a Path.

    Raises:
        ConfigError: an empty path (``--run-dir ""``), a path that is a file, a directory holding entries
            primaldual does not write, or ``--fresh`` on a directory primaldual did not create.
    """
    if not isinstance(run_dir, str | os.PathLike) or not str(run_dir).strip():
        raise ConfigError("--run-dir: empty; give a directory for the run (default runs/<task>/<dataset>/<name>-...)")
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir: {run_dir} is a file, not a directory")
    if not run_dir.is_dir():  # made when the run starts: its nearest existing parent must be a writable directory
        parent = next(p for p in run_dir.absolute().parents if p.exists())
        if not parent.is_dir():
            raise ConfigError(f"--run-dir: {run_dir} cannot be made: {parent} is a file, not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"--run-dir: {run_dir} cannot be made: {parent} is not writable")
        return run_dir
    if foreign := _foreign(run_dir):
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(
            f"{run_dir} is not a primaldual run directory (it holds {shown}); nothing in it was touched. "
            "Pass a new or empty --run-dir"
        )
    entries = [p for p in run_dir.iterdir() if not p.name.startswith(LOCK_NAME)]
    saved = run_dir / "config.yaml"
    if entries and not (run_dir / MARK).is_file():
        # a run directory from before the mark is adopted only with a full run record (a config.yaml primaldual can
        # read and a checkpoint): a folder of the user's own history.csv, summary.json or config.yaml is never taken
        try:
            load_config(saved)
        except (ConfigError, OSError) as e:
            if saved.is_file():
                raise ConfigError(
                    f"{run_dir} holds a config.yaml that primaldual did not write ({str(e).splitlines()[0][:200]}); "
                    "nothing in it was touched. Pass a new or empty --run-dir"
                ) from None
            if not fresh:
                raise ConfigError(_not_a_record(run_dir, entries)) from None
        else:
            if not _has_checkpoint(run_dir):
                raise ConfigError(_not_a_record(run_dir, entries))
    if fresh and (inside := _foreign_inside(run_dir)):
        raise _refuse_inside(run_dir, inside)
    if fresh and entries and not (run_dir / MARK).is_file() and not saved.is_file():
        raise ConfigError(
            f"--fresh refused: {run_dir} is not a run directory primaldual created (no {MARK} and no config.yaml), "
            "so nothing in it is deleted; pass a run directory, or another --run-dir"
        )
    return run_dir


def _refuse_inside(run_dir: Path, inside: list[str]) -> ConfigError:
    shown = ", ".join(inside[:5]) + (f" and {len(inside) - 5} more" if len(inside) > 5 else "")
    return ConfigError(
        f"{run_dir} is not cleared: it holds files primaldual did not write ({shown}), and nothing in it was "
        "deleted. Move them out, or pass another --run-dir"
    )


def _mark(run_dir: Path) -> None:
    if not (run_dir / MARK).is_file():
        from .._version import __version__

        atomic_write_text(run_dir / MARK, json.dumps({"primaldual": __version__, "created": time.time()}) + "\n")


def _clear_run_dir(run_dir: Path) -> None:
    """Delete primaldual's own entries in ``run_dir`` (never the lock this process holds, never anything else)."""
    check_run_dir(run_dir)  # again, under the lock: a file dropped in since is never deleted
    if inside := _foreign_inside(run_dir):
        raise _refuse_inside(run_dir, inside)
    for p in run_dir.iterdir():
        if p.name not in OWN or p.name.startswith(LOCK_NAME) or p.name == MARK:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _remove_leftovers(run_dir: Path) -> None:
    """Delete the temporary files that a run killed during an atomic write left (only primaldual's own pattern, only
    regular files): at the top level and in ``checkpoints/``."""
    ck = run_dir / "checkpoints"
    checkpoints = (
        {p.name for p in ck.iterdir()} | {"last.ckpt", "last.prev.ckpt", "best.ckpt"} if ck.is_dir() else set()
    )
    for folder, own in ((run_dir, None), (ck, checkpoints)):
        if not folder.is_dir() or folder.is_symlink():
            continue
        for p in folder.iterdir():
            if _own_temporary(p.name, own) and p.is_file() and not p.is_symlink():
                p.unlink()


def prepare_run_dir(cfg: RunConfig, run_dir: Path, fresh: bool, verbose: bool) -> None:
    """``--fresh`` clearing and ``config.yaml`` (written, or compared with the one there), after removing the
    temporary files of a killed attempt's atomic writes. The caller holds the lock."""
    text = dump_config(cfg)
    launcher = is_launcher_process()
    check_run_dir(run_dir, fresh)
    if launcher:
        run_dir.mkdir(parents=True, exist_ok=True)
        _mark(run_dir)
        _remove_leftovers(run_dir)
    if fresh and launcher:
        _clear_run_dir(run_dir)
    saved = run_dir / "config.yaml"
    if saved.exists() and saved.read_text() != text and _same_run(saved.read_text(), text):
        if launcher:  # only how it runs changed (compilation, progress bar): the record follows the latest attempt
            atomic_write_text(saved, text)
    elif saved.exists() and saved.read_text() != text:
        if not launcher or _has_progress(run_dir):
            raise ConfigError(
                f"{run_dir} holds a run with a different config ({saved}); pass --fresh to start over there "
                f"or --run-dir to use another directory"
            )
        # an earlier attempt that failed before its first checkpoint: nothing to resume, so it is replaced
        if verbose:
            print(f"{run_dir}: an earlier attempt with another config left no checkpoint; starting over", flush=True)
        _clear_run_dir(run_dir)
    if not saved.exists() and launcher:
        atomic_write_text(saved, text)


# trainer keys that change how a run executes, not what it computes: a resume may switch them
_HOW_KEYS = ("enable_progress_bar", "compile", "compile_mode", "logger")


def _same_run(saved: str, text: str) -> bool:
    """Whether two config.yaml texts describe the same run, apart from :data:`_HOW_KEYS`. A key one of them lacks
    counts as its default: a config.yaml written before a key existed (or while it was another task's) read as
    that default, and so did the run that wrote it."""
    try:
        a, b = yaml.safe_load(saved), yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    for d in (a, b):
        for key in _HOW_KEYS:
            (d.get("trainer") or {}).pop(key, None)
    defaults = every_default()
    for x, y in ((a, b), (b, a)):
        for section, values in y.items():
            have, known = x.get(section), defaults.get(section)
            if not (isinstance(values, dict) and isinstance(have, dict) and isinstance(known, dict)):
                continue
            for key, value in values.items():
                if key not in have and key in known and value == known[key]:
                    have[key] = value
    return a == b


def run_config(run_dir: str | os.PathLike, overrides: list[str] | None = None) -> RunConfig:
    """The config a run was trained with: its ``config.yaml`` (plus ``overrides``)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} not found")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise FileNotFoundError(f"{run_dir}: no config.yaml; expected a run directory written by `primaldual fit`")
    return load_config(saved, overrides)
