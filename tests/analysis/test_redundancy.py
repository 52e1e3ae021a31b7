"""Head redundancy on models built with every registered attention, and on heads with known similarity."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.analysis.redundancy import head_redundancy, pairwise_head_similarity, track_redundancy

DIM, HEADS, N = 12, 3, 11


def _x_mask():
    x = torch.randn(2, N, DIM)
    m = torch.ones(2, N, dtype=torch.bool)
    m[1, N - 3 :] = False
    return x, m


@pytest.mark.parametrize("name", [i.name for i in pd.list_attentions()])
def test_works_on_an_encoder_with_any_attention(name):
    causal = not pd.attention.attention_class(name).capabilities.non_causal  # hybrid has only a causal form
    enc = pd.Encoder(dim=DIM, depth=2, num_heads=HEADS, attention=name, causal=causal)
    x, m = _x_mask()
    ref = enc.eval()(x, m)
    report = head_redundancy(enc, x, m)
    assert len(report) == 2 and all(r.mechanism == name and r.samples == 2 for r in report)
    cls = pd.attention.attention_class(name)
    caps = cls.capabilities
    for r in report:
        if issubclass(cls, pd.attention.QKVAttention) or r.outputs is not None:
            assert r.outputs is not None and -1.0 <= r.outputs <= 1.0
            assert r.outputs_matrix.shape == (HEADS, HEADS)
        else:  # a layer that never calls `proj` / `head_outputs` has no readable head outputs
            assert caps.weights, f"{name}: neither head outputs nor attention maps are measurable"
        if caps.weights:
            assert r.weights is not None and -1.0 - 1e-9 <= r.weights <= 1.0 + 1e-9
        else:
            assert r.weights is None
    assert torch.equal(enc(x, m), ref), "hooks must be removed and must not change the model"


def test_identical_heads_are_fully_redundant():
    layer = pd.build_attention("softmax", DIM, HEADS)
    with torch.no_grad():  # every head gets the same q, k, v projections
        w = layer.qkv.weight.view(3, HEADS, DIM // HEADS, DIM)
        w[:] = w[:, :1].clone()
        layer.qkv.bias.view(3, HEADS, -1)[:] = layer.qkv.bias.view(3, HEADS, -1)[:, :1].clone()
    x, m = _x_mask()
    (r,) = head_redundancy(layer, x, m)
    assert r.weights == pytest.approx(1.0) and r.outputs == pytest.approx(1.0)


def test_similarity_of_known_vectors():
    t = torch.zeros(1, 3, 2, 2)
    t[0, 0, 0, 0] = 1.0
    t[0, 1, 0, 0] = 2.0  # same direction as head 0
    t[0, 2, 1, 1] = 1.0  # orthogonal
    t[0, 2, 0, 0] = 0.0
    s = pairwise_head_similarity(t)[0]
    assert torch.allclose(s, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=s.dtype))
    # padded positions are left out: a difference only at a padded token does not count
    t[0, 2, 1, 1] = 0.0
    t[0, 2, 0, 0] = 1.0
    t[0, 1, 1, 0] = 5.0
    s = pairwise_head_similarity(t, torch.tensor([[True, False]]))[0]
    assert torch.allclose(s, torch.ones(3, 3, dtype=s.dtype))


def test_accumulates_over_calls_and_keeps_requested_weights():
    layer = pd.build_attention("softmax_sh", DIM, HEADS).eval()
    x, m = _x_mask()
    with torch.no_grad(), track_redundancy(layer) as tracker:
        out, w = layer(x, m, need_weights=True)  # the caller's own request still gets its weights
        layer(x[:1], m[:1])
    assert w.shape == (2, HEADS, N, N)
    (r,) = tracker.results()
    assert r.samples == 3 and r.weights is not None
