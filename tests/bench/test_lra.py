"""The LRA training-step benchmark runs a real step end to end and tabulates ratios to the Transformer."""

from __future__ import annotations

import json
import shutil

import pytest

from primaldual.bench.lra import BENCH_MODELS, TASKS, lra_table, model_attention, run_lra


def test_every_model_maps_to_two_layers():
    for task in TASKS:
        for model in BENCH_MODELS:
            names, opts = model_attention(model, task)
            assert len(names) == len(opts) == 2
    names, opts = model_attention("transformer_eager", "listops")  # the paper's baseline: the N x N matrix formed
    assert names == ["softmax", "softmax"] and all(o == {"backend": "eager"} for o in opts)
    names, opts = model_attention("primal_plus", "listops")
    assert names == ["softmax", "primal"] and opts[1]["s"] == 30 and opts[1]["eta"] == 0.05


def test_one_real_training_step(tmp_path):
    out = tmp_path / "lra.json"
    recs = run_lra(["image"], ["transformer", "linear"], out, batch=1, steps=1, warmup=1, threads=1)
    assert [r["status"] for r in recs] == ["ok", "ok"], recs
    data = json.loads(out.read_text())
    assert data["kind"] == "lra" and len(data["records"]) == 2
    table = lra_table(recs)
    assert "transformer" in table and "x)" in table and "paper" in table


def test_profile_command_prints_time_and_memory_tables(tmp_path):
    from primaldual.cli import main

    out = tmp_path / "profile.txt"
    rc = main(
        ["bench", "profile", "--task", "image", "--model", "primalformer", "--batch", "1", "--steps", "1"]
        + ["--threads", "1", "--rows", "5", "--out", str(out)]
    )
    text = out.read_text()
    assert rc == 0 and "by self cpu time" in text and "by memory allocated" in text and "Self CPU" in text


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler for Inductor")
def test_a_compiled_training_step(tmp_path):
    out = tmp_path / "lra.json"
    recs = run_lra(["listops"], ["primalformer"], out, batch=1, steps=1, warmup=1, threads=1, compile=True)
    assert [r["status"] for r in recs] == ["ok"], recs
    assert json.loads(out.read_text())["settings"]["compile"] is True
