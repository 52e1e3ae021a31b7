"""``primaldual bench steps``: tiny vision, UEA and language-model configs are timed interleaved through the CLI,
the records and the table are written; bad flags, unknown configs and tasks without a training step are one-line
errors (exit code 2)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from primaldual.bench.steps import TABLE_HEADER, attention_plan, parse_sets, run_steps, steps_table
from primaldual.cli import main

from ..conftest import TINY
from ..train.helpers import tiny_vision, write_image_folder

PIL = pytest.importorskip("PIL.Image")

FAST = ["--steps", "2", "--rounds", "2", "--warmup", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """root/{train,val}/<class>/*.png: 2 classes, 16 x 16 images."""
    colours = {"cat": (200, 40, 40), "dog": (40, 200, 40)}
    return write_image_folder(tmp_path_factory.mktemp("images"), {"train": 6, "val": 2}, colours)


def _vision(tmp_path, root, name: str, attention, options) -> str:
    cfg = tiny_vision(root, name, **{"model.attention": attention, "model.attention_options": options})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture()
def vision_configs(tmp_path, folder):
    a = _vision(tmp_path, folder, "vit_softmax", "softmax", None)
    b = _vision(tmp_path, folder, "vit_mixed", ["softmax", "primal"], [None, {"s": 4, "eta": 0.05, "max_len": 17}])
    return a, b


def _records(out):
    data = json.loads((out / "steps.json").read_text())
    assert data["threads"] == 1 and data["torch"] and data["machine"]["cpu_count"]
    assert data["command"].startswith("primaldual bench steps ")
    return data["records"]


def test_two_vision_configs_are_timed_interleaved_and_written(tmp_path, vision_configs, capsys):
    out = tmp_path / "out"
    a, b = vision_configs
    assert main(["bench", "steps", a, b, *FAST, "--batch", "3", "--out", str(out)]) == 0
    records = _records(out)
    assert [r["config"] for r in records] == [a, b]
    assert [r["attention"] for r in records] == ["softmax", "softmax, primal"]
    assert records[0]["ratio_to_first"] == 1.0
    for r in records:
        assert r["task"] == "vision" and r["batch"] == 3 and r["params"] > 0
        assert len(r["ms_per_step_rounds"]) == 2
        assert 0 < r["ms_per_step_min"] <= r["ms_per_step"] <= r["ms_per_step_max"]
    assert records[1]["params"] > records[0]["params"]  # the primal layer's extra maps
    assert records[1]["ratio_to_first"] == pytest.approx(records[1]["ms_per_step"] / records[0]["ms_per_step"])
    printed = capsys.readouterr().out
    md = (out / "steps.md").read_text()
    for text in (printed, md):
        assert TABLE_HEADER in text
        rows = [line for line in text.splitlines() if line.startswith(f"| {a} ") or line.startswith(f"| {b} ")]
        assert len(rows) == 2 and "| 1.00 |" in rows[0]
    for r in records:  # each config's own peak above what was resident before its timed steps
        assert r["device"] == "cpu" and r["peak_mb"] >= 0 and r["peak_method"] in ("vmhwm_reset", "ru_maxrss")


def test_device_cuda_without_a_gpu_is_a_clear_error(vision_configs):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="--device cuda: no CUDA device is available"):
        run_steps([vision_configs[0]], device="cuda", verbose=False)
    with pytest.raises(ValueError, match="--device: expected 'cpu' or 'cuda', got 'tpu'"):
        run_steps([vision_configs[0]], device="tpu", verbose=False)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler for Inductor")
def test_a_config_with_trainer_compile_is_timed_compiled(tmp_path, vision_configs, capsys):
    out = tmp_path / "out"
    _, b = vision_configs
    args = ["bench", "steps", b, "--steps", "1", "--rounds", "1", "--warmup", "2", "--threads", "1", "--batch", "3"]
    assert main([*args, "--set", "trainer.compile=true", "--out", str(out)]) == 0
    (r,) = _records(out)
    assert r["compiled"] is True and r["attention"] == "softmax, primal"
    printed = capsys.readouterr().out
    assert "dropout modules draw counter-based masks; matches eager" in printed
    assert f"| {b} | softmax, primal (compiled) |" in printed
    graphs = steps_table([{**r, "compile_mode": "reduce-overhead"}])  # the mode is named beside the attention
    assert f"| {b} | softmax, primal (compiled, reduce-overhead) |" in graphs and r["compile_mode"] == "default"


def test_a_uea_config_with_a_set_override(tmp_path):
    from primaldual.data.cache import MissingDataError
    from primaldual.data.uea import find_uea_files

    try:
        find_uea_files("JapaneseVowels")
    except MissingDataError:
        pytest.skip("JapaneseVowels is not in the cache (primaldual data fetch uea JapaneseVowels)")
    cfg = json.loads(json.dumps(TINY))
    cfg["data"]["fetch"] = False
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    args = ["bench", "steps", str(path), *FAST, "--set", "model.attention=primal", "--out", str(out)]
    assert main(args) == 0
    (r,) = _records(out)
    assert r["task"] == "uea" and r["attention"] == "primal" and r["batch"] == 16
    assert r["ratio_to_first"] == 1.0 and r["ms_per_step"] > 0 and r["params"] > 0


def test_a_language_model_config(tmp_path):
    """Task lm (LanguageModelModule.training_loss, accuracy None) on a tiny corpus in the WikiText layout."""
    root = tmp_path / "wt"
    root.mkdir()
    words = ["the", "kernel", "maps", "a", "page", "into", "memory", "and", "driver", "reads", "buffer", "evening"]
    rng = np.random.default_rng(0)
    for split, n in (("train", 60), ("valid", 8), ("test", 8)):
        lines = [" ".join(rng.choice(words, 10)) for _ in range(n)]
        (root / f"wiki.{split}.tokens").write_text(" = Title = \n\n" + "\n".join(lines) + "\n")
    cfg = {
        "name": "tiny_lm",
        "task": "lm",
        "data": {"name": "wikitext-2", "root": str(root), "max_len": 16, "batch_size": 4, "eval_batch_size": 4},
        "model": {
            "kind": "lm",
            "dim": 16,
            "depth": 2,
            "num_heads": 2,
            "ffn_dim": 32,
            "attention": ["softmax", "primal"],
            "attention_options": [None, {"s": 4, "eta": 0.1}],
        },
        "optim": {"name": "adamw", "lr": 0.003},
        "trainer": {"max_steps": 8, "accelerator": "cpu", "enable_progress_bar": False},
    }
    path = tmp_path / "lm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    assert main(["bench", "steps", str(path), *FAST, "--out", str(out)]) == 0
    (r,) = _records(out)
    assert r["task"] == "lm" and r["attention"] == "softmax, primal" and r["batch"] == 4
    assert r["ratio_to_first"] == 1.0 and r["ms_per_step"] > 0 and r["params"] > 0


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--steps", "0"], "--steps must be an int >= 1"),
        (["--rounds", "0"], "--rounds must be an int >= 1"),
        (["--warmup", "-1"], "--warmup must be an int >= 0"),
        (["--threads", "0"], "--threads must be an int >= 1"),
        (["--batch", "0"], "--batch must be an int >= 1"),
        (["--set", "model.dropout"], "--set: expected KEY=VALUE"),
    ],
)
def test_bad_flags_are_one_line_errors_naming_the_flag(tmp_path, flags, match, capsys):
    assert main(["bench", "steps", "uea/JapaneseVowels/transformer", *flags, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("primaldual bench steps: error: ") and match in err and "\n" not in err
    assert not (tmp_path / "steps.json").exists()


@pytest.mark.parametrize(
    "config, match",
    [
        ("no/such/config", "config 'no/such/config' not found"),
        ("rl/hopper-medium/dt", "task 'offline_rl'"),
    ],
)
def test_unknown_configs_and_tasks_without_a_step_are_one_line_errors(tmp_path, config, match, capsys):
    assert main(["bench", "steps", config, *FAST, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("primaldual bench steps: error: ") and match in err and "\n" not in err


def test_a_module_without_training_loss_is_named_with_its_task(tmp_path, vision_configs, monkeypatch, capsys):
    import torch

    import primaldual.train.run as run

    monkeypatch.setattr(run, "build_module", lambda cfg, dm: torch.nn.Linear(2, 2))
    assert main(["bench", "steps", vision_configs[0], *FAST, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "task 'vision' has no training_loss(batch, batch_idx)" in err


def test_an_unknown_set_key_is_the_config_error(tmp_path, capsys):
    args = ["bench", "steps", "uea/JapaneseVowels/transformer", "--set", "model.nope=1", "--out", str(tmp_path)]
    assert main(args) == 2
    assert "unknown config key 'model.nope'" in capsys.readouterr().err


def test_helpers():
    assert parse_sets(["model.dropout=0.0", "--trainer.precision=32-true"]) == [
        "--model.dropout",
        "0.0",
        "--trainer.precision",
        "32-true",
    ]
    assert attention_plan("primal") == "primal"
    assert attention_plan(["softmax", "primal", "primal"]) == "softmax, primal x2"
