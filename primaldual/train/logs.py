"""What a run prints: one line per epoch or evaluation, a progress bar only on a terminal, no banners or tips.

* **Progress bar**: on a TTY (``trainer.enable_progress_bar``, the default), Lightning's rich bar where ``rich`` is
  installed, else its tqdm bar. Off a TTY (``fit ... > log``) there is none: a bar redraws itself with carriage
  returns, which a log file keeps (tens of kilobytes of them); the run's own lines (:class:`~.callbacks.EpochHistory`)
  say the progress there.
* **Lightning's informational lines** ("GPU available", "TPU available", the tip advertising a cloud logger,
  "``Trainer.fit`` stopped", "Restoring states") are logged by ``lightning.pytorch.utilities.rank_zero`` at INFO:
  that logger is raised to WARNING for the run, so its warnings still show.
* **Loggers** (``trainer.logger``): the CSV log (``logs/version_<i>/metrics.csv``) is always written, the history
  and summary read it; ``tensorboard`` adds TensorBoard event files under ``logs/tensorboard/`` (``pip install
  tensorboard``), ``wandb`` a Weights & Biases run under ``logs/wandb/``, offline unless ``WANDB_MODE`` is set
  (``pip install wandb``). A missing package is one line naming the install.
* **Known deprecation warnings of our dependencies** that a user cannot act on are filtered by message, for the
  run only (:data:`DEPENDENCY_WARNINGS`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["DEPENDENCY_WARNINGS", "loggers", "progress_bar", "quiet_dependencies"]

#: (message regex, category) of dependency warnings filtered during a run: Lightning 2.6's own use of a torch
#: ``_pytree`` API that torch deprecated; on a resume, Lightning's note that the checkpoint folder is not empty (the
#: run's own ``last.ckpt`` is replaced there by design) and that a mid-epoch checkpoint has no resumable data loader
#: (the harness restores the data order itself: the resume tests check the result bit for bit); and, when
#: ``validate`` / ``test`` evaluate a checkpoint, that the training callbacks stored in it are not there (an
#: evaluation uses none of them)
DEPENDENCY_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r".*isinstance\(treespec, LeafSpec\)` is deprecated.*", Warning),
    (r"Checkpoint directory .* exists and is not empty", Warning),
    (r"You're resuming from a checkpoint that ended before the epoch ended", Warning),
    (r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided", Warning),
)
_LIGHTNING_INFO = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


def progress_bar(enabled: bool, stream: Any = None) -> tuple[bool, list[Any]]:
    """``(enable_progress_bar, callbacks)`` for the Trainer: a bar only when ``enabled`` and ``stream`` (default
    stdout) is a terminal; rich's where installed."""
    stream = sys.stdout if stream is None else stream
    if not enabled or not getattr(stream, "isatty", lambda: False)():
        return False, []
    try:
        import rich  # noqa: F401
    except ImportError:
        return True, []
    from lightning.pytorch.callbacks import RichProgressBar

    return True, [RichProgressBar()]


@contextlib.contextmanager
def quiet_dependencies() -> Iterator[None]:
    """Lightning's informational lines and the known dependency warnings off, for the duration of a run."""
    loggers = [logging.getLogger(name) for name in _LIGHTNING_INFO]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message, category in DEPENDENCY_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def loggers(kind: str, run_dir: Any, name: str) -> list[Any]:
    """The Lightning loggers of a run: the CSV logger, and beside it ``kind``'s (``tensorboard`` or ``wandb``)."""
    import os
    from pathlib import Path

    from lightning.pytorch.loggers import CSVLogger

    from ..utils.errors import ConfigError

    out: list[Any] = [CSVLogger(run_dir, name="logs")]
    if kind == "tensorboard":
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise ConfigError(
                "trainer.logger: 'tensorboard' needs the tensorboard package (pip install tensorboard)"
            ) from None
        from lightning.pytorch.loggers import TensorBoardLogger

        out.append(TensorBoardLogger(Path(run_dir) / "logs", name="tensorboard"))
    elif kind == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("trainer.logger: 'wandb' needs the wandb package (pip install wandb)") from None
        from lightning.pytorch.loggers import WandbLogger

        save = Path(run_dir) / "logs"
        save.mkdir(parents=True, exist_ok=True)
        offline = os.environ.get("WANDB_MODE", "offline") == "offline"
        out.append(WandbLogger(name=name, save_dir=str(save), offline=offline))
    return out
