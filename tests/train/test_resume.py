"""A run killed with SIGKILL and restarted with the same command ends exactly like an uninterrupted run."""

from __future__ import annotations

import json

import torch

from .helpers import fit_cmd, history_rows, kill_after_rows, run


def test_resume_after_sigkill_matches_uninterrupted(tmp_path, tiny_config):
    # Primal layers (aux loss) and dropout: both the data order and the RNG stream must survive the restart.
    cfg = tiny_config(
        **{
            "trainer.max_epochs": 6,
            "model.attention": ["softmax", "primal"],
            "model.attention_options": [None, {"s": 4}],
        },
    )
    ref_dir, dir_ = tmp_path / "uninterrupted", tmp_path / "killed"
    run(fit_cmd(cfg, ref_dir, "--threads", "1"))

    done_before_kill = kill_after_rows(fit_cmd(cfg, dir_, "--threads", "1"), dir_, 2)
    assert 2 <= done_before_kill < 6, f"the kill should land mid-run, after >= 1 checkpoint ({done_before_kill} epochs)"
    assert (dir_ / "checkpoints" / "last.ckpt").is_file() and not (dir_ / "summary.json").exists()

    out = run(fit_cmd(cfg, dir_, "--threads", "1")).stdout
    assert "resuming from" in out

    ref, got = json.loads((ref_dir / "summary.json").read_text()), json.loads((dir_ / "summary.json").read_text())
    for key in ("epochs", "best_epoch", "test_acc", "test_loss", "val_acc"):
        assert got[key] == ref[key], key
    assert history_rows(dir_) == history_rows(ref_dir)  # every epoch's metrics, bit for bit
    a = torch.load(ref_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(dir_ / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(list((dir_ / "logs").iterdir())) == 2  # one CSV log per attempt; none overwritten
