"""Attention-BN / SH / BN+SH kernels against the plain reference (forward and gradients, float64) and helpers."""

from __future__ import annotations

import pytest
import torch

from primaldual.functional.svr import (
    downsample,
    factor_ladder,
    key_statistics,
    memory_ratio,
    pooled_visibility,
    pooling_matrix,
    prefix_key_statistics,
    svr_attention,
)
from primaldual.naive.svr import svr_attention_ref
from tests.conftest import rel_err

B, H, N, D = 2, 3, 17, 4


def _inputs(n: int = N, odd: bool = False):
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    km = torch.ones(B, n, dtype=torch.bool)
    km[1, n - 5 :] = False  # right padding
    km[0, :2] = False  # left padding (empty causal prefixes)
    if odd:  # odd left padding and pads inside the sequences: windows must follow the real tokens
        km[1, :3] = False
        km[0, 6:9] = False
        km[1, 8] = False
    return q, k, v, km


def _compare(opts: dict, ref_opts: dict, n: int = N, odd: bool = False):
    q, k, v, km = _inputs(n, odd)
    out_f, _ = svr_attention(q, k, v, key_mask=km, **opts)
    g = torch.randn_like(out_f)
    grads_f = torch.autograd.grad((out_f * g).sum(), (q, k, v))
    out_r = svr_attention_ref(q, k, v, key_mask=km, **ref_opts)
    grads_r = torch.autograd.grad((out_r * g).sum(), (q, k, v))
    assert rel_err(out_f, out_r) < 1e-6
    for gf, gr in zip(grads_f, grads_r):
        assert rel_err(gf, gr) < 1e-6


CASES = [
    # (kernel, causal, bn options, sh options)
    ("softmax", False, {}, {"factors": [1, 2, 3]}),
    ("softmax", True, {}, {"factors": [1, 2, 3]}),
    ("softmax", False, {}, {"factors": [2, 4, 1], "pooling": "stride"}),
    ("softmax", True, {}, {"factors": [2, 4, 1], "pooling": "stride"}),
    ("linear", False, {}, {"factors": [1, 2, 3]}),
    ("linear", True, {}, {"factors": [1, 2, 3]}),
    ("linear", True, {}, {"factors": [3, 3, 2], "pooling": "stride"}),
    ("softmax", False, {"beta": 1.0}, {}),
    ("softmax", True, {"beta": 1.0}, {}),
    ("softmax", False, {"beta": 0.5, "stats_over": "batch", "divide_std": False}, {}),
    ("softmax", True, {"beta": 0.7, "stats_over": "batch"}, {}),
    ("linear", False, {"beta": 1.0}, {}),
    ("linear", False, {"beta": 1.0, "stats_over": "batch"}, {}),
    ("softmax", False, {"beta": 1.0}, {"factors": [1, 2, 3]}),
    ("softmax", True, {"beta": 1.0}, {"factors": [1, 2, 3]}),
    ("softmax", False, {"beta": 1.0, "stats_from": "full"}, {"factors": [2, 1, 3]}),
    ("softmax", True, {"beta": 1.0, "stats_from": "full", "stats_over": "batch"}, {"factors": [2, 1, 3]}),
    ("softmax", True, {"beta": 1.0}, {"factors": [2, 3, 2], "pooling": "stride"}),
    ("linear", False, {"beta": 1.0}, {"factors": [1, 2, 3]}),
    ("linear", False, {"beta": 1.0, "stats_from": "full"}, {"factors": [4, 2, 2], "pooling": "stride"}),
]


@pytest.mark.parametrize("kernel,causal,bn,sh", CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_reference(kernel, causal, bn, sh):
    opts = {"kernel": kernel, "causal": causal, "bn": bool(bn), **bn, **sh}
    ref = dict(opts)
    ref.setdefault("factors", None)
    _compare(opts, ref)


@pytest.mark.parametrize("kernel,causal,bn,sh", CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_reference_with_odd_and_inner_padding(kernel, causal, bn, sh):
    opts = {"kernel": kernel, "causal": causal, "bn": bool(bn), **bn, **sh}
    ref = dict(opts)
    ref.setdefault("factors", None)
    _compare(opts, ref, odd=True)


@pytest.mark.parametrize("pad", [(1, 0), (3, 2), (0, 5), (4, 7), (7, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_windows_follow_the_real_tokens(pad, causal):
    """The reference itself: a left / right padded sequence gives the unpadded sequence's outputs."""
    left, right = pad
    q, k, v = (torch.randn(1, 2, 7, D, dtype=torch.float64) for _ in range(3))
    opts = {"causal": causal, "bn": True, "factors": [2, 3], "stats_over": "tokens"}
    alone = svr_attention_ref(q, k, v, **opts)
    qp, kp, vp = (torch.cat([torch.randn(1, 2, left, D), t, torch.randn(1, 2, right, D)], 2) for t in (q, k, v))
    km = torch.tensor([[False] * left + [True] * 7 + [False] * right])
    out = svr_attention_ref(qp.double(), kp.double(), vp.double(), key_mask=km, **opts)
    assert rel_err(out[:, :, left : left + 7], alone) < 1e-12


def test_windows_start_at_the_first_real_token():
    x = torch.arange(8, dtype=torch.float64).reshape(1, 1, 8, 1)  # tokens 0..7
    km = torch.tensor([[False, True, True, True, False, True, True, False]])  # real: 1, 2, 3, 5, 6
    pooled, pm = downsample(x, km, 2)
    assert pooled[0, 0, :, 0].tolist() == [1.5, 4.0, 6.0, 0.0] and pm.tolist() == [[True, True, True, False]]
    pooled, pm = downsample(x, km, 2, pooling="stride")
    assert pooled[0, 0, :3, 0].tolist() == [1.0, 3.0, 6.0] and pm.tolist() == [[True, True, True, False]]
    # causal: a window is visible from its last real token on; the partial window (6,) never is
    assert pooled_visibility(km, 8, 2).tolist() == [[0, 0, 1, 1, 1, 2, 2, 2]]
    assert pooled_visibility(km, 8, 2, "stride").tolist() == [[0, 1, 1, 2, 2, 2, 3, 3]]
    assert pooled_visibility(None, 5, 2).tolist() == [[0, 1, 1, 2, 2]]
    assert pooled_visibility(km, 8, 1).tolist() == [list(range(1, 9))]  # factor 1: keys stay in place


@pytest.mark.parametrize("pooling", ["avg", "stride"])
@pytest.mark.parametrize("bn", [False, True])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
def test_grid_pooling_matches_reference(pooling, bn, kernel):
    grid, num_cls = (3, 5), 2
    opts = {"kernel": kernel, "bn": bn, "factors": [1, 2, 3], "pooling": pooling, "grid": grid, "num_cls": num_cls}
    _compare(opts, opts, n=num_cls + 15)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
@pytest.mark.parametrize("pooling", ["avg", "stride"])
def test_token_weights_reproduce_output(causal, kernel, pooling):
    q, k, v, km = _inputs()
    out, w = svr_attention(
        q, k, v, key_mask=km, kernel=kernel, causal=causal, factors=[1, 2, 5], pooling=pooling, need_weights=True
    )
    assert w.shape == (B, H, N, N)
    assert rel_err(w @ v, out) < 1e-12
    assert (w[0, :, :, :2] == 0).all() and (w[1, :, :, N - 5 :] == 0).all(), "padded keys must get zero weight"
    if causal:
        assert (w.triu(1) == 0).all(), "no weight on future tokens"
    if kernel == "softmax" and not causal:
        assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_pooling_matrix_reproduces_downsample():
    x = torch.randn(B, 1, N, D, dtype=torch.float64)
    _, _, _, km = _inputs()
    for pooling in ("avg", "stride"):
        for f in (1, 2, 3, 20):
            pooled, pm = downsample(x, km, f, pooling=pooling)
            p = pooling_matrix(km, N, f, pooling=pooling, dtype=torch.float64)
            real = pm[:, None, :, None].to(x.dtype)  # (B, 1, M, 1): masked windows are zero rows of P
            assert rel_err(p[:, None] @ x, pooled * real) < 1e-12
            assert pooled.shape[2] == -(-N // f)


def test_avg_pooling_is_padding_aware():
    x = torch.arange(6, dtype=torch.float64).reshape(1, 1, 6, 1)  # tokens 0..5
    km = torch.tensor([[True, True, True, False, False, False]])
    pooled, pm = downsample(x, km, 2)
    assert pooled[0, 0, :2, 0].tolist() == [0.5, 2.0]  # the window (2, 3) averages its real token only
    assert pm.tolist() == [[True, True, False]]  # an all-padding window is masked


def test_statistics_exclude_padding_and_prefix_matches_full():
    q, k, v, km = _inputs()
    mu, std = key_statistics(k, km)
    kb = k[1, :, : N - 5]
    assert torch.allclose(mu[1, :, 0], kb.mean(1))
    assert torch.allclose(std[1, :, 0], (kb.var(1, unbiased=False) + 1e-5).sqrt())
    pmu, pstd = prefix_key_statistics(k, km, torch.arange(1, N + 1))
    assert torch.allclose(pmu[:, :, -1:], mu) and torch.allclose(pstd[:, :, -1:], std)
    bmu, _ = key_statistics(k, km, stats_over="batch")
    assert bmu.shape == (1, H, 1, D)
    assert torch.allclose(bmu[0, :, 0], torch.cat([k[0, :, 2:], k[1, :, : N - 5]], 1).mean(1))


def test_ladder_and_memory_ratio():
    assert factor_ladder(8) == [1, 1, 2, 2, 4, 4, 8, 8]
    assert factor_ladder(4) == [1, 1, 2, 2]
    # fewer than 4 heads: one per octave, so SH never silently equals plain multi-head attention
    assert factor_ladder(3) == [1, 2, 4] and factor_ladder(2) == [1, 2] and factor_ladder(1) == [1]
    assert memory_ratio([1, 1, 2, 2, 4, 4, 8, 8]) == pytest.approx(3.75 / 8)
    assert memory_ratio([2, 2], grid=(4, 4)) == pytest.approx(0.25)


def test_outputs_have_length_n_even_with_factors_beyond_n():
    q, k, v, km = _inputs()
    out, _ = svr_attention(q, k, v, key_mask=km, factors=[N + 4, 1, 7])
    assert out.shape == (B, H, N, D) and torch.isfinite(out).all()


def test_bad_inputs():
    q = torch.randn(1, 3, 6, 4)
    with pytest.raises(ValueError, match="factors"):
        svr_attention(q, q, q, factors=[1, 2])
    with pytest.raises(ValueError, match="factors"):
        svr_attention(q, q, q, factors=[1, 0, 2])
    with pytest.raises(ValueError, match="pooling"):
        svr_attention(q, q, q, factors=None, pooling="max")
    with pytest.raises(ValueError, match="num_cls \\+ gh \\* gw.*cannot be padded"):
        svr_attention(q, q, q, factors=None, grid=(2, 3), num_cls=1)
    with pytest.raises(ValueError, match="stats_over"):
        svr_attention(q, q, q, bn=True, stats_over="channels")
    with pytest.raises(ValueError, match="beta"):
        svr_attention(q, q, q, bn=True, beta=float("nan"))
    with pytest.raises(ValueError, match="causal Attention-BN"):
        svr_attention(q, q, q, bn=True, kernel="linear", causal=True)
    with pytest.raises(ValueError, match="kernel"):
        svr_attention(q, q, q, kernel="cosine")
    with pytest.raises(ValueError, match="causal=True needs grid=None"):
        svr_attention(q, q, q, factors=None, grid=(2, 3), causal=True)


@pytest.mark.parametrize("causal", [False, True])
def test_bn_runs_in_float32_under_half_precision(causal):
    """float16 / bfloat16 inputs: statistics, normalisation and kernel in float32, output in the input dtype;
    float32 inputs under float16 autocast: autocast is off inside, so the result is the float32 one."""
    q, k, v = (torch.randn(2, 3, 20, 8) for _ in range(3))
    opts = {"bn": True, "causal": causal, "factors": [1, 2, 3]}
    ref, _ = svr_attention(q, k, v, **opts)
    for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 5e-2)):
        out, _ = svr_attention(q.to(dtype), k.to(dtype), v.to(dtype), **opts)
        assert out.dtype == dtype and torch.isfinite(out).all() and rel_err(out, ref) < tol
        with torch.autocast("cpu", dtype=dtype):
            auto, _ = svr_attention(q, k, v, **opts)
        assert auto.dtype == torch.float32 and rel_err(auto, ref) < 1e-6
    # the position-0 case of causal BN in float16: one key, s^2 = eps, 1 / eps overflows float16
    out, _ = svr_attention(q[:, :, :1].half(), k[:, :, :1].half(), v[:, :, :1].half(), **opts)
    assert torch.isfinite(out).all()
