"""The fused primal score kernel against the PyTorch score path: output, every gradient, the layer's output and
KSVD term, tile remainders, masks, causal prefix means, data-dependent weights and bias; poisoned outputs; the
named fallback. Natively on a GPU, else in Triton's interpreter (tiny shapes: seconds)."""

from __future__ import annotations

import warnings

import pytest
import torch

import primaldual as pd
from primaldual.functional.primal import primal_scores_from_input
from tests.conftest import rel_err

triton = pytest.importorskip("triton", reason="the kernels extra (triton) is not installed")
from primaldual.kernels import primal_scores as ks  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 2e-3 if DEV == "cuda" else 1e-5  # tf32 products on a GPU; the interpreter computes in float32


@pytest.mark.parametrize(
    "B,N,C,H,P,S,dependent,bias",
    [
        (2, 37, 24, 3, 8, 5, False, True),  # N and C not multiples of the tiles, s not a power of two
        (2, 70, 24, 2, 12, 4, True, False),  # two row tiles, p = 12, per-sample weights
        (1, 5, 16, 2, 8, 3, True, True),  # fewer tokens than one tile
    ],
)
def test_scores_and_gradients_match_the_score_path(B, N, C, H, P, S, dependent, bias):
    torch.manual_seed(0)
    x = torch.randn(B, N, C, device=DEV, requires_grad=True)
    wq = torch.randn(2 * H * P, C, device=DEV, requires_grad=True)
    b = torch.randn(2 * H * P, device=DEV, requires_grad=True) if bias else None
    w = torch.randn(*((B,) if dependent else ()), 2, H, P, S, device=DEV, requires_grad=True)
    out = ks.primal_scores_triton(x, wq, b, w)
    ref = primal_scores_from_input(x, wq, b, w)[0]
    assert out.shape == ref.shape == (B, N, H, 2, S)
    assert rel_err(out, ref) < TOL
    g = torch.randn_like(ref)
    params = [x, wq, w] + ([b] if bias else [])
    for got, want in zip(torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g)):
        assert rel_err(got, want) < TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs(dtype):
    """bf16 / fp16 inputs against the float64 score path: within half-precision rounding."""
    torch.manual_seed(4)
    x = torch.randn(2, 40, 32, device=DEV).to(dtype).requires_grad_(True)
    wq = torch.randn(2 * 2 * 16, 32, device=DEV).to(dtype).requires_grad_(True)
    w = torch.randn(2, 2, 16, 5, device=DEV).to(dtype).requires_grad_(True)
    out = ks.primal_scores_triton(x, wq, None, w)
    ref = primal_scores_from_input(x.double(), wq.double(), None, w.double())[0]
    assert out.dtype == dtype and rel_err(out, ref) < 3e-2
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, (x, wq, w), g.to(dtype))
    want = torch.autograd.grad(ref, (x, wq, w), g)
    for a, b in zip(got, want):
        assert a.dtype == dtype and rel_err(a, b) < 3e-2


def test_zero_rows_follow_the_eps_clamp():
    """Tokens whose projection is zero (zero input, no bias): the norm is clamped, its gradient is zero there."""
    torch.manual_seed(3)
    x = torch.randn(1, 20, 16, device=DEV)
    x[0, 5:9] = 0.0
    x.requires_grad_(True)
    wq = torch.randn(2 * 2 * 8, 16, device=DEV, requires_grad=True)
    w = torch.randn(2, 2, 8, 3, device=DEV, requires_grad=True)
    out = ks.primal_scores_triton(x, wq, None, w)
    ref = primal_scores_from_input(x, wq, None, w)[0]
    assert torch.isfinite(out).all() and rel_err(out, ref) < TOL
    g = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(out, (x, wq, w), g), torch.autograd.grad(ref, (x, wq, w), g)):
        assert torch.isfinite(got).all() and rel_err(got, want) < TOL


def test_every_output_element_is_written():
    torch.manual_seed(1)
    B, N, C, H, P, S = 2, 19, 16, 2, 8, 3
    x, wq, w = (
        torch.randn(B, N, C, device=DEV),
        torch.randn(2 * H * P, C, device=DEV),
        torch.randn(2, H, P, S, device=DEV),
    )
    scores = torch.full((B, N, H, 2, S), float("nan"), device=DEV)
    inv = torch.full((B, N, 2, H), float("nan"), device=DEV)
    ks._forward(x, wq, None, w, 1e-12, out=(scores, inv))
    assert torch.isfinite(scores).all() and torch.isfinite(inv).all()
    ref = primal_scores_from_input(x, wq, None, w)[0]
    assert rel_err(scores, ref) < TOL
    norms = torch.linalg.vector_norm((x @ wq.T).view(B, N, 2, H, P), dim=-1)
    assert rel_err(inv, norms.reciprocal()) < TOL


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_layer_with_the_kernel_equals_the_layer_without(causal, masked, monkeypatch):
    """Output, KSVD term and every parameter's gradient of PrimalAttention(kernel="triton") against the default."""
    calls = []
    kernel = ks.primal_scores_triton
    monkeypatch.setattr(ks, "primal_scores_triton", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    torch.manual_seed(2)
    ref = pd.build_attention("primal", 16, 2, causal=causal, s=3, n=6 if not causal else None, path="scores").to(DEV)
    fused = pd.build_attention("primal", 16, 2, causal=causal, s=3, n=6 if not causal else None, kernel="triton")
    fused = fused.to(DEV)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 21, 16, device=DEV)
    mask = None
    if masked:
        mask = torch.ones(2, 21, dtype=torch.bool, device=DEV)
        mask[1, 15:] = False
    outs = []
    for layer in (ref, fused):
        layer.train()
        y = layer(x, mask)
        term = pd.collect_aux_loss(layer)
        (y.square().sum() + term).backward()
        outs.append((y.detach(), term.detach(), [p.grad.clone() for p in layer.parameters()]))
    (y0, t0, g0), (y1, t1, g1) = outs
    assert calls == [1]  # the kernel ran, once, in the fused layer only
    assert rel_err(y1, y0) < TOL and rel_err(t1, t0) < 10 * TOL
    for a, b in zip(g1, g0):
        assert rel_err(a, b) < 10 * TOL


def test_the_fallback_is_one_named_warning(monkeypatch):
    monkeypatch.setattr(ks, "triton_unavailable_reason", lambda x: "no GPU here (test)")
    layer = pd.build_attention("primal", 16, 2, s=3, n=6, kernel="triton")
    ref = pd.build_attention("primal", 16, 2, s=3, n=6, path="scores")
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(2, 9, 16)
    with pytest.warns(RuntimeWarning, match=r"kernel='triton'\): no GPU here \(test\); this layer uses its PyTorch"):
        y = layer(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per layer, not per call
        layer(x)
    assert rel_err(y, ref(x)) < 1e-6


def test_options_are_checked():
    with pytest.raises(ValueError, match="kernel"):
        pd.build_attention("primal", 16, 2, kernel="cuda")
    with pytest.raises(ValueError, match="cannot serve path='rotated'"):
        pd.build_attention("primal", 16, 2, kernel="triton", path="rotated")
    with pytest.raises(ValueError, match="choose one"):
        pd.build_attention("primal", 16, 2, kernel="triton", compile=True)
    assert "kernel='triton'" in repr(pd.build_attention("primal", 16, 2, kernel="triton"))
