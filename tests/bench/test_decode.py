"""``primaldual bench decode``: a tiny real run, the table, and the filled states' shapes."""

from __future__ import annotations

import json

import pytest
import torch

from primaldual.bench.decode import decode_table, filled_state
from primaldual.cli import main
from primaldual.models import CausalLM


@pytest.mark.parametrize("attention", ["softmax", "primal", "linear", "sparse", "softmax_sh"])
def test_filled_state_decodes(attention):
    model = CausalLM(50, 200, dim=8, depth=2, num_heads=2, ffn_dim=16, attention=attention).eval()
    state = filled_state(model, 3, 100)
    with torch.no_grad():
        logits, state = model.step(torch.zeros(3, dtype=torch.long), state)
    assert logits.shape == (3, 50) and torch.isfinite(logits).all()
    assert state.count.tolist() == [101, 101, 101]


def test_bench_decode_cli_writes_json_and_table(tmp_path, capsys):
    out = tmp_path / "decode.json"
    args = ["bench", "decode", "--attentions", "softmax,primal", "--batches", "1", "--contexts", "32,128"]
    args += ["--dim", "16", "--depth", "1", "--heads", "2", "--vocab", "64", "--steps", "2", "--warmup", "1"]
    assert main([*args, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    recs = data["records"]
    assert {(r["attention"], r["context"]) for r in recs} == {(a, t) for a in ("softmax", "primal") for t in (32, 128)}
    assert all(r["status"] == "ok" and r["ms_per_token"] > 0 for r in recs)
    by = {(r["attention"], r["context"]): r for r in recs}
    assert by[("primal", 32)]["state_mb"] == by[("primal", 128)]["state_mb"]  # constant state
    # the KV cache grows with T (after the 3 decoded tokens: 131 vs 35 cached)
    assert by[("softmax", 128)]["state_mb"] > 3.5 * by[("softmax", 32)]["state_mb"]
    assert "faster" in decode_table(recs) and (tmp_path / "decode.md").is_file()


def test_bench_decode_refuses_non_causal(capsys):
    assert main(["bench", "decode", "--attentions", "linear_bn", "--out", "/nonexistent/x.json"]) == 2
    assert "cannot decode causally" in capsys.readouterr().err
