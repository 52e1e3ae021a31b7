"""Runners for the training tests: in a subprocess, or in this process (the tiny config itself: ``tiny_config`` in tests/conftest.py)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def fit_cmd(config: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "primaldual.cli", "fit", "--config", str(config), "--run-dir", str(run_dir), *extra]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONUNBUFFERED"] = "1"
    return e


def run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return res


def run_here(cmd: list[str]) -> subprocess.CompletedProcess:
    """``run(cmd)`` for a ``python -m primaldual.cli ...`` command, in this process through ``primaldual.cli.main``
    (what the console script calls): a process start (Lightning's import) costs more than a tiny run. For the runs a
    test does not kill. ``--threads`` holds for the run (the thread count changes float sums, and a run compared with
    a subprocess's must use the same), and the test process's count is restored after it."""
    import contextlib
    import io

    import torch

    from primaldual.cli import main

    assert cmd[:3] == [sys.executable, "-m", "primaldual.cli"], cmd
    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(cmd[3:])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, out.getvalue()[-3000:] + err.getvalue()[-5000:]
    return subprocess.CompletedProcess(cmd, code, out.getvalue(), err.getvalue())


def one_line_error(capsys, argv: list[str]) -> str:
    """``primaldual.cli.main(argv)`` must exit 2 with one line on stderr; returns that line."""
    from primaldual.cli import main

    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def history_rows(run_dir: Path) -> list[dict[str, str]]:
    p = run_dir / "history.csv"
    return list(csv.DictReader(open(p))) if p.is_file() else []


def kill_after_rows(cmd: list[str], run_dir: Path, rows: int, timeout: float = 240) -> int:
    """Start ``cmd``, SIGKILL it once ``run_dir/history.csv`` has ``rows`` rows; return the rows written by then."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    while len(history_rows(run_dir)) < rows and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return len(history_rows(run_dir))


def write_image_folder(root: Path, counts: dict[str, int], colours: dict[str, tuple[int, int, int]], sizes=(16, 16)):
    """``root/<split>/<class>/<i>.png``: noisy images of one colour per class, sides drawn from ``sizes``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in counts.items():
        for name, colour in colours.items():
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(count):
                h, w = (int(rng.integers(sizes[0], sizes[1] + 1)) for _ in range(2))
                arr = np.clip(np.array(colour) + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(arr).save(d / f"{i}.png")
    return root


def tiny_vision(root: Path, name: str = "tiny_vit", **changes) -> dict:
    """A tiny ViT config (task vision) on the image folder ``root``, with dotted-key ``changes``."""
    cfg = {
        "name": name,
        "task": "vision",
        "seed": 0,
        "data": {"name": "toy", "root": str(root), "image_size": 16, "batch_size": 4, "eval_batch_size": 4},
        "model": {
            "kind": "vit",
            "dim": 16,
            "depth": 2,
            "num_heads": 2,
            "ffn_dim": 32,
            "dropout": 0.0,
            "patch_size": 4,
            "attention": "softmax",
            "attention_options": None,
        },
        "optim": {"name": "adamw", "lr": 0.003, "weight_decay": 0.05},
        "schedule": {"warmup_steps": 2, "decay": "cosine"},
        "trainer": {"max_steps": 8, "accelerator": "cpu", "enable_progress_bar": False},
        "augment": {"randaugment_ops": 2, "erasing": 0.25, "mixup_alpha": 0.8, "cutmix_alpha": 1.0},
    }
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return cfg


class Stage1Killed(Exception):
    """Raised by :func:`stage1_stopper`'s wrapper: a conversion's stage 1 "killed" after an update."""


def stage1_stopper(real, at: int, starts: list[int]):
    """Wrappers of ``attention_transfer`` (``real``): the first raises :class:`Stage1Killed` once update ``at`` and its
    checkpoint are done; the second records the step each call starts at into ``starts``."""

    def stopping(*a, on_step=None, **kw):
        def step(state, opt):
            on_step(state, opt)
            if state.step == at:
                raise Stage1Killed

        return real(*a, on_step=step, **kw)

    def recording(*a, state=None, **kw):
        starts.append(state.step)
        return real(*a, state=state, **kw)

    return stopping, recording
