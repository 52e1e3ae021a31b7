"""The fused primal score kernel against the PyTorch score path: output, every gradient, the layer's output and
KSVD term, tile remainders, masks, causal prefix means, data-dependent weights and bias; poisoned outputs; the
named fallback. Natively on a GPU, else in Triton's interpreter (tiny shapes: seconds)."""

from __future__ import annotations

import warnings

import pytest
import torch

import primaldual as pd
from primaldual.functional.primal import causal_prefix_mean, primal_scores_from_input
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
@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_inputs(dtype, causal):
    """bf16 / fp16 inputs against the float64 score path: within half-precision rounding (causal: the prologue's
    prefix means over three row tiles, rounded to the input dtype as the PyTorch path rounds them)."""
    torch.manual_seed(4)
    n = 150 if causal else 40
    x = torch.randn(2, n, 32, device=DEV).to(dtype).requires_grad_(True)
    wq = torch.randn(2 * 2 * 16, 32, device=DEV).to(dtype).requires_grad_(True)
    w = torch.randn(2, 2, 16, 5, device=DEV).to(dtype).requires_grad_(True)
    out, energies = ks.primal_scores_triton(x, wq, None, w, causal=causal, energies=True)
    ref, ref_energies = _reference(x.double(), wq.double(), None, w.double(), None, causal)
    assert out.dtype == dtype and rel_err(out, ref) < 3e-2 and rel_err(energies, ref_energies) < 3e-2
    g, ge = torch.randn_like(ref), torch.randn_like(ref_energies)
    got = torch.autograd.grad((out * g.to(dtype)).sum() + (energies * ge.float()).sum(), (x, wq, w))
    want = torch.autograd.grad((ref * g).sum() + (ref_energies * ge).sum(), (x, wq, w))
    for a, b in zip(got, want):
        assert a.dtype == dtype and rel_err(a, b) < 3e-2


def test_the_layer_follows_autocast():
    """Under bfloat16 autocast the kernel gets what autocast gives the score path's GEMMs (an operator has no
    autocast rule of its own): output and gradients within bfloat16 rounding of the layer without the kernel."""
    torch.manual_seed(7)
    ref = pd.build_attention("primal", 32, 2, causal=True, s=3, path="scores").to(DEV)
    fused = pd.build_attention("primal", 32, 2, causal=True, s=3, kernel="triton").to(DEV)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 40, 32, device=DEV)
    outs = []
    for layer in (ref, fused):
        with torch.autocast(DEV, dtype=torch.bfloat16):
            y = layer(x)
            term = pd.collect_aux_loss(layer)
        (y.float().square().sum() + term).backward()
        outs.append((y, [p.grad.clone() for p in layer.parameters()]))
    (y0, g0), (y1, g1) = outs
    assert y1.dtype == y0.dtype == torch.bfloat16 and rel_err(y1.float(), y0.float()) < 3e-2
    for a, b in zip(g1, g0):
        assert rel_err(a, b) < 5e-2


def test_what_the_kernel_cannot_take_is_named(monkeypatch):
    x = torch.empty(1, 1, 8, device=DEV).expand(1, 64 * ks.MAX_GRID + 1, 8)  # no memory behind it
    assert "launch grid's limit" in ks.triton_unavailable_reason(x)
    monkeypatch.setattr(ks, "_HAS_CUSTOM_OPS", False)
    assert "torch.library.custom_op" in ks.triton_unavailable_reason(torch.randn(1, 4, 8, device=DEV))


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


def _reference(x, wq, b, w, mask, causal):
    """Scores and energies ``(B, 2, H, s)`` from the PyTorch score path."""
    src = causal_prefix_mean(x, mask) if causal else x
    scores = primal_scores_from_input(src, wq, b, w)[0]  # (B, N, H, 2, s)
    m = torch.ones(x.shape[:2], device=x.device, dtype=scores.dtype) if mask is None else mask.to(scores.dtype)
    energies = torch.einsum("bn,bnhts->bths", m, scores.square())  # (B, 2, H, s)
    return scores, energies


def _padded(B, N, device):
    """Left padding on sample 0 (the first tokens have no real token before them), right padding on the last."""
    mask = torch.ones(B, N, dtype=torch.bool, device=device)
    mask[0, :7] = False
    mask[-1, N - 9 :] = False
    mask[-1, 3] = False  # and a hole
    return mask


@pytest.mark.parametrize(
    "B,N,C,H,P,S,dependent,bias,causal,masked",
    [
        (2, 150, 24, 2, 8, 5, False, True, True, False),  # three row tiles: the carry crosses two boundaries
        (2, 150, 24, 2, 8, 5, True, True, True, True),  # and with padding (counts carried too)
        (2, 37, 40, 3, 8, 3, True, False, True, True),  # one tile; C over one BLOCK_K step
        (2, 70, 24, 2, 12, 4, False, True, False, True),  # non-causal: the mask enters the energies only
        (1, 5, 16, 2, 8, 3, False, False, False, False),
    ],
)
def test_causal_prologue_and_energies_match_the_score_path(B, N, C, H, P, S, dependent, bias, causal, masked):
    """Scores and energies, and every gradient through both, against prefix means + score path + masked squares."""
    torch.manual_seed(5)
    x = torch.randn(B, N, C, device=DEV, requires_grad=True)
    wq = torch.randn(2 * H * P, C, device=DEV, requires_grad=True)
    b = torch.randn(2 * H * P, device=DEV, requires_grad=True) if bias else None
    w = torch.randn(*((B,) if dependent else ()), 2, H, P, S, device=DEV, requires_grad=True)
    mask = _padded(B, N, DEV) if masked else None
    out, energies = ks.primal_scores_triton(x, wq, b, w, mask=mask, causal=causal, energies=True)
    ref, ref_energies = _reference(x, wq, b, w, mask, causal)
    assert out.shape == ref.shape and energies.shape == ref_energies.shape == (B, 2, H, S)
    assert energies.dtype == torch.float32
    assert rel_err(out, ref) < TOL and rel_err(energies, ref_energies) < TOL
    if not causal:
        assert rel_err(ks.primal_scores_triton(x, wq, b, w, mask=mask), ref) < TOL  # scores alone: the same
    g, ge = torch.randn_like(ref), torch.randn_like(ref_energies)
    params = [x, wq, w] + ([b] if bias else [])
    got = torch.autograd.grad((out * g).sum() + (energies * ge).sum(), params)
    want = torch.autograd.grad((ref * g).sum() + (ref_energies * ge).sum(), params)
    for a, c in zip(got, want):
        assert rel_err(a, c) < TOL
    if masked and causal:  # a padded token is in no prefix mean: its input's gradient is zero
        assert got[0][~mask].abs().max() == 0


@pytest.mark.parametrize("causal,masked,dependent", [(False, False, False), (True, True, True)])
def test_double_backward_matches_the_score_path(causal, masked, dependent):
    """``create_graph=True`` through the kernel (a gradient penalty): the first gradients equal the score path's,
    and so does the gradient of a function of them, for every input, energies included."""
    torch.manual_seed(7)
    B, N, C, H, P, S = 2, 70, 24, 2, 8, 3
    x = torch.randn(B, N, C, device=DEV, requires_grad=True)
    wq = torch.randn(2 * H * P, C, device=DEV, requires_grad=True)
    b = torch.randn(2 * H * P, device=DEV, requires_grad=True)
    w = torch.randn(*((B,) if dependent else ()), 2, H, P, S, device=DEV, requires_grad=True)
    mask = _padded(B, N, DEV) if masked else None
    params = [x, wq, b, w]
    results = []
    for fused in (True, False):
        if fused:
            out, energies = ks.primal_scores_triton(x, wq, b, w, mask=mask, causal=causal, energies=True)
        else:
            out, energies = _reference(x, wq, b, w, mask, causal)
        loss = out.sin().sum() + energies.sqrt().sum()
        first = torch.autograd.grad(loss, [x, wq], create_graph=True)
        penalty = sum(g.square().sum() for g in first)
        results.append(([g.detach() for g in first], torch.autograd.grad(penalty, params)))
    (first, second), (ref_first, ref_second) = results
    for got, want in zip([*first, *second], [*ref_first, *ref_second]):
        assert torch.isfinite(got).all() and rel_err(got, want) < 10 * TOL


def test_a_gradient_penalty_through_the_layer():
    """PrimalAttention(kernel="triton"): a penalty on the input's gradient trains as the default layer's does (its
    data-dependent weights are a function of the input: each operand's gradient is still its own partial)."""
    torch.manual_seed(3)
    ref = pd.build_attention("primal", 16, 2, s=3, n=6, path="scores").to(DEV)
    fused = pd.build_attention("primal", 16, 2, s=3, n=6, kernel="triton").to(DEV)
    fused.load_state_dict(ref.state_dict())
    grads = []
    for layer in (ref, fused):
        x = torch.randn(2, 21, 16, device=DEV, generator=torch.Generator(DEV).manual_seed(0), requires_grad=True)
        (gx,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
        gx.square().sum().backward()
        grads.append([gx.detach(), x.grad, *(p.grad for p in layer.parameters() if p.grad is not None)])
    assert len(grads[0]) == len(grads[1]) > 2
    for a, c in zip(*grads):
        assert rel_err(a, c) < 10 * TOL


def test_the_mask_is_checked():
    x, wq, w = torch.randn(2, 9, 16, device=DEV), torch.randn(32, 16, device=DEV), torch.randn(2, 2, 8, 3, device=DEV)
    with pytest.raises(ValueError, match=r"mask: expected a bool tensor of shape \(2, 9\)"):
        ks.primal_scores_triton(x, wq, None, w, mask=torch.ones(2, 9, device=DEV))
    with pytest.raises(ValueError, match=r"mask: expected a bool tensor of shape \(2, 9\)"):
        ks.primal_scores_triton(x, wq, None, w, mask=torch.ones(2, 8, dtype=torch.bool, device=DEV))


@pytest.mark.parametrize("causal", [False, True])
def test_every_output_element_is_written(causal):
    torch.manual_seed(1)
    B, N, C, H, P, S = 2, 83, 16, 2, 8, 3
    x, wq, w = (
        torch.randn(B, N, C, device=DEV),
        torch.randn(2 * H * P, C, device=DEV),
        torch.randn(2, H, P, S, device=DEV),
    )
    mask = _padded(B, N, DEV)
    m = mask.float()
    tiles = -(-N // 64)
    scores = torch.full((B, N, H, 2, S), float("nan"), device=DEV)
    inv = torch.full((B, N, 2, H), float("nan"), device=DEV)
    shares = torch.full((B, tiles, 2, H, S), float("nan"), device=DEV)
    carry = ks._causal_carry(x, m) if causal else None
    ks._forward(x, wq, None, w, 1e-12, m, carry, True, out=(scores, inv, shares))
    assert torch.isfinite(scores).all() and torch.isfinite(inv).all() and torch.isfinite(shares).all()
    ref, ref_energies = _reference(x, wq, None, w, mask, causal)
    assert rel_err(scores, ref) < TOL and rel_err(shares.sum(1), ref_energies) < TOL
    src = causal_prefix_mean(x, mask) if causal else x
    norms = torch.linalg.vector_norm((src @ wq.T).view(B, N, 2, H, P), dim=-1)
    assert rel_err(inv, norms.clamp_min(1e-12).reciprocal()) < TOL  # left padding, causal: no token yet


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("reduction", ["global", "sample"])
def test_layer_with_the_kernel_equals_the_layer_without(causal, masked, reduction, monkeypatch):
    """Output, KSVD term (built from the kernel's energies) and every parameter's gradient of
    PrimalAttention(kernel="triton") against the default."""
    calls = []
    kernel = ks.primal_scores_triton
    monkeypatch.setattr(ks, "primal_scores_triton", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    torch.manual_seed(2)
    opts = {"causal": causal, "s": 3, "n": 6 if not causal else None, "ksvd_reduction": reduction}
    ref = pd.build_attention("primal", 16, 2, path="scores", **opts).to(DEV)
    fused = pd.build_attention("primal", 16, 2, kernel="triton", **opts)
    fused = fused.to(DEV)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 21, 16, device=DEV)
    mask = _padded(2, 21, DEV) if masked else None
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
    with torch.no_grad():  # no KSVD term recorded: the kernel runs without its energies
        assert rel_err(fused.eval()(x, mask), ref.eval()(x, mask)) < TOL
    assert calls == [1, 1]


def test_the_fallback_is_one_named_warning(monkeypatch):
    monkeypatch.setattr(ks, "triton_unavailable_reason", lambda x, dtype=None: "no GPU here (test)")
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
    assert "kernel='triton'" in repr(pd.build_attention("primal", 16, 2, kernel="triton"))


@pytest.mark.parametrize("causal", [False, True])
def test_the_kernel_inside_the_compiled_core(causal, monkeypatch):
    """kernel="triton" with compile=True: the kernel is one operator in the compiled graph (no fallback, no graph
    break), and output, KSVD term and gradients equal the eager layer's."""
    calls = []
    launch = ks._forward
    monkeypatch.setattr(ks, "_forward", lambda *a, **k: calls.append(1) or launch(*a, **k))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(6)
    opts = {"causal": causal, "s": 3, "n": 6 if not causal else None}
    ref = pd.build_attention("primal", 16, 2, path="scores", **opts).to(DEV)
    fused = pd.build_attention("primal", 16, 2, kernel="triton", compile=True, **opts).to(DEV)
    fused.load_state_dict(ref.state_dict())
    x, mask = torch.randn(2, 21, 16, device=DEV), _padded(2, 21, DEV)
    outs = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # neither a compile fallback nor a kernel fallback
        for layer in (ref, fused):
            y = layer(x, mask)
            term = pd.collect_aux_loss(layer)
            (y.square().sum() + term).backward()
            outs.append((y.detach(), term.detach(), [p.grad.clone() for p in layer.parameters()]))
    assert fused._compile_state == "ok" and calls  # the kernel ran, inside the compiled core
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    (y0, t0, g0), (y1, t1, g1) = outs
    assert rel_err(y1, y0) < TOL and rel_err(t1, t0) < 10 * TOL
    for a, b in zip(g1, g0):
        assert rel_err(a, b) < 10 * TOL


def test_the_kernel_is_refused_for_the_dtype_it_would_compute_in(monkeypatch):
    """Under bfloat16 autocast the kernel would compute in bfloat16: where that is refused (a GPU before sm_80), the
    layer falls back with its one warning, not an error, though its input is float32."""
    real = ks.triton_unavailable_reason
    monkeypatch.setattr(
        ks,
        "triton_unavailable_reason",
        lambda x, dtype=None: "no bfloat16 here (test)" if (dtype or x.dtype) == torch.bfloat16 else real(x, dtype),
    )
    torch.manual_seed(8)
    ref = pd.build_attention("primal", 16, 2, causal=True, s=3, path="scores").to(DEV)
    fused = pd.build_attention("primal", 16, 2, causal=True, s=3, kernel="triton").to(DEV)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 21, 16, device=DEV)
    assert fused(x).dtype == torch.float32  # float32, no autocast: the kernel runs
    with torch.autocast(DEV, dtype=torch.bfloat16):
        with pytest.warns(RuntimeWarning, match=r"no bfloat16 here \(test\); this layer uses its PyTorch score path"):
            y = fused(x)
        assert torch.equal(y, ref(x))


def test_the_operators_pass_torch_library_opcheck():
    """Schema, fake implementation, autograd registration and the dispatcher, as torch.library checks an operator."""
    torch.manual_seed(9)
    x = torch.randn(2, 70, 16, device=DEV, requires_grad=True)
    wq = torch.randn(32, 16, device=DEV, requires_grad=True)
    b = torch.randn(32, device=DEV, requires_grad=True)
    w = torch.randn(2, 2, 2, 8, 3, device=DEV, requires_grad=True)
    mask = _padded(2, 70, DEV).float()
    for causal, energy in ((False, False), (True, True)):
        torch.library.opcheck(ks.primal_scores_op, (x, wq, b, w, mask, causal, energy, 1e-12))
