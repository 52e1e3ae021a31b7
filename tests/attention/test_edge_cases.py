"""Edge cases a hostile user hits: empty inputs, half precision, copies after a forward, tracing, the meta device."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
from torch.optim.swa_utils import AveragedModel

import primaldual as pd

DIM, HEADS = 16, 2
HALF = (torch.float16, torch.bfloat16)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(0, 5, DIM), (2, 0, DIM), (0, 0, DIM)])
def test_primal_empty_batch_or_sequence_gives_empty_output(causal, shape):
    layer = pd.build_attention("primal", DIM, HEADS, causal=causal, s=3)
    out, w = layer(torch.randn(*shape), need_weights=True)
    assert out.shape == shape and w.shape == (shape[0], HEADS, shape[1], shape[1])
    assert pd.collect_aux_loss(layer) is None  # no data, no KSVD term


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("causal", [False, True])
def test_primal_builds_in_half_precision_like_float32(dtype, causal):
    torch.manual_seed(0)
    half = pd.build_attention("primal", DIM, HEADS, causal=causal, dtype=dtype)
    torch.manual_seed(0)
    full = pd.build_attention("primal", DIM, HEADS, causal=causal)
    assert half.w_e.dtype == dtype
    assert torch.allclose(half.w_e.float(), full.w_e, atol=1e-2)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "name,opts",
    [
        ("primal", {}),
        ("primal", {"causal": True}),
        ("primal", {"padding": "reference"}),
        ("sparse", {"window": 4}),
        ("sparse", {"window": 3, "stride": 5, "num_global": 2}),
        ("sparse", {"window": 4, "causal": True}),
    ],
)
def test_half_precision_stays_finite_for_large_inputs(dtype, name, opts):
    """float16 passes 65,504 in q k^T or in the primal scores for |x| of a few hundred unless computed in float32."""
    torch.manual_seed(0)
    layer = pd.build_attention(name, 64, 2, **opts).to(dtype)
    mask = torch.ones(3, 200, dtype=torch.bool)
    mask[1, 150:] = False
    for scale in (300.0, 1e4):
        x = (torch.randn(3, 200, 64) * scale / 3).clamp(-scale, scale).to(dtype).requires_grad_(True)
        out, w = layer(x, mask, need_weights=True)
        assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(w).all()
        pd.clear_aux_loss(layer)
        out.float().sum().backward()
        assert torch.isfinite(x.grad).all()


def test_primal_under_float16_autocast_is_finite():
    layer = pd.build_attention("primal", 64, 2)
    x = torch.randn(2, 100, 64) * 3e3
    with torch.autocast("cpu", dtype=torch.float16):
        out = layer(x)
    assert torch.isfinite(out).all()
    assert torch.isfinite(pd.collect_aux_loss(layer))


def test_copies_after_an_uncollected_forward():
    """deepcopy / AveragedModel (EMA, SWA) / torch.save after a forward whose KSVD term was not collected."""
    enc = pd.Encoder(DIM, 2, HEADS, attention=["softmax", "primal"], attention_options=[None, {"s": 3}])
    enc(torch.randn(2, 7, DIM))
    twin = copy.deepcopy(enc)
    ema = AveragedModel(enc)
    torch.save(enc, io.BytesIO())
    assert pd.collect_aux_loss(twin) is None and pd.collect_aux_loss(ema) is None  # copies start with no term
    assert pd.collect_aux_loss(enc) is not None  # the original keeps its own


def test_jit_trace_of_primal_is_refused_with_a_reason():
    layer = pd.build_attention("primal", DIM, HEADS, s=3)
    with pytest.raises(RuntimeError, match="torch.compile"):
        torch.jit.trace(layer, torch.randn(2, 5, DIM))


@pytest.mark.parametrize("name", [i.name for i in pd.list_attentions()])
def test_meta_device_forward(name):
    """Shape inference on the meta device: no value check, no autocast query, right output shape."""
    causal = not next(i.capabilities for i in pd.list_attentions() if i.name == name).non_causal
    enc = pd.Encoder(DIM, 1, HEADS, attention=name, causal=causal, device="meta")
    assert enc(torch.empty(2, 5, DIM, device="meta")).shape == (2, 5, DIM)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(0, 6), (2, 0)])
@pytest.mark.parametrize("name", [i.name for i in pd.list_attentions()])
def test_every_mechanism_takes_empty_inputs_with_a_backward(name, causal, shape):
    """An empty batch or sequence gives an empty output that a backward passes through (once: linear's causal scan
    divided by zero, and primal's output had no grad_fn)."""
    caps = next(i.capabilities for i in pd.list_attentions() if i.name == name)
    if (causal and not caps.causal) or (not causal and not caps.non_causal):
        pytest.skip(f"{name} has no {'causal' if causal else 'non-causal'} form")
    layer = pd.build_attention(
        name, DIM, 2, causal=causal, **({"max_len": 8} if name == "primal" and not causal else {})
    )
    x = torch.randn(*shape, DIM, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no statistic of zero elements (torch's var_mean warned)
        y = layer(x)
    assert y.shape == (*shape, DIM)
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_generate_with_no_prompts():
    from primaldual.models import CausalLM

    m = CausalLM(50, 16, dim=16, depth=1, num_heads=2, ffn_dim=16, dropout=0.0, attention="softmax").eval()
    ids, mask = m.generate(torch.zeros(0, 3, dtype=torch.long), None, 4)
    assert ids.shape == mask.shape == (0, 7)


@pytest.mark.parametrize("name", [i.name for i in pd.list_attentions() if i.capabilities.causal])
def test_a_step_with_another_batch_than_its_state_is_named(name):
    layer = pd.build_attention(name, DIM, 2, causal=True)
    with pytest.raises(ValueError, match=r"x_t has 3 sequences, but the state was built for 2"):
        layer.step(torch.randn(3, DIM), layer.init_state(2))


@pytest.mark.parametrize("name", [i.name for i in pd.list_attentions()])
def test_dtype_and_device_are_checked_by_name(name):
    causal = not next(i.capabilities for i in pd.list_attentions() if i.name == name).non_causal
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch.dtype .* got 'float16'"):
        pd.build_attention(name, DIM, 2, causal=causal, dtype="float16")
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        pd.build_attention(name, DIM, 2, causal=causal, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"device: expected a torch.device or a name such as 'cpu'"):
        pd.build_attention(name, DIM, 2, causal=causal, device="nope")


def test_causal_only_mechanisms_say_so_in_their_options():
    """A causal-only mechanism builds causal by default and lists causal=True; options a class refuses are not
    listed (hybrid's pattern is window + sinks, not its base class's stride / num_global)."""
    from primaldual.attention.registry import attention_options

    for info in pd.list_attentions():
        opts = attention_options(info.name)
        assert not set(getattr(info.cls, "not_options", ())) & set(opts)
        if not info.capabilities.non_causal:
            assert opts["causal"] is True and pd.build_attention(info.name, DIM, 2).causal
    assert "stride" not in attention_options("hybrid")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['stride'\]"):
        pd.build_attention("hybrid", DIM, 2, stride=2)


@pytest.mark.parametrize("name,opts", [("primal", {"s": 4}), ("linear", {}), ("hybrid", {"window": 8, "s": 4})])
def test_half_precision_decoding_sums_in_float32_as_the_forward(name, opts):
    """A bfloat16 layer's constant-size state keeps its running sums in float32: after a thousand tokens the steps
    are as close to the float64 forward as the bfloat16 forward is (bfloat16 sums drift to 4e-2 .. 5e-1)."""
    torch.manual_seed(0)
    ref = pd.build_attention(name, 32, 2, causal=True, dtype=torch.float64, **opts).eval()
    layer = pd.build_attention(name, 32, 2, causal=True, dtype=torch.bfloat16, **opts).eval()
    layer.load_state_dict({k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()})
    ref.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    T = 1000
    x = (torch.randn(1, T, 32) + 1.0).to(torch.bfloat16)  # a non-zero mean, as real activations have
    with torch.no_grad():
        truth, full = ref(x.double())[:, -50:], layer(x)[:, -50:]
        out, state = layer.prefill(x[:, : T - 50])
        assert state.primal.sum_q.dtype == torch.float32 if name == "hybrid" else state[0].dtype == torch.float32
        ys = []
        for t in range(T - 50, T):
            y, state = layer.step(x[:, t], state)
            ys.append(y)
    err = lambda a: float((a.double() - truth).norm() / truth.norm())  # noqa: E731
    assert err(torch.stack(ys, 1)) < 2 * err(full) + 1e-3
    # under bfloat16 autocast a float32 layer's prefilled sums stay float32 as well
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, state = ref.float().prefill(x[:, :64].float())
    sums = state.primal if name == "hybrid" else state
    assert all(t.dtype == torch.float32 for t in sums)
    with pytest.raises(ValueError, match="dtype: attention 'softmax' keeps its decoding cache in the layer's dtype"):
        pd.build_attention("softmax", 32, 2, causal=True).init_state(1, dtype=torch.float64)
