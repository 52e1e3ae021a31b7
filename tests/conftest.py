"""Shared test helpers and fixtures: the relative error of every reference comparison, seeding, and the tiny
real-data training config (``tiny_config``) that the harness tests build on."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

# Without a GPU the Triton kernels (tests/kernels) run in Triton's interpreter. It has to be on before anything
# imports triton (transformers and torch.compile do, in other tests): triton.language's own helpers become
# interpretable only when they are defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tiny real-data training config: PrimalFormer's UEA setting shrunk to width 16 on JapaneseVowels (fetched and
# cached on first use), 4 epochs: seconds per run on a CPU core.
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


def write_config(directory: Path, base: dict | None = None, **changes) -> Path:
    """``base`` (default :data:`TINY`) with dotted-key ``changes``, written to ``directory/tiny.yaml``."""
    cfg = json.loads(json.dumps(TINY if base is None else base))
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def tiny_config(tmp_path) -> Callable[..., Path]:
    """``tiny_config(**changes)``: :data:`TINY` (or ``base=``) with dotted-key changes, written under ``tmp_path``
    (or ``directory=``); returns the file."""

    def make(base: dict | None = None, directory: Path | None = None, **changes) -> Path:
        return write_config(tmp_path if directory is None else directory, base, **changes)

    return make


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / max(||b||, 1e-8): the relative error used by every reference comparison."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-8))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    worker = hasattr(config, "workerinput")  # a pytest-xdist worker: the workers share the cores, one thread each
    torch.set_num_threads(1 if worker else max(1, min(2, torch.get_num_threads())))
    if not worker and config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        # the tiny config's data, fetched once before the workers start (two first uses would fetch it twice)
        from primaldual.data.cache import MissingDataError
        from primaldual.data.uea_fetch import fetch_japanese_vowels

        with contextlib.suppress(MissingDataError):  # offline: the tests that need it say so
            fetch_japanese_vowels(quiet=True)
