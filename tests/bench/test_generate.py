"""``primaldual bench generate``: a tiny real run of every model, the table, and the refusals."""

from __future__ import annotations

import json

import pytest

from primaldual.bench.generate import MODELS, generate_table
from primaldual.cli import main

pytest.importorskip("transformers")


def test_bench_generate_cli_writes_json_and_table(tmp_path, capsys):
    out = tmp_path / "generate.json"
    args = ["bench", "generate", "--batches", "2", "--prompts", "5", "--new", "3"]
    args += ["--dim", "16", "--depth", "2", "--heads", "2", "--vocab", "64", "--threads", "1"]
    assert main([*args, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "generate" and data["settings"]["new"] == 3
    recs = data["records"]
    assert [r["model"] for r in recs] == list(MODELS)
    for r in recs:
        assert r["status"] == "ok", r
        assert r["tokens_per_s"] > 0 and r["prefill_s"] > 0 and r["ms_per_token"] >= 0 and r["peak_mb"] >= 0
        assert r["tokens_per_s"] == pytest.approx(2 * 3 / r["total_s"])
    table = (tmp_path / "generate.md").read_text()
    assert "hf_gpt2 tokens/s" in table and "x GPT-2" in table and table.strip() == generate_table(recs)
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--models", "softmax,gpt9"], "--models: unknown ['gpt9']"),
        (["--prompts", "0"], "--prompts: expected positive ints"),
        (["--vocab", "1"], "--vocab: expected at least 2 ids"),
        (["--new", "0"], "--new: expected a positive int"),
        (["--cuda-graph"], "--cuda-graph: CUDA graphs need a CUDA device, got --device cpu"),
    ],
)
def test_bench_generate_refuses_unknown_models_and_bad_sizes(tmp_path, capsys, flags, message):
    assert main(["bench", "generate", *flags, "--out", str(tmp_path / "g.json")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "g.json").exists()


def test_generate_table_marks_failed_cases():
    recs = [
        {"model": "softmax", "batch": 1, "prompt": 8, "status": "oom"},
        {"model": "hf_gpt2", "batch": 1, "prompt": 8, "status": "ok", "tokens_per_s": 10.0, "prefill_s": 0.1},
    ]
    recs[1].update(ms_per_token=1.0, peak_mb=3.0)
    assert "| 1 | 8 | oom | 10 (0.10 s + 1.0 ms/tok, 3 MB) |" in generate_table(recs)
