"""Every functional kernel against its plain reference: forward and gradients, float64, odd sizes."""

from __future__ import annotations

import pytest
import torch

from primaldual.functional import linear_attention, softmax_attention, sparse_attention
from primaldual.naive.linear import linear_attention_ref
from primaldual.naive.softmax import softmax_attention_ref
from primaldual.naive.sparse import sparse_attention_ref
from tests.conftest import rel_err

B, H, N, D = 2, 3, 37, 5


def _inputs():
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    km = torch.ones(B, N, dtype=torch.bool)
    km[1, 29:] = False  # right padding
    km[0, :3] = False  # left padding (exercises empty causal rows)
    return q, k, v, km


def _compare(fast, ref, q, k, v):
    g = torch.randn_like(ref(q, k, v))
    out_f = fast(q, k, v)
    grads_f = torch.autograd.grad((out_f * g).sum(), (q, k, v))
    out_r = ref(q, k, v)
    grads_r = torch.autograd.grad((out_r * g).sum(), (q, k, v))
    assert rel_err(out_f, out_r) < 1e-6
    for gf, gr in zip(grads_f, grads_r):
        assert rel_err(gf, gr) < 1e-6


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_softmax_matches_reference(causal, masked, backend):
    q, k, v, km = _inputs()
    km = km if masked else None
    _compare(
        lambda q, k, v: softmax_attention(q, k, v, key_mask=km, causal=causal, backend=backend)[0],
        lambda q, k, v: softmax_attention_ref(q, k, v, key_mask=km, causal=causal),
        q,
        k,
        v,
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_softcapped_softmax_matches_reference(causal, masked):
    """Gemma 2's soft cap, c * tanh(s / c), on logits large enough for the cap to bite."""
    q, k, v, km = _inputs()
    km = km if masked else None
    q3 = lambda q: q * 3  # noqa: E731 - logits of a few units, near the cap of 2
    _compare(
        lambda q, k, v: softmax_attention(q3(q), k, v, key_mask=km, causal=causal, softcap=2.0)[0],
        lambda q, k, v: softmax_attention_ref(q3(q), k, v, key_mask=km, causal=causal, softcap=2.0),
        q,
        k,
        v,
    )
    capped = softmax_attention(q3(q), k, v, key_mask=km, causal=causal, softcap=2.0)[0]
    assert rel_err(capped, softmax_attention(q3(q), k, v, key_mask=km, causal=causal)[0]) > 1e-2  # the cap bites


def test_softcap_options_are_checked():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="backend='sdpa' cannot cap the logits"):
        softmax_attention(q, k, v, softcap=2.0, backend="sdpa")
    with pytest.raises(ValueError, match="softcap"):
        softmax_attention(q, k, v, softcap=0.0)
    with pytest.raises(TypeError, match="softcap"):
        softmax_attention(q, k, v, softcap="50")


def test_softmax_sdpa_equals_eager_and_weights():
    q, k, v, km = _inputs()
    a, _ = softmax_attention(q, k, v, key_mask=km, backend="sdpa")
    b, w = softmax_attention(q, k, v, key_mask=km, need_weights=True)
    assert rel_err(a, b) < 1e-12
    assert torch.allclose(w @ v, b)
    assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_linear_matches_reference(causal, masked, chunk):
    q, k, v, km = _inputs()
    km = km if masked else None
    _compare(
        lambda q, k, v: linear_attention(q, k, v, key_mask=km, causal=causal, chunk_size=chunk)[0],
        lambda q, k, v: linear_attention_ref(q, k, v, key_mask=km, causal=causal),
        q,
        k,
        v,
    )


def test_linear_weights_reproduce_output():
    q, k, v, km = _inputs()
    for causal in (False, True):
        out, w = linear_attention(q, k, v, key_mask=km, causal=causal, need_weights=True)
        assert rel_err(w @ v, out) < 1e-12
        assert (w[..., ~km[0]][0] == 0).all()


def test_linear_half_precision_long_sequence_is_finite():
    q, k, v = (torch.randn(1, 2, 4096, 16).mul(4).to(torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        out, _ = linear_attention(q, k, v, causal=causal)
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", [(3, 0, 0), (4, 5, 0), (2, 0, 3), (5, 7, 2), (0, 0, 0), (50, 0, 0), (1, 1, 1)])
def test_sparse_matches_reference(causal, pattern):
    w, s, g = pattern
    q, k, v, km = _inputs()
    _compare(
        lambda q, k, v: sparse_attention(q, k, v, window=w, stride=s, num_global=g, key_mask=km, causal=causal)[0],
        lambda q, k, v: sparse_attention_ref(q, k, v, w, s, g, key_mask=km, causal=causal),
        q,
        k,
        v,
    )


@pytest.mark.parametrize("causal", [False, True])
def test_a_window_wider_than_the_sequence_costs_the_sequence(causal):
    """A Mistral layer's 4,096-key window on a short batch: blocks of the sequence's length, not the window's (a
    block of 10**6 would need terabytes)."""
    q, k, v, km = _inputs()
    for w, s, g in ((4095, 0, 0), (10**6, 3, 2)):
        out = sparse_attention(q, k, v, window=w, stride=s, num_global=g, key_mask=km, causal=causal)[0]
        assert rel_err(out, sparse_attention_ref(q, k, v, w, s, g, key_mask=km, causal=causal)) < 1e-6


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", [(3, 0, 0), (2, 5, 2)])
def test_softcapped_sparse_matches_reference(causal, pattern):
    """Gemma 2's sliding layers: the cap on the pattern's logits, on every path (blocked, weights, padded)."""
    q, k, v, km = _inputs()
    w, s, g = pattern
    q3 = lambda q: q * 3  # noqa: E731 - logits of a few units, near the cap of 2
    for mask in (None, km):
        _compare(
            lambda q, k, v, m=mask: sparse_attention(
                q3(q), k, v, window=w, stride=s, num_global=g, key_mask=m, causal=causal, softcap=2.0
            )[0],
            lambda q, k, v, m=mask: sparse_attention_ref(q3(q), k, v, w, s, g, key_mask=m, causal=causal, softcap=2.0),
            q,
            k,
            v,
        )
    dense = sparse_attention(q3(q), k, v, window=w, stride=s, num_global=g, key_mask=km, causal=causal, softcap=2.0,
                             need_weights=True)[0]  # fmt: skip
    ref = sparse_attention_ref(q3(q), k, v, w, s, g, key_mask=km, causal=causal, softcap=2.0)
    assert rel_err(dense, ref) < 1e-6
    uncapped = sparse_attention(q3(q), k, v, window=w, stride=s, num_global=g, key_mask=km, causal=causal)[0]
    assert rel_err(dense, uncapped) > 1e-2  # the cap bites
    with pytest.raises(ValueError, match="softcap"):
        sparse_attention(q, k, v, window=w, softcap=0.0)


def test_sparse_full_window_equals_softmax():
    q, k, v, km = _inputs()
    a, _ = sparse_attention(q, k, v, window=N, key_mask=km)
    b, _ = softmax_attention(q, k, v, key_mask=km)
    assert rel_err(a, b) < 1e-12


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v, _ = _inputs()
    km = torch.zeros(B, N, dtype=torch.bool)
    for out in (
        softmax_attention(q, k, v, key_mask=km)[0],
        softmax_attention(q, k, v, key_mask=km, backend="eager")[0],
        linear_attention(q, k, v, key_mask=km)[0],
        linear_attention(q, k, v, key_mask=km, causal=True)[0],
        sparse_attention(q, k, v, window=3, stride=4, num_global=2, key_mask=km)[0],
    ):
        assert torch.isfinite(out).all() and (out == 0).all()


def test_functional_bad_inputs():
    q = torch.randn(2, 3, 5, 4)
    with pytest.raises(ValueError, match="4-D"):
        softmax_attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="share"):
        softmax_attention(q, q[:1], q[:1])
    with pytest.raises(TypeError, match="torch.bool"):
        softmax_attention(q, q, q, key_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="window"):
        sparse_attention(q, q, q, window=-1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", [(2, 0, 2), (2, 3, 1), (1, 4, 3)])
def test_sparse_pattern_counts_real_tokens_whatever_the_padding(causal, pattern):
    """Global tokens, windows and strides are counted over each sequence's real tokens: pads on the left, on the
    right or inside never move them, on the fast path, the weights path and the reference alike."""
    w, s, g = pattern
    n = 11
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64) for _ in range(3))
    ref = sparse_attention(q, k, v, window=w, stride=s, num_global=g, causal=causal)[0]
    for layout in ([0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0], [1] * n + [0] * 3, [0] * 7 + [1] * n):
        km = torch.tensor(layout, dtype=torch.bool)[None]  # (1, L)
        L = km.shape[1]
        qp, kp, vp = (100 * torch.randn(1, 2, L, 4, dtype=torch.float64) for _ in range(3))
        for full, part in ((qp, q), (kp, k), (vp, v)):
            full[:, :, km[0]] = part
        fast = sparse_attention(qp, kp, vp, window=w, stride=s, num_global=g, key_mask=km, causal=causal)[0]
        dense, weights = sparse_attention(
            qp, kp, vp, window=w, stride=s, num_global=g, key_mask=km, causal=causal, need_weights=True
        )
        naive = sparse_attention_ref(qp, kp, vp, w, s, g, key_mask=km, causal=causal)
        for out in (fast, dense, naive):
            assert rel_err(out[:, :, km[0]], ref) < 1e-12, layout
        assert rel_err(fast, naive) < 1e-12 and (weights[..., ~km[0]] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_auto_backend_takes_the_explicit_matrix_for_short_low_precision_cpu_attention(monkeypatch, dtype):
    """backend "auto" on the CPU: bfloat16 / float16 with at most CPU_EAGER_MAX_KEYS keys skips SDPA (slower there),
    with outputs equal to SDPA's to the precision; float32 and longer sequences keep SDPA."""
    from primaldual.functional import softmax as S

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 9, 8) for _ in range(3))
    km = torch.ones(2, 9, dtype=torch.bool)
    km[1, :3] = False
    want = S.softmax_attention(q, k, v, key_mask=km, causal=True, backend="sdpa")[0]
    calls = []
    real = S.F.scaled_dot_product_attention
    monkeypatch.setattr(S.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    low = [t.to(dtype) for t in (q, k, v)]
    got = S.softmax_attention(*low, key_mask=km, causal=True)[0]
    assert not calls and (got.float() - want).abs().max() < 2e-2
    S.softmax_attention(q, k, v, key_mask=km, causal=True)
    assert len(calls) == 1  # float32: SDPA
    n = S.CPU_EAGER_MAX_KEYS + 1
    long = [torch.randn(1, 1, n, 8, dtype=dtype) for _ in range(3)]
    S.softmax_attention(*long, causal=True)
    assert len(calls) == 2  # past the threshold: SDPA


def test_causal_sparse_global_queries_build_no_n_by_n_pattern(monkeypatch):
    """The global queries of a causal pattern see keys 0..i: a (G, N) mask, never the dense (N, N) pattern."""
    import primaldual.functional.sparse as sparse

    q, k, v = (torch.randn(2, 2, 40, 8, dtype=torch.float64) for _ in range(3))
    km = torch.ones(2, 40, dtype=torch.bool)
    km[1, 33:] = False
    ref = sparse_attention_ref(q, k, v, 3, 0, 2, key_mask=km, causal=True)
    monkeypatch.setattr(sparse, "sparse_pattern", lambda *a, **k: pytest.fail("the dense pattern was built"))
    out = sparse_attention(q, k, v, window=3, num_global=2, key_mask=km, causal=True)[0]
    assert rel_err(out[km[:, None, :, None].expand_as(out)], ref[km[:, None, :, None].expand_as(ref)]) < 1e-12
