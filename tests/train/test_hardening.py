"""Run-level hardening: every bad config value or data file is one error line (exit 2) and leaves no run directory;
one process per run directory (``run.lock``); a corrupt ``last.ckpt`` falls back to ``last.prev.ckpt``; a
checkpoint write killed at any moment leaves loadable files; ``test`` / ``validate --run-dir`` use the run's own
``config.yaml``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from primaldual.cli import main
from primaldual.train.checkpoints import load_checkpoint
from primaldual.train.config import dump_config, load_config
from primaldual.train.lock import RunLock, RunLockedError
from primaldual.train.run import fit

from ..conftest import write_config
from .helpers import env, fit_cmd


def _one_error(capsys, argv: list[str], prog: str = "primaldual fit") -> str:
    rc = main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert rc == 2, captured.err[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), lines
    return lines[0]


def _no_gpu() -> bool:
    return not torch.cuda.is_available() and not torch.backends.mps.is_available()


BAD_VALUES = [
    (["--optim.lr", "-1"], "optim.lr must be a number > 0"),
    (["--optim.lr", ".nan"], "optim.lr must be a finite number"),
    (["--optim.lr", "fast"], "optim.lr must be a number"),
    (["--optim.weight_decay", "-0.1"], "optim.weight_decay must be a number >= 0"),
    (["--model.num_heads", "3"], "model.num_heads: 3 heads do not divide model.dim 16"),
    (["--model.attention", "nope"], "model.attention: unknown attention 'nope'"),
    (["--model.attention", "[softmax]"], "model.attention: 1 entries, but model.depth is 2"),
    (["--model.attention_options", "{foo: 1}"], "unknown option 'foo' for attention 'softmax'"),
    (["--model.attention", "primal", "--model.attention_options", "{s: 0}"], "s must be an int >= 1, got 0"),
    (["--model.attention", "primal", "--model.attention_options", "{s:4}"], "write {s: 4} with a space"),
    (["--model.depth", "0"], "model.depth must be an int in [1, 1024]"),
    (["--model.dropout", "2"], "model.dropout must be a number in [0, 1)"),
    (["--model.ffn_dim", "0"], "model.ffn_dim must be an int in [1, 262144]"),
    (["--data.val_fraction", "0"], "data.val_fraction must be a number in (0, 1)"),
    (["--data.val_fraction", "2"], "data.val_fraction must be a number in (0, 1)"),
    (["--data.batch_size", "0"], "data.batch_size"),
    (["--data.name", ".."], "data.name: expected a name usable as a directory name"),
    (["--trainer.precision", "13"], "trainer.precision must be one of"),
    (["--trainer.gradient_clip_val", "-1"], "trainer.gradient_clip_val (null for no clipping) must be a number > 0"),
    (["--trainer.devices", "0"], "trainer.devices"),
    (["--trainer.strategy", "bogus"], "trainer.strategy must be one of"),
    (["--trainer.max_epochs", "0"], "trainer.max_epochs"),
    (["--trainer.val_check_interval", "5"], "trainer.val_check_interval: only step-based runs"),
    (["--schedule.decay", "linear"], "schedule.decay: 'linear' decays to 0"),
    (["--seed", "-1"], "seed must be an int"),
    (["--threads", "0"], "--threads must be an int >= 1, got 0"),
    # issue 46, item 8: keys only another task reads, and an empty value that YAML would read as null
    (["--data.tokenisation", "no_brackets"], "data.tokenisation: only task 'lra_listops' uses it, not task 'uea'"),
    (["--data.train_pairs", "5"], "data.train_pairs: only task 'lra_retrieval' uses it"),
    (["--model.pooling", "cls"], "model.pooling: only task 'lra_image'"),
    (["--model.tie_embeddings", "false"], "model.tie_embeddings: only task 'lm' uses it"),
    (["--data.root", ""], "--data.root: empty value; give a value, or null for none"),
    (["--model.init", "gpt2"], "model.init: only task 'lm' / 'offline_rl' uses it, not task 'uea'"),
    pytest.param(
        ["--trainer.accelerator", "gpu"],
        "trainer.accelerator: 'gpu', but this machine has no such device",
        marks=pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU"),
    ),
]


@pytest.mark.parametrize(("args", "expected"), BAD_VALUES)
def test_bad_value_is_one_error_line_and_no_run_directory(capsys, tmp_path, tiny_config, args, expected):
    cfg, run_dir = tiny_config(), tmp_path / "run"
    line = _one_error(capsys, ["fit", "--config", str(cfg), "--run-dir", str(run_dir), *args])
    assert expected in line
    assert not run_dir.exists()


@pytest.mark.parametrize("sub", ["validate", "test"])
def test_bad_values_in_evaluation_subcommands(capsys, tmp_path, tiny_config, sub):
    cfg = tiny_config()
    for args, expected in BAD_VALUES[:3]:
        assert expected in _one_error(capsys, [sub, "--config", str(cfg), *args], f"primaldual {sub}")


def test_yaml_flow_mapping_without_space_in_a_file(capsys, tmp_path, tiny_config):
    cfg = tiny_config(**{"model.attention": "primal"})
    cfg.write_text(cfg.read_text().replace("attention: primal", "attention: primal\n  attention_options: {s:4}"))
    line = _one_error(capsys, ["fit", "--config", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert "unknown option 's:4'" in line and "{s: 4}" in line
    assert not (tmp_path / "run").exists()


# --- data files ------------------------------------------------------------------------------------------------

HEADER = "@problemName Tiny\n@timeStamps false\n@dimensions 2\n@equalLength true\n@classLabel true a b\n@data\n"
GOOD = ["1,2,3:4,5,6:a", "2,3,4:5,6,7:a", "3,4,5:6,7,8:a", "1,1,2:3,3,4:b", "0,1,1:2,2,3:b", "5,1,2:0,3,1:b"]


def _dataset(root: Path, train: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Tiny_TRAIN.ts").write_text(HEADER + "\n".join(train) + "\n")
    (root / "Tiny_TEST.ts").write_text(HEADER + "\n".join(GOOD[:2] + GOOD[3:5]) + "\n")
    return root


BAD_DATA = [
    # (train cases, expected text; line numbers count the 6 header lines)
    ([*GOOD[:2], "1e39,1,2:3,4,5:a", *GOOD[3:]], "Tiny_TRAIN.ts:9: channel 0: value '1e39' overflows float32"),
    ([*GOOD[:2], "1,2,3::a", *GOOD[3:]], "Tiny_TRAIN.ts:9: channel 1 is empty"),
    ([*GOOD[:2], "1,2,inf:3,4,5:a", *GOOD[3:]], "Tiny_TRAIN.ts:9: channel 0: infinite value"),
    ([g.replace(g.split(":")[1], "?,?,?") for g in GOOD], "Tiny_TRAIN.ts: channel(s) [1] have no observed value"),
    ([GOOD[0], GOOD[3]], "Tiny_TRAIN.ts: cannot hold out a stratified validation split"),
]


@pytest.mark.parametrize(("train", "expected"), BAD_DATA)
def test_bad_data_names_the_file_and_line(capsys, tmp_path, tiny_config, train, expected):
    root = _dataset(tmp_path / "data", train)
    cfg = tiny_config(**{"data.name": "Tiny", "data.root": str(root), "data.fetch": False})
    line = _one_error(capsys, ["fit", "--config", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert expected in line
    assert not (tmp_path / "run").exists()


def test_channel_observed_only_in_validation_cases(tmp_path):
    """A channel observed in the file but not in the training part of the split: named with the file."""
    import numpy as np

    from primaldual.data.uea import ChannelNormalizer

    x = np.array([[np.nan, 1.0], [np.nan, 2.0]], dtype=np.float32)
    with pytest.raises(ValueError, match=r"Tiny_TRAIN.ts: channel\(s\) \[0\] have no observed value in the 1 training"):
        ChannelNormalizer().fit([x], "Tiny_TRAIN.ts")


def test_failed_attempt_without_checkpoint_does_not_block_the_corrected_command(tmp_path, tiny_config, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    wrong = load_config(tiny_config(**{"model.dim": 12}))
    (run_dir / "config.yaml").write_text(dump_config(wrong))  # what an attempt that died before epoch 1 leaves:
    (run_dir / ".primaldual-run").write_text("{}\n")  # its config and the mark (unmarked, the folder is refused)
    cfg = tiny_config(**{"trainer.max_epochs": 1})
    assert main(["fit", "--config", str(cfg), "--run-dir", str(run_dir)]) == 0
    assert "left no checkpoint; starting over" in capsys.readouterr().out
    assert load_config(run_dir / "config.yaml").model.dim == 16


def test_fresh_never_empties_a_directory_that_is_not_a_run(capsys, tmp_path, tiny_config):
    keep = tmp_path / "mine" / "notes.txt"
    keep.parent.mkdir()
    keep.write_text("not a run")
    cfg = tiny_config()
    line = _one_error(capsys, ["fit", "--config", str(cfg), "--run-dir", str(keep.parent), "--fresh"])
    assert "not a primaldual run directory (it holds notes.txt)" in line and "nothing in it was touched" in line
    assert keep.read_text() == "not a run" and not (keep.parent / "run.lock").exists()


# --- a finished run of a non-default config, shared by the read-only tests ------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finished")
    changes = {"trainer.max_epochs": 2, "model.attention": "linear", "model.dim": 8, "model.ffn_dim": 16}
    cfg_path = write_config(tmp, **changes)
    run_dir = tmp / "run"
    summary = fit(load_config(cfg_path), run_dir, verbose=False)
    return cfg_path, run_dir, summary


def _metric(out: str, key: str) -> float:
    return float(next(line for line in out.splitlines() if line.startswith(key)).split()[-1])


def test_run_dir_alone_reevaluates_a_non_default_run(capsys, finished):
    _, run_dir, summary = finished
    assert main(["test", "--run-dir", str(run_dir)]) == 0
    assert _metric(capsys.readouterr().out, "test/acc") == pytest.approx(summary["test_acc"], abs=1e-4)
    assert main(["validate", "--run-dir", str(run_dir), "--ckpt", "last"]) == 0
    assert 0 <= _metric(capsys.readouterr().out, "val/acc") <= 1
    # another model config is refused with the difference named, not a size-mismatch traceback
    line = _one_error(capsys, ["test", "--config", "uea/default", "--run-dir", str(run_dir)], "primaldual test")
    assert "trained with another config" in line and "model." in line and "leave out --config" in line
    assert main(["test", "--run-dir", str(run_dir), "--print-config"]) == 0
    assert "attention: linear" in capsys.readouterr().out


def test_a_relative_run_dir_reevaluates_without_lightnings_noise(capsys, finished, monkeypatch):
    """A relative --run-dir (the default one is) gives no "dirpath has changed" warning, and the metrics are printed
    once (no Lightning table beside our lines); a --ckpt path that is not there is named as such."""
    _, run_dir, _ = finished
    monkeypatch.chdir(run_dir.parent)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["test", "--run-dir", run_dir.name]) == 0
    assert not [w for w in seen if "dirpath has changed" in str(w.message)]
    out = capsys.readouterr().out
    assert out.count("test/acc") == 1 and "Test metric" not in out
    line = _one_error(capsys, ["test", "--run-dir", run_dir.name, "--ckpt", "nonsense"], "primaldual test")
    assert "--ckpt: no checkpoint file nonsense (--ckpt takes best, last or a .ckpt file's path)" in line


def test_last_is_rotated_to_prev(finished):
    _, run_dir, _ = finished
    ck = run_dir / "checkpoints"
    assert load_checkpoint(ck / "last.ckpt")["epoch"] == 1
    assert load_checkpoint(ck / "last.prev.ckpt")["epoch"] == 0
    assert not (run_dir / "run.lock").exists()  # released at the end of the run
    assert not [p for p in ck.iterdir() if p.name.endswith(".tmp")]


def test_truncated_last_falls_back_to_prev_and_ends_the_same(tmp_path, finished, capsys):
    cfg_path, src, summary = finished
    run_dir = tmp_path / "copy"
    shutil.copytree(src, run_dir)
    (run_dir / "summary.json").unlink()
    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    assert main(["fit", "--config", str(cfg_path), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "not a readable checkpoint" in out and "resuming from the previous checkpoint" in out
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["test_acc"] == summary["test_acc"] and again["epochs"] == 2  # the lost epoch was redone exactly
    assert (run_dir / "checkpoints" / "last.ckpt.corrupt").is_file()
    assert load_checkpoint(last)["epoch"] == 1


def test_no_usable_checkpoint_names_fresh(tmp_path, finished, capsys):
    cfg_path, src, _ = finished
    run_dir = tmp_path / "copy"
    shutil.copytree(src, run_dir)
    for name in ("last.ckpt", "last.prev.ckpt"):
        (run_dir / "checkpoints" / name).write_bytes(b"\0" * 100)
    line = _one_error(capsys, ["fit", "--config", str(cfg_path), "--run-dir", str(run_dir)])
    assert "last.ckpt" in line and "--fresh" in line


# --- kill during a checkpoint write ---------------------------------------------------------------------------------

_WRITER = """
import sys, torch
from primaldual.train.callbacks import AtomicCheckpointIO
io, path = AtomicCheckpointIO(), sys.argv[1]
for i in range(10**6):
    io.save_checkpoint({"state_dict": {"w": torch.full((300_000,), float(i))}, "i": i}, path)
    print(i, flush=True)
"""


@pytest.mark.parametrize("kill_after", [5])
def test_sigkill_during_checkpoint_writes_leaves_loadable_files(tmp_path, kill_after):
    path = tmp_path / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env())
    for _ in range(kill_after):
        assert proc.stdout.readline()
    time.sleep(0.013 * kill_after)  # land somewhere inside a later write
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    last = load_checkpoint(path)
    prev = load_checkpoint(path.with_name("last.prev.ckpt"))
    assert prev["i"] in (last["i"], last["i"] - 1)
    for ckpt in (last, prev):
        assert torch.equal(ckpt["state_dict"]["w"], torch.full((300_000,), float(ckpt["i"])))


def test_interrupted_rotation_keeps_last(tmp_path, monkeypatch):
    from primaldual.train.callbacks import AtomicCheckpointIO

    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {}, "i": 0}, path)
    io.save_checkpoint({"state_dict": {}, "i": 1}, path)

    class Killed(BaseException):
        pass

    def boom(src, dst):
        raise Killed

    monkeypatch.setattr("primaldual.train.checkpoints.os.replace", boom)  # dies while rotating
    with pytest.raises(Killed):
        io.save_checkpoint({"state_dict": {}, "i": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["i"] == 1 and load_checkpoint(tmp_path / "last.prev.ckpt")["i"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "last.prev.ckpt"]


# --- one process per run directory ----------------------------------------------------------------------------------


def test_lock_in_process_and_stale(tmp_path):
    run_dir = tmp_path / "run"
    with RunLock(run_dir):
        info = json.loads((run_dir / "run.lock").read_text())
        assert info["pid"] == os.getpid()
        with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()}"):
            RunLock(run_dir).acquire()
    assert not run_dir.exists()  # the lock created it and nothing filled it: removed with the lock
    run_dir.mkdir()
    with RunLock(run_dir):
        pass
    assert run_dir.is_dir() and not (run_dir / "run.lock").exists()
    # a lock file left by a process that is gone: detected (nothing holds it) and taken over
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / "run.lock").write_text(json.dumps({"pid": dead.pid, "purpose": "primaldual fit"}))
    assert RunLock(run_dir).holder() is None
    with RunLock(run_dir):
        assert json.loads((run_dir / "run.lock").read_text())["pid"] == os.getpid()


def test_second_concurrent_fit_is_refused_naming_the_holder(tmp_path, tiny_config, capsys):
    cfg = tiny_config(**{"trainer.max_epochs": 500})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        fit_cmd(cfg, run_dir, "--threads", "1"), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            holder = RunLock(run_dir).holder()
            if holder is not None and (run_dir / "checkpoints" / "last.ckpt").is_file():
                break
            time.sleep(0.2)
        assert holder is not None and holder["pid"] == proc.pid, "the first fit did not start"
        line = _one_error(capsys, ["fit", "--config", str(cfg), "--run-dir", str(run_dir)])
        assert f"in use by process {proc.pid}" in line and f"kill {proc.pid}" in line
        line = _one_error(capsys, ["fit", "--config", str(cfg), "--run-dir", str(run_dir), "--fresh"])
        assert line.startswith("primaldual fit: error: --fresh refused") and f"process {proc.pid}" in line
        assert (run_dir / "checkpoints" / "last.ckpt").is_file() and proc.poll() is None  # nothing was touched
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # killed: its lock file is stale and the next run may take over
    assert (run_dir / "run.lock").is_file() and RunLock(run_dir).holder() is None
