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


def test_atomic_dir_replaces_only_what_primaldual_wrote(tmp_path):
    """A directory without the mark (the user's) is never replaced, even with overwrite; one primaldual built (it
    holds the mark) or an empty one is; the old copy goes aside under a fresh name, not a sibling of the user's."""
    from primaldual.utils.io import DIR_MARK

    user = tmp_path / "datasets"
    user.mkdir()
    (user / "thesis.tex").write_text("precious")
    sibling = tmp_path / ".datasets.old"  # a name the old fixed aside path would have deleted
    sibling.mkdir()
    (sibling / "notes.txt").write_text("keep")
    refused = pytest.raises(FileExistsError, match=r"holds files primaldual did not write \(no \.primaldual-data")
    with refused, atomic_dir(user, overwrite=True) as tmp:
        (tmp / "data.tsv").write_text("new")
    assert [p.name for p in user.iterdir()] == ["thesis.tex"]
    with atomic_dir(user, overwrite=True, owned=True) as tmp:  # the caller proved it is primaldual's
        (tmp / "data.tsv").write_text("new")
    assert sorted(p.name for p in user.iterdir()) == [DIR_MARK, "data.tsv"]
    with atomic_dir(user, overwrite=True) as tmp:  # marked now: replaced
        (tmp / "data.tsv").write_text("newer")
    assert (user / "data.tsv").read_text() == "newer" and (sibling / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".datasets.old", "datasets"]  # no debris
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_dir(empty, overwrite=True) as tmp:
        (tmp / "x").write_text("x")
    assert (empty / "x").is_file()
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(FileExistsError, match="did not write"), atomic_dir(tmp_path / "file", overwrite=True):
        pass


def test_data_generate_force_refuses_a_users_directory(tmp_path, capsys):
    from primaldual.cli import main

    user = tmp_path / "userdir"
    user.mkdir()
    (user / "thesis.tex").write_text("precious")
    args = ["data", "generate", "listops", "--train", "4", "--val", "2", "--test", "2", "--out", str(user)]
    assert main([*args, "--force"]) == 2
    assert "holds files primaldual did not write" in capsys.readouterr().err
    assert [p.name for p in user.iterdir()] == ["thesis.tex"]
    out = tmp_path / "generated"
    assert main([*args[:-1], str(out)]) == 0 and main([*args[:-1], str(out), "--force"]) == 0  # its own: replaced
