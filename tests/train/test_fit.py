"""End-to-end runs on real JapaneseVowels with a tiny model: run directory, both protocols, test subcommand."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml

from primaldual.cli import main
from primaldual.train.config import load_config
from primaldual.train.run import fit


@pytest.mark.parametrize("protocol", ["heldout", "paper"])
def test_fit_writes_a_complete_run_directory(tmp_path, tiny_config, protocol, capsys):
    path = tiny_config(
        protocol=protocol,
        **{"trainer.max_epochs": 3, "model.attention": "primal", "model.attention_options": {"s": 4, "eta": 0.5}},
    )
    cfg = load_config(path)
    run_dir = tmp_path / "run"
    summary = fit(cfg, run_dir)
    out = capsys.readouterr().out
    assert "run directory:" in out and "test accuracy" in out
    for name in ("config.yaml", "history.csv", "summary.json", "checkpoints/last.ckpt", "checkpoints/best.ckpt"):
        assert (run_dir / name).is_file(), name
    assert list(run_dir.glob("logs/version_0/metrics.csv"))
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["attention"] == "primal"
    rows = list(csv.DictReader(io.StringIO((run_dir / "history.csv").read_text())))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert all(float(r["train/aux_loss"]) > 0 for r in rows)  # the KSVD term reaches the loss
    assert summary == json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 3 and 0.0 <= summary["test_acc"] <= 1.0
    if protocol == "paper":
        assert summary["protocol_label"] == "paper protocol (selects on test)"
        assert "paper protocol (selects on test)" in out
        assert summary["test_acc"] == max(float(r["test/acc"]) for r in rows)
        assert "val/acc" not in rows[0]
    else:
        best = max(rows, key=lambda r: (float(r["val/acc"]), -float(r["val/loss"])))
        assert summary["best_epoch"] == int(best["epoch"]) + 1
        assert "test/acc" not in rows[0]  # the heldout protocol touches TEST once, at the end
    # The test subcommand on the best checkpoint reproduces the reported accuracy.
    capsys.readouterr()
    assert main(["test", "--config", str(path), "--run-dir", str(run_dir)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("test/acc")][0]
    assert float(line.split()[-1]) == pytest.approx(summary["test_acc"], abs=1e-4)
    # A finished run re-run with the same command only reports.
    again = fit(cfg, run_dir)
    assert again["test_acc"] == pytest.approx(summary["test_acc"]) and again["epochs"] == 3
    # ... and keeps the timing and memory of the attempt that trained (issue 46, item 8)
    kept = json.loads((run_dir / "summary.json").read_text())
    for key in ("train_step_seconds", "train_steps_timed", "fit_seconds_this_attempt", "peak_memory_mb"):
        assert key in summary and kept[key] == summary[key], key


def test_run_dir_with_another_config_is_refused(tmp_path, tiny_config):
    path = tiny_config(**{"trainer.max_epochs": 1})
    fit(load_config(path), tmp_path / "run", verbose=False)
    with pytest.raises(ValueError, match="different config"):
        fit(load_config(path, ["--model.dim", "8"]), tmp_path / "run", verbose=False)


def test_threads_and_data_loader_workers_beyond_the_cores_are_named(monkeypatch):
    """torch's default threads are kept (a light worker is mostly idle), but threads + workers above the cores is a
    named warning that says what to pass."""
    import warnings

    import torch

    from primaldual.train import run

    before = torch.get_num_threads()
    monkeypatch.setattr(run, "usable_cores", lambda: 4)
    try:
        torch.set_num_threads(4)
        with pytest.warns(
            run.ThreadsOversubscribedWarning, match=r"4 intra-op threads \+ 1 data-loader workers.*--threads 3"
        ):
            assert run.set_threads(None, workers=1) == 4
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert run.set_threads(2, workers=2) == 2 and run.set_threads(None) == 2  # fits, or no workers: silent
    finally:
        torch.set_num_threads(before)
