"""Checkpoints are written atomically: an interrupted save leaves the previous file intact and no debris."""

from __future__ import annotations

import pytest
import torch

from primaldual.train.callbacks import AtomicCheckpointIO, atomic_write


def test_interrupted_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"w": torch.ones(3)}, path)

    class Killed(BaseException):
        pass

    real = __import__("os").replace

    def boom(src, dst):  # die after the temporary file is fully written, before the rename
        raise Killed

    monkeypatch.setattr("primaldual.train.callbacks.os.replace", boom)
    with pytest.raises(Killed):
        io.save_checkpoint({"w": torch.zeros(3)}, path)
    monkeypatch.setattr("primaldual.train.callbacks.os.replace", real)
    assert torch.equal(torch.load(path)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the temporary file was removed


def test_atomic_write_replaces(tmp_path):
    atomic_write(tmp_path / "a" / "f.txt", b"one")
    atomic_write(tmp_path / "a" / "f.txt", b"two")
    assert (tmp_path / "a" / "f.txt").read_bytes() == b"two"
    assert (tmp_path / "a" / "f.txt").stat().st_mode & 0o044  # readable by group/others (umask permitting)
