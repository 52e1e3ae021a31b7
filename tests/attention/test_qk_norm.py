"""``qk_norm`` on the attention layers: the layer against a plain reference (projection, RMS norm with random
gains, rotary tables, explicit softmax), forward and every gradient; decoding through the norms; what is refused.
The registry-wide checks run layers with ``qk_norm`` too (``tests/attention/test_registry_wide.py``)."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.functional.rotary import apply_rope, rope_tables
from primaldual.naive.softmax import softmax_attention_ref
from tests.conftest import rel_err

DIM, HEADS, D = 12, 3, 4


def _layer(kind: str, causal: bool = True, name: str = "softmax", **opts) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = pd.build_attention(name, DIM, HEADS, causal=causal, qk_norm=kind, dtype=torch.float64, **opts)
    with torch.no_grad():  # gains away from 1, so that a gain left out shows
        layer.q_norm.weight.uniform_(0.5, 1.5)
        layer.k_norm.weight.uniform_(0.5, 1.5)
    return layer


def _reference(layer, x, mask, rope=None) -> torch.Tensor:
    """Projection, the norm written out (per head, or over a token's heads), rotation, explicit softmax."""
    B, N, _ = x.shape
    q, k, v = (x @ layer.qkv.weight.T + layer.qkv.bias).split(HEADS * D, -1)  # (B, N, H*D) each
    eps = layer.q_norm.eps

    def norm(t, g):
        if layer.qk_norm == "all_heads":
            t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * g
            return t.view(B, N, HEADS, D).transpose(1, 2)  # (B, H, N, D)
        t = t.view(B, N, HEADS, D).transpose(1, 2)  # (B, H, N, D)
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * g

    q, k = norm(q, layer.q_norm.weight), norm(k, layer.k_norm.weight)
    if rope is not None:
        q, k = apply_rope(q, k, rope[0][None, None], rope[1][None, None])
    v = v.view(B, N, HEADS, D).transpose(1, 2)  # (B, H, N, D)
    out = softmax_attention_ref(q, k, v, key_mask=mask, causal=layer.causal)
    out = out.transpose(1, 2).reshape(B, N, HEADS * D) @ layer.proj.weight.T + layer.proj.bias  # (B, N, C)
    return out.masked_fill(~mask[..., None], 0.0)


@pytest.mark.parametrize("kind", ["head", "all_heads"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
def test_layer_equals_the_reference_forward_and_gradients(kind, causal, rotary):
    layer = _layer(kind, causal)
    x = torch.randn(2, 7, DIM, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    rope = rope_tables(torch.arange(7), D, dtype=torch.float64) if rotary else None
    got = layer(x, mask, rope=rope)
    want = _reference(layer, x, mask, rope)
    assert rel_err(got, want) < 1e-12
    params = [x, *layer.parameters()]
    g_got = torch.autograd.grad(got.pow(2).sum(), params)
    g_want = torch.autograd.grad(want.pow(2).sum(), params)
    for p, a, b in zip(params, g_got, g_want):
        assert rel_err(a, b) < 1e-10, tuple(p.shape)
    assert any(p is layer.q_norm.weight for p in params)  # the gains train, and were compared


@pytest.mark.parametrize("name,opts", [("softmax", {}), ("sparse", {"window": 3}), ("hybrid", {"window": 3, "s": 2}),
                                       ("linear", {})])  # fmt: skip
def test_decoding_goes_through_the_norms(name, opts):
    """Token-by-token steps (with rotary tables where the mechanism takes them) equal the causal forward."""
    layer = _layer("all_heads", name=name, **opts).eval()
    if name == "hybrid":
        with torch.no_grad():
            layer.gate.fill_(0.5)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    takes = type(layer).capabilities.rope
    cos, sin = rope_tables(torch.arange(9), D, dtype=torch.float64)
    full = layer(x, rope=(cos, sin) if takes else None)
    state = layer.init_state(2)
    for t in range(9):
        y, state = layer.step(x[:, t], state, rope=(cos[t], sin[t]) if takes else None)
        assert rel_err(y, full[:, t]) < 1e-10, t


def test_norms_change_the_output_and_are_in_the_state_dict():
    torch.manual_seed(0)
    plain = pd.build_attention("softmax", DIM, HEADS, dtype=torch.float64)
    normed = pd.build_attention("softmax", DIM, HEADS, dtype=torch.float64, qk_norm="head")
    normed.load_state_dict(plain.state_dict(), strict=False)
    x = torch.randn(1, 5, DIM, dtype=torch.float64) * 5
    assert rel_err(normed(x), plain(x)) > 1e-3
    assert {"q_norm.weight", "k_norm.weight"} <= set(normed.state_dict())
    assert "qk_norm='head'" in repr(normed)
    assert normed.qk_norm_gains().kind == "head" and plain.qk_norm_gains() is None


@pytest.mark.parametrize("opts,error,message", [
    ({"qk_norm": "rms"}, ValueError, r"qk_norm must be one of None, 'head', 'all_heads'; got 'rms'"),
    ({"qk_norm": True}, ValueError, "qk_norm must be one of"),
    ({"qk_norm": "head", "qk_norm_eps": 0.0}, ValueError, "qk_norm_eps"),
    ({"qk_norm": "head", "qk_norm_eps": "1e-5"}, TypeError, "qk_norm_eps"),
    ({"qk_norm_eps": 1e-5}, ValueError, "qk_norm_eps: only a layer with qk_norm"),
])  # fmt: skip
def test_bad_options_are_named(opts, error, message):
    with pytest.raises(error, match=message):
        pd.build_attention("softmax", DIM, HEADS, **opts)


def test_mechanisms_without_a_qkv_projection_do_not_take_it():
    assert "qk_norm" not in pd.attention_options("primal")
    with pytest.raises(TypeError, match="qk_norm"):
        pd.build_attention("primal", DIM, HEADS, qk_norm="head")
