"""A run killed with SIGKILL and restarted with the same command ends exactly like an uninterrupted run."""

from __future__ import annotations

import json

import torch

from .helpers import fit_cmd, history_rows, kill_after_rows, run_here


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
    run_here(fit_cmd(cfg, ref_dir, "--threads", "1"))

    done_before_kill = kill_after_rows(fit_cmd(cfg, dir_, "--threads", "1"), dir_, 2)
    assert 2 <= done_before_kill < 6, f"the kill should land mid-run, after >= 1 checkpoint ({done_before_kill} epochs)"
    assert (dir_ / "checkpoints" / "last.ckpt").is_file() and not (dir_ / "summary.json").exists()

    out = run_here(fit_cmd(cfg, dir_, "--threads", "1")).stdout
    assert "resuming from" in out

    ref, got = json.loads((ref_dir / "summary.json").read_text()), json.loads((dir_ / "summary.json").read_text())
    for key in ("epochs", "best_epoch", "test_acc", "test_loss", "val_acc"):
        assert got[key] == ref[key], key
    assert history_rows(dir_) == history_rows(ref_dir)  # every epoch's metrics, bit for bit
    a = torch.load(ref_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(dir_ / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(list((dir_ / "logs").iterdir())) == 2  # one CSV log per attempt; none overwritten


def test_a_second_corrupt_last_checkpoint_keeps_the_first_corrupt_copy(tmp_path):
    import torch

    from primaldual.train.checkpoints import corrupt_copy_path, resume_checkpoint

    ck = tmp_path / "checkpoints"
    ck.mkdir()
    torch.save({"state_dict": {}}, ck / "last.prev.ckpt")
    (ck / "last.ckpt.corrupt").write_bytes(b"the first bad copy")
    for n, content in enumerate((b"second", b"third"), start=1):
        (ck / "last.ckpt").write_bytes(content)
        notes = []
        assert resume_checkpoint(tmp_path, notes.append) == ck / "last.prev.ckpt"
        assert (ck / f"last.ckpt.corrupt.{n}").read_bytes() == content and f"last.ckpt.corrupt.{n}" in notes[0]
    assert (ck / "last.ckpt.corrupt").read_bytes() == b"the first bad copy"
    assert corrupt_copy_path(ck / "last.ckpt") == ck / "last.ckpt.corrupt.3"
