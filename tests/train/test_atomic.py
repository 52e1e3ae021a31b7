"""Atomic writes: an interrupted save leaves the previous file intact and no debris."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from primaldual.train.callbacks import AtomicCheckpointIO
from primaldual.utils.io import atomic_dir, atomic_write_bytes, atomic_write_json, sha256_file


def test_interrupted_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"w": torch.ones(3)}, path)

    class Killed(BaseException):
        pass

    def boom(src, dst):  # die after the temporary file is fully written, before the rename
        raise Killed

    monkeypatch.setattr("primaldual.utils.io.os.replace", boom)
    with pytest.raises(Killed):
        io.save_checkpoint({"w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the temporary file was removed


def test_atomic_write_replaces(tmp_path):
    atomic_write_bytes(tmp_path / "a" / "f.txt", b"one")
    atomic_write_bytes(tmp_path / "a" / "f.txt", b"two")
    assert (tmp_path / "a" / "f.txt").read_bytes() == b"two"
    assert (tmp_path / "a" / "f.txt").stat().st_mode & 0o044  # readable by group/others (umask permitting)


def test_json_checksum_and_atomic_dir(tmp_path):
    path = atomic_write_json(tmp_path / "r.json", {"a": 1})
    assert path.read_text() == '{\n  "a": 1\n}\n' and json.loads(path.read_text()) == {"a": 1}
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "nan.json", {"a": float("nan")}, allow_nan=False)
    assert sha256_file(path, chunk_size=3) == hashlib.sha256(path.read_bytes()).hexdigest()
    d = tmp_path / "d"
    with pytest.raises(RuntimeError), atomic_dir(d) as tmp:
        (tmp / "x").write_text("x")
        raise RuntimeError
    assert not d.exists() and [p.name for p in tmp_path.iterdir()] == ["r.json"]
    with atomic_dir(d) as tmp:
        (tmp / "x").write_text("x")
    assert (d / "x").read_text() == "x"
    with pytest.raises(FileExistsError), atomic_dir(d):
        pass


def test_atomic_dir_follows_the_umask_not_mkdtemps_0700(tmp_path):
    import os
    import stat

    from primaldual.utils.io import atomic_dir

    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "dataset") as tmp:
            (tmp / "x").write_text("1")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "dataset").stat().st_mode) == 0o755  # a shared cache stays readable by others
