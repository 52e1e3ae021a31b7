"""The task registry: a task defined here, in one file plus its config, is validated and fitted end to end by the
generic runner; every built-in task is registered; bad registrations and unknown names are errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from primaldual import Encoder
from primaldual.tasks import Task, get_task, list_tasks, register_task, unregister_task
from primaldual.tasks.classification import ClassificationTask
from primaldual.train.config import ConfigError, load_config

BUILT_IN = [
    "lm",
    "lra_image",
    "lra_listops",
    "lra_pathfinder",
    "lra_retrieval",
    "lra_text",
    "offline_rl",
    "uea",
    "vision",
]


class ParityModel(nn.Module):
    """Encoder + mean pooling + linear head on ``(B, N, 4)`` sequences."""

    def __init__(self, dim: int, depth: int, num_heads: int, ffn_dim: int, dropout: float, **attention: Any) -> None:
        super().__init__()
        self.inp = nn.Linear(4, dim)
        self.encoder = Encoder(dim=dim, depth=depth, num_heads=num_heads, ffn_dim=ffn_dim, dropout=dropout, **attention)
        self.head = nn.Linear(dim, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.inp(x)).mean(1))  # (B, N, C) -> (B, 2)


class ToyTask(ClassificationTask):
    """Is the sum of a sequence positive? Generated on the fly: a test of the registry, not a benchmark."""

    model_kinds = ("parity",)

    def check(self, cfg):
        if cfg.data.max_len is None:
            raise ConfigError("data.max_len: the toy task needs the sequence length")

    def datamodule(self, cfg):
        from torch.utils.data import TensorDataset

        from primaldual.train.datamodule import SplitDataModule

        class ToyData(SplitDataModule):
            def setup(self, stage=None):
                g = torch.Generator().manual_seed(0)
                x = torch.randn(96, cfg.data.max_len, 4, generator=g)
                y = (x.sum((1, 2)) > 0).long()
                self.datasets = {"train": TensorDataset(x[:64], y[:64]), "val": TensorDataset(x[64:80], y[64:80])}
                self.datasets["test"] = TensorDataset(x[80:], y[80:])
                self.sizes = {k: len(v) for k, v in self.datasets.items()}

        return ToyData(cfg.data, cfg.seed)

    def model(self, cfg, dm):
        m = cfg.model.backbone_kwargs()
        return ParityModel(**m)


@pytest.fixture
def toy_task():
    register_task("toy_parity")(ToyTask)
    yield get_task("toy_parity")
    unregister_task("toy_parity")


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(
        "task: toy_parity\n"
        "data: {name: toy, max_len: 6, batch_size: 16, eval_batch_size: 16}\n"
        "model: {dim: 16, depth: 1, num_heads: 2, ffn_dim: 16, dropout: 0.0, attention: primal,\n"
        "  attention_options: {s: 4, max_len: 6}}\n"
        "optim: {lr: 0.01}\n"
        "trainer: {max_steps: 6, val_check_interval: 3, enable_progress_bar: false}\n"
    )
    return path


def test_every_built_in_task_is_registered():
    assert set(BUILT_IN) <= set(list_tasks())  # installed plugins may add names
    assert get_task("lra_retrieval").model_kinds[0] == "retrieval" and get_task("uea").protocols == ("heldout", "paper")


def test_a_toy_task_from_the_test_suite_fits_end_to_end(toy_task, tmp_path):
    from primaldual.train.run import evaluate, fit

    cfg = load_config(_config(tmp_path))
    assert cfg.task == "toy_parity" and cfg.model.resolved_kind(cfg.task) == "parity"
    run_dir = tmp_path / "run"
    summary = fit(cfg, run_dir, verbose=False)
    assert summary["task"] == "toy_parity" and summary["steps"] == 6 and summary["evaluations"] == 2
    assert 0.0 <= summary["test_acc"] <= 1.0 and "val_acc" in summary
    assert json.loads((run_dir / "summary.json").read_text())["test_acc"] == summary["test_acc"]
    # the same command resumes (here: finds the run finished) and the runner's test re-evaluates the best checkpoint
    assert fit(cfg, run_dir, verbose=False)["test_acc"] == summary["test_acc"]
    assert evaluate(None, "test", "best", run_dir)[0]["test/acc"] == pytest.approx(summary["test_acc"])


def test_the_toy_tasks_own_check_and_kinds(toy_task, tmp_path):
    with pytest.raises(ConfigError, match="data.max_len: the toy task needs"):
        load_config(_config(tmp_path), ["--data.max_len", "null"])
    with pytest.raises(ConfigError, match=r"model.kind: 'vit' does not fit task 'toy_parity'"):
        load_config(_config(tmp_path), ["--model.kind", "vit"])
    with pytest.raises(ConfigError, match=r"augment: only task 'vision' uses it, not task 'toy_parity'"):
        load_config(_config(tmp_path), ["--augment.hflip", "0.5"])
    with pytest.raises(ConfigError, match=r"protocol: task 'toy_parity' takes \('heldout',\)"):
        load_config(_config(tmp_path), ["--protocol", "paper"])


def test_unknown_task_and_bad_registrations(toy_task):
    with pytest.raises(ConfigError, match=r"task: expected one of \(.*'toy_parity'.*\), got 'nope'"):
        get_task("nope")
    with pytest.raises(ValueError, match="already registered"):

        @register_task("uea")
        class Other(Task):
            model_kinds = ("x",)

    with pytest.raises(ValueError, match="model_kinds is empty"):
        register_task("empty")(type("Empty", (Task,), {}))
    with pytest.raises(TypeError, match="not a subclass"):
        register_task("x")(object)


def test_a_task_declared_by_an_entry_point_is_loaded_by_name(monkeypatch, tmp_path):
    from primaldual.tasks import base

    class EntryPoint:  # what importlib.metadata gives for [project.entry-points."primaldual.tasks"]
        name = "toy_parity"

        def load(self):
            return register_task("toy_parity")(ToyTask)

    monkeypatch.setattr(base, "_plugins", lambda: {"toy_parity": EntryPoint()})
    try:
        assert "toy_parity" in list_tasks()
        assert load_config(_config(tmp_path)).task == "toy_parity"  # loaded on first use, no import of ours
    finally:
        unregister_task("toy_parity")


def test_a_broken_plugin_fails_only_the_configs_that_name_its_task(monkeypatch, tmp_path):
    """Issue 47: an installed plugin whose import raises (or is slow) is never loaded for a built-in config."""
    from primaldual.tasks import base

    class Broken:
        name = "broken_task"

        def load(self):
            raise ImportError("the plugin's dependency is missing")

    monkeypatch.setattr(base, "_plugins", lambda: {"broken_task": Broken()})
    assert load_config("uea/default").task == "uea"
    assert load_config("uea/default", ["--trainer.max_epochs", "2"]).trainer.max_epochs == 2
    with pytest.raises(ConfigError, match="task 'broken_task': its plugin .* failed to load: ImportError: .*missing"):
        get_task("broken_task")
