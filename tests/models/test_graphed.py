"""CUDA-graph decoding (``CausalLM.generate(cuda_graph=True)``, :mod:`primaldual.models.graphed`).

On a CPU, everything but the capture runs: the warm-up and the record are replaced by their eager equivalents (the
same step, run on the current stream, and replayed by running it again), so the static buffers, the in-place state
and the restore after the warm-up are checked against plain decoding. On a GPU the real graph is checked the same way.
"""

from __future__ import annotations

import pytest
import torch

from primaldual.models import graphed as graphed_module
from primaldual.models.graphed import GraphedStep, check_graphable
from primaldual.models.lm import CausalLM

V, MAXLEN = 41, 48
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CONSTANT_PLANS = [
    pytest.param("primal", id="primal"),
    pytest.param("linear", id="linear"),
    pytest.param(["linear", "primal"], id="linear+primal"),
]


def _model(attention, device: str = "cpu") -> CausalLM:
    torch.manual_seed(0)
    opts = [{"s": 3} if a == "primal" else None for a in attention] if isinstance(attention, list) else None
    opts = {"s": 3} if attention == "primal" else opts
    model = CausalLM(V, MAXLEN, dim=12, depth=2, num_heads=3, ffn_dim=24, attention=attention, attention_options=opts)
    return model.to(device).eval()


def _prompts(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (4, 7), generator=g)
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[1, :3] = False  # prompts of different lengths
    mask[3, :6] = False
    return ids.to(device), mask.to(device)


@pytest.fixture
def eager_capture(monkeypatch):
    """The capture's eager stand-ins: a CPU model goes through GraphedStep's own code."""
    monkeypatch.setattr(graphed_module, "_is_cuda", lambda device: True)
    monkeypatch.setattr(graphed_module, "_side_stream", lambda device: None)
    monkeypatch.setattr(graphed_module, "_warm_up", lambda step, times, device, side: [step() for _ in range(times)])
    monkeypatch.setattr(graphed_module, "_record", lambda step, device, side: step)


GENERATE_CASES = [
    pytest.param({"temperature": 0.0}, id="greedy"),
    pytest.param({"temperature": 0.9, "top_k": 5, "seed": 4}, id="sampled"),
    pytest.param({"temperature": 0.0, "eos_id": 2}, id="eos"),
    pytest.param({"temperature": 1.0, "eos_id": 5, "seed": 0}, id="sampled-eos"),
]


def _check_same_as_eager(model: CausalLM, kwargs: dict, device: str) -> None:
    ids, mask = _prompts(device)
    want = model.generate(ids, mask, 12, **kwargs)
    got = model.generate(ids, mask, 12, cuda_graph=True, **kwargs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("kwargs", GENERATE_CASES)
@pytest.mark.parametrize("attention", CONSTANT_PLANS)
def test_graphed_generate_equals_eager_without_the_capture(attention, kwargs, eager_capture):
    _check_same_as_eager(_model(attention).double(), kwargs, "cpu")


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("kwargs", GENERATE_CASES)
@pytest.mark.parametrize("attention", CONSTANT_PLANS)
def test_graphed_generate_equals_eager_on_cuda(attention, kwargs):
    _check_same_as_eager(_model(attention, "cuda"), kwargs, "cuda")


def test_the_warm_up_advances_nothing_and_each_call_advances_the_state_once(eager_capture):
    model = _model("primal").double()
    ids, mask = _prompts()
    with torch.no_grad():
        _, state = model.prefill(ids, mask, last_only=True)
        _, ref = model.prefill(ids, mask, last_only=True)
        count = state.count.clone()
        step = GraphedStep(model, state, warmup=3)
        assert torch.equal(state.count, count)  # three warm-up steps, restored
        nxt = torch.arange(4) % V
        real = torch.tensor([True, False, True, True])
        logits = step(nxt, real)
        want, ref = model.step(nxt, ref, real)
        assert torch.equal(logits, want) and torch.equal(state.count, ref.count)
        for got, exp in zip(graphed_module.state_tensors(state), graphed_module.state_tensors(ref), strict=True):
            assert torch.equal(got, exp)
        step(nxt)  # real omitted: every sequence real again
        assert torch.equal(state.count, ref.count + 1)


def test_feed_back_writes_the_argmax_into_the_ids(eager_capture):
    model = _model("linear").double()
    with torch.no_grad():
        _, state = model.prefill(*_prompts(), last_only=True)
        step = GraphedStep(model, state, feed_back=True)
        logits = step()
        assert torch.equal(step.ids, logits.argmax(-1))


@pytest.mark.parametrize(
    "attention,message",
    [
        ("softmax", r"cuda_graph: only a constant-size decoding state .* layer 0 \(kv_cache\), 1 \(kv_cache\)"),
        (["primal", "sparse"], r"layer 1 \(window_cache\) keeps a cache that grows"),
        ("primal", "cuda_graph: CUDA graphs need the model on a CUDA device, got cpu"),
    ],
)
def test_generate_refuses_what_a_graph_cannot_hold(attention, message):
    model = _model(attention)
    with pytest.raises(ValueError, match=message):
        model.generate(*_prompts(), 4, cuda_graph=True)


def test_options_are_checked_not_coerced(eager_capture):
    model = _model("primal")
    with pytest.raises(TypeError, match="cuda_graph must be a bool"):
        model.generate(*_prompts(), 4, cuda_graph="true")
    with torch.no_grad():
        _, state = model.prefill(*_prompts(), last_only=True)
        with pytest.raises(ValueError, match="warmup"):
            GraphedStep(model, state, warmup=0)
        with pytest.raises(TypeError, match="feed_back must be a bool"):
            GraphedStep(model, state, feed_back=1)
        with pytest.raises(ValueError, match=r"training mode; call model.eval\(\) first"):
            GraphedStep(model.train(), state)


def test_check_graphable_names_the_caller():
    with pytest.raises(ValueError, match="--cuda-graph: only a constant-size"):
        check_graphable(_model("softmax"), torch.device("cpu"), what="--cuda-graph")
