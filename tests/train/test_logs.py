"""What a run writes to a log file: its own lines, no carriage returns, banners, tips or dependency deprecations."""

from __future__ import annotations

import io
import subprocess

from primaldual.train.logs import progress_bar

from .helpers import env, fit_cmd


def test_fit_to_a_log_file_is_its_own_lines_only(tmp_path, tiny_config):
    log = tmp_path / "log"
    with open(log, "w") as f:
        res = subprocess.run(
            fit_cmd(tiny_config(**{"trainer.max_epochs": 2}), tmp_path / "run", "--threads", "1"),
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env(),
            timeout=300,
        )
    text = log.read_text()
    assert res.returncode == 0, text[-3000:]
    assert "\r" not in text
    for noise in ("GPU available", "TPU available", "Tip", "deprecated", "LeafSpec", "`Trainer.fit` stopped"):
        assert noise not in text, noise
    assert "epoch 1/2" in text and "epoch 2/2" in text
    # the same command again (a resume of a finished run): no note of Lightning's about the checkpoint folder
    again = subprocess.run(
        fit_cmd(tiny_config(**{"trainer.max_epochs": 2}), tmp_path / "run", "--threads", "1"),
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Warning" not in again.stdout + again.stderr and "not empty" not in again.stderr, again.stderr[-2000:]


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_a_progress_bar_only_on_a_terminal():
    assert progress_bar(True, _Stream(False)) == (False, [])
    assert progress_bar(False, _Stream(True)) == (False, [])
    enabled, callbacks = progress_bar(True, _Stream(True))
    assert enabled and len(callbacks) <= 1  # rich's bar where rich is installed, else Lightning's default


def test_tensorboard_logger_writes_event_files_beside_the_csv_log(tmp_path, tiny_config):
    from .helpers import run_here

    run_dir = tmp_path / "run"
    run_here(
        fit_cmd(tiny_config(**{"trainer.max_epochs": 1, "trainer.logger": "tensorboard"}), run_dir, "--threads", "1")
    )
    events = list((run_dir / "logs" / "tensorboard").rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    assert list((run_dir / "logs").glob("version_*/metrics.csv"))  # the CSV log is still written
    assert (
        "logger" not in (run_dir / "config.yaml").read_text() or "tensorboard" in (run_dir / "config.yaml").read_text()
    )


def test_wandb_logger_writes_an_offline_run_folder_in_the_run_directory(tmp_path, tiny_config):
    """W&B in offline mode (its default here): nothing leaves the machine, the run folder is under logs/wandb/ (which
    --fresh counts as primaldual's own). Skipped where wandb is not installed."""
    import os

    import pytest

    pytest.importorskip("wandb")
    from .helpers import env, fit_cmd

    run_dir = tmp_path / "run"
    cmd = fit_cmd(tiny_config(**{"trainer.max_epochs": 1, "trainer.logger": "wandb"}), run_dir, "--threads", "1")
    e = {k: v for k, v in env().items() if not k.startswith("WANDB_")}
    res = subprocess.run(cmd, capture_output=True, text=True, env={**e, "WANDB_SILENT": "true"}, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = list((run_dir / "logs" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), os.listdir(run_dir / "logs")
    from primaldual.train.rundir import _foreign_inside

    assert _foreign_inside(run_dir) == []


def test_logger_choice_is_checked_and_leaves_the_fingerprint(tmp_path, tiny_config):
    import pytest

    from primaldual.train.config import ConfigError, load_config

    base = load_config(tiny_config())
    assert load_config(tiny_config(**{"trainer.logger": "tensorboard"})).fingerprint() == base.fingerprint()
    with pytest.raises(ConfigError, match="trainer.logger"):
        load_config(tiny_config(**{"trainer.logger": "mlflow"}))
