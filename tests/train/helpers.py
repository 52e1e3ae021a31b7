"""Tiny real-data configs and a subprocess runner for the training tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

TINY = {
    "name": "tiny",
    "task": "uea",
    "protocol": "heldout",
    "seed": 3,
    "data": {"name": "JapaneseVowels", "val_fraction": 0.2, "batch_size": 16},
    "model": {"dim": 16, "depth": 2, "num_heads": 2, "ffn_dim": 32, "dropout": 0.1, "attention": "softmax"},
    "optim": {"name": "radam", "lr": 3e-3},
    "trainer": {"max_epochs": 4, "accelerator": "cpu", "gradient_clip_val": 4.0, "enable_progress_bar": False},
}


def write_config(tmp_path: Path, **changes) -> Path:
    cfg = json.loads(json.dumps(TINY))
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


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
