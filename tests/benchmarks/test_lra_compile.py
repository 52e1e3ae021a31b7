"""The interleaved eager-vs-compiled LRA step script and the dropout sampler script run end to end."""

from __future__ import annotations

import json
import shutil

import pytest

from .scripts import load_script

needs_cxx = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler for Inductor"
)


@needs_cxx
def test_lra_compile_times_four_cases_and_writes_json(tmp_path, capsys):
    script = load_script("lra_compile")
    out = tmp_path / "lra.json"
    args = ["--tasks", "image", "--batch", "1", "--rounds", "2", "--steps", "1", "--warmup", "1", "--threads", "1"]
    assert script.main([*args, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]["image"]
    assert set(rows) == {"transformer eager", "primalformer eager", "transformer compiled", "primalformer compiled"}
    assert all(len(r["rounds"]) == 2 and r["min"] <= r["s_per_1k"] <= r["max"] for r in rows.values())
    table = capsys.readouterr().out
    assert "| PrimalFormer compiled vs eager |" in table and "| paper PrimalFormer vs Transformer | 2.3x |" in table


@needs_cxx
def test_dropout_sampler_times_every_case(capsys):
    assert load_script("dropout_sampler").main(["--rows", "64", "--calls", "2", "--warmup", "1", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("  ")[0] for ln in lines[1:]] == [
        "matmul + relu only",
        "F.dropout eager",
        "F.dropout compiled",
        "counter_dropout eager",
        "counter_dropout compiled",
    ]
