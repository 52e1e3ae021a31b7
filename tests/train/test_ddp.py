"""Two CPU processes (DDP, gloo) train like one process with the same global batch."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch

from .helpers import fit_cmd, run, run_here


@pytest.mark.slow
def test_ddp_two_processes_match_single_process(tmp_path, tiny_config):
    # No dropout, so the only difference is floating-point summation order in the gradient all-reduce.
    cfg = tiny_config(**{"trainer.max_epochs": 2, "model.dropout": 0.0})
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    run_here(fit_cmd(cfg, single, "--threads", "1", "--data.batch_size", "16"))
    out = run(
        fit_cmd(
            cfg,
            ddp,
            "--threads",
            "1",
            "--data.batch_size",
            "8",  # 2 x 8 = the single run's global batch of 16
            "--trainer.devices",
            "2",
            "--trainer.strategy",
            "ddp",
            "--trainer.accelerator",
            "cpu",
        ),
        timeout=400,
    )
    assert "test accuracy" in out.stdout
    s, d = json.loads((single / "summary.json").read_text()), json.loads((ddp / "summary.json").read_text())
    assert d["epochs"] == s["epochs"] == 2
    a = torch.load(single / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(ddp / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    first = torch.load(single / "checkpoints" / "best.ckpt", weights_only=True)
    assert first["global_step"] > 0
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-3, atol=1e-4, msg=f"parameter {k}")
    rows_s = list(csv.DictReader(io.StringIO((single / "history.csv").read_text())))
    rows_d = list(csv.DictReader(io.StringIO((ddp / "history.csv").read_text())))
    assert [r["step"] for r in rows_d] == [r["step"] for r in rows_s]  # same number of optimizer steps
    for rs, rd in zip(rows_s, rows_d):
        assert float(rd["val/loss"]) == pytest.approx(float(rs["val/loss"]), rel=1e-3)
        assert float(rd["train/loss"]) == pytest.approx(float(rs["train/loss"]), rel=1e-3)
