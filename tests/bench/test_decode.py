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


@pytest.mark.parametrize("attention", ["primal", "linear"])
def test_unchecked_step_reads_no_value_and_equals_step(attention):
    """What a CUDA graph captures: on the meta device (where reading a value raises) the step runs through, and on
    the CPU it equals the checked step; the state's tensors keep their shapes (so a graph can update them in place)."""
    from primaldual.models.graphed import state_tensors

    torch.manual_seed(0)
    model = CausalLM(50, 200, dim=8, depth=2, num_heads=2, ffn_dim=16, attention=attention).eval()
    state = filled_state(model, 3, 100)
    ids, real = torch.tensor([1, 2, 3]), torch.ones(3, dtype=torch.bool)
    with torch.no_grad():
        ref, ref_state = model.step(ids, state)
        out, new = model.unchecked_step(ids, state, real)
        assert torch.equal(out, ref)
        assert [t.shape for t in state_tensors(new)] == [t.shape for t in state_tensors(state)]
        meta = model.to("meta")
        meta.unchecked_step(ids.to("meta"), filled_state(meta, 3, 100), real.to("meta"))
        with pytest.raises(RuntimeError, match="meta"):
            meta.step(ids.to("meta"), filled_state(meta, 3, 100))  # the checked step reads the ids


def test_cuda_graph_needs_a_cuda_device(tmp_path, capsys):
    args = ["bench", "decode", "--attentions", "primal", "--batches", "1", "--contexts", "32", "--cuda-graph"]
    assert main([*args, "--out", str(tmp_path / "d.json")]) == 2
    assert "--cuda-graph: CUDA graphs need a CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("attention", ["primal", "linear"])
def test_cuda_graph_replay_equals_eager_decoding(attention):
    """The benchmark's graph (the argmax fed back inside it) decodes the tokens the eager loop does; its warm-up
    advances nothing."""
    from primaldual.models.graphed import GraphedStep

    torch.manual_seed(0)
    model = CausalLM(50, 200, dim=16, depth=2, num_heads=2, ffn_dim=32, attention=attention).cuda().eval()
    with torch.no_grad():
        state = filled_state(model, 2, 20)
        eager_state = type(state)([type(s)(*(t.clone() for t in s)) for s in state.layers], state.count.clone())
        eager_ids = torch.tensor([1, 2], device="cuda")
        graphed = GraphedStep(model, state, feed_back=True, warmup=3)
        graphed.ids.copy_(eager_ids)
        for _ in range(4):
            logits, eager_state = model.step(eager_ids, eager_state)
            eager_ids = logits.argmax(-1)
            got = graphed()
            assert torch.allclose(got, logits, atol=1e-5) and torch.equal(graphed.ids, eager_ids)
        assert torch.equal(state.count, eager_state.count)  # the graph's state is the one passed in
