"""The rotated-basis evaluation of the primal layer against the score path it replaces (float64, forward and
gradients), the basis it builds, rank-deficient and wide (s >= head width) weights, half precision and bad input."""

from __future__ import annotations

import inspect
from dataclasses import asdict

import pytest
import torch

from primaldual.functional.primal import ksvd_loss_from_energies, primal_scores_from_input
from primaldual.functional.primal_rotated import (
    DEFAULT_THRESHOLDS,
    RotatedThresholds,
    primal_output_rotated,
    rotated_basis,
    use_rotated,
)
from tests.conftest import rel_err


def _score_path(x, qk_w, qk_b, w, out_w, out_b, lam, mask):
    """Output and per-group energies through the explicit scores ``(B, N, H, 2, s)``."""
    B, N, _ = x.shape
    H, _, s = w.shape[-3:]
    scores, _ = primal_scores_from_input(x, qk_w, qk_b, w)
    out = torch.nn.functional.linear(scores.reshape(B, N, -1), out_w, out_b)
    m = torch.ones(B, N, dtype=x.dtype) if mask is None else mask.to(x.dtype)
    sq = scores.square() * lam.square()[None, None, :, None, :] * m[:, :, None, None, None]  # (B, N, H, 2, s)
    return out, sq.sum((1, 4)).transpose(1, 2).reshape(B, 2 * H)  # (B, H, 2) -> (B, 2H), t-major


def _inputs(B, N, H, p, s, data_dependent, bias, rank=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    C = H * p
    f64 = {"dtype": torch.float64}
    x = torch.randn(B, N, C, generator=g, **f64)
    x[0, 1] = 0.0  # a zero query / key row: the zero-norm guard
    qk_w = torch.randn(2 * C, C, generator=g, **f64)
    qk_b = torch.randn(2 * C, generator=g, **f64) if bias else None
    w = torch.randn(*((B,) if data_dependent else ()), 2, H, p, s, generator=g, **f64)
    if rank is not None:  # rank-deficient W: columns from a rank-`rank` space (rank 0: all zero)
        basis = torch.randn(*w.shape[:-1], max(rank, 1), generator=g, **f64)
        w = basis @ torch.randn(*w.shape[:-2], max(rank, 1), s, generator=g, **f64) * (rank > 0)
    out_w = torch.randn(C, H * 2 * s, generator=g, **f64)
    out_b = torch.randn(C, generator=g, **f64) if bias else None
    lam = torch.rand(H, s, generator=g, **f64)
    mask = torch.rand(B, N, generator=g) > 0.3
    return [x, qk_w, qk_b, w, out_w, out_b, lam, mask]


CASES = {
    "complement": (3, 17, 2, 8, 5, None),  # k = s = 5 < p = 8
    "wide": (2, 11, 2, 4, 7, None),  # s >= p: no complement
    "equal": (2, 9, 3, 4, 4, None),
    "rank1": (2, 13, 2, 6, 4, 1),
    "rank0": (2, 13, 2, 6, 4, 0),
}


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("data_dependent", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_equals_score_path_forward_and_gradients(case, data_dependent, bias, masked):
    B, N, H, p, s, rank = CASES[case]
    args = _inputs(B, N, H, p, s, data_dependent, bias, rank)
    if not masked:
        args[-1] = None
    for a in args[:-1]:
        if a is not None:
            a.requires_grad_()
    params = [a for a in args[:-1] if a is not None]
    out, energy = primal_output_rotated(*args)
    out_r, energy_r = _score_path(*args)
    assert rel_err(out, out_r) < 1e-12
    assert rel_err(energy, energy_r) < 1e-12
    g_out, g_e = torch.randn_like(out), torch.randn_like(energy)
    got = torch.autograd.grad((out * g_out).sum() + (energy * g_e).sum(), params)
    want = torch.autograd.grad((out_r * g_out).sum() + (energy_r * g_e).sum(), params)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-10


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("data_dependent", [True, False])
@pytest.mark.parametrize("part", ["output", "energy", "output_without_energy"])
def test_gradients_of_the_output_alone_and_of_the_energies_alone(part, data_dependent, masked):
    """Each backward branch on its own: only the output or only the energies reach the loss, or no energies at all."""
    B, N, H, p, s, rank = CASES["complement"]
    args = _inputs(B, N, H, p, s, data_dependent, True, rank, seed=3)
    if not masked:
        args[-1] = None
    for a in args[:-1]:
        a.requires_grad_()
    params = args[:-1]
    out, energy = primal_output_rotated(*args, with_energy=part != "output_without_energy")
    out_r, energy_r = _score_path(*args)
    if part == "energy":
        got, want = energy, energy_r
    else:
        got, want = out, out_r
        if part == "output_without_energy":
            assert energy is None
    weight = torch.randn_like(got)
    g_got = torch.autograd.grad((got * weight).sum(), params, allow_unused=True)
    g_want = torch.autograd.grad((want * weight).sum(), params, allow_unused=True)
    for param, a, b in zip(params, g_got, g_want):
        # a parameter the loss does not reach (lam for the output alone) may be None on either side
        a = torch.zeros_like(param) if a is None else a
        b = torch.zeros_like(param) if b is None else b
        assert rel_err(a, b) < 1e-10 or (a.abs().max() < 1e-12 and b.abs().max() < 1e-12)


@pytest.mark.parametrize("diagonalise", [True, False])
@pytest.mark.parametrize("case", ["complement", "wide", "rank1", "rank0"])
def test_basis_is_orthogonal_spans_w_and_diagonalises_the_energy(case, diagonalise):
    B, _, H, p, s, rank = CASES[case]
    _, _, _, w, _, _, lam, _ = _inputs(B, 4, H, p, s, True, True, rank)
    t = rotated_basis(w, lam if diagonalise else None)  # (B, 2, H, p, p)
    k = min(p, s)
    eye = torch.eye(p, dtype=t.dtype)
    assert (t.transpose(-1, -2) @ t - eye).abs().max() < 1e-12
    m = t.transpose(-1, -2) @ w  # (B, 2, H, p, s)
    assert torch.cat((m[..., k:, :].flatten(), m.new_zeros(1))).abs().max() <= 1e-12 * max(
        w.abs().max().item(), 1.0
    )  # range(W) in columns :k
    assert t.requires_grad is False
    if not diagonalise:  # without energies (lam None) the QR's basis is enough
        return
    a = (m[..., :k, :] * lam.square()[:, None, :]) @ m[..., :k, :].transpose(-1, -2)  # (B, 2, H, k, k)
    off = a - torch.diag_embed(torch.diagonal(a, dim1=-2, dim2=-1))
    assert off.abs().max() <= 1e-12 * max(a.abs().max().item(), 1.0)


def test_energies_give_the_ksvd_loss_of_the_scores():
    from primaldual.functional.primal import ksvd_loss_from_scores

    B, N, H, p, s = 3, 10, 2, 6, 4
    x, qk_w, qk_b, w, out_w, out_b, lam, mask = _inputs(B, N, H, p, s, False, True)
    w_e, w_r = w[0], w[1]
    scores, _ = primal_scores_from_input(x, qk_w, qk_b, w)
    _, energy = primal_output_rotated(x, qk_w, qk_b, w, out_w, out_b, lam, mask)
    for msk in (mask, None):
        _, energy = primal_output_rotated(x, qk_w, qk_b, w, out_w, out_b, lam, msk)
        for reduction in ("global", "sample"):
            want = ksvd_loss_from_scores(scores, w_e, w_r, lam, msk, reduction)
            got = ksvd_loss_from_energies(energy, w_e, w_r, msk, N, reduction)
            assert rel_err(got, want) < 1e-12
    with pytest.raises(ValueError, match="tokens"):
        ksvd_loss_from_energies(energy, w_e, w_r, None, None)
    with pytest.raises(ValueError, match="ksvd_reduction"):
        ksvd_loss_from_energies(energy, w_e, w_r, None, N, "mean")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_low_precision_runs_and_stays_close(dtype):
    B, N, H, p, s = 2, 12, 2, 8, 5
    args = _inputs(B, N, H, p, s, True, True)
    low = [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    out, energy = primal_output_rotated(*low)
    out_r, energy_r = _score_path(*args)
    assert out.dtype == dtype and energy.dtype == dtype
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    assert rel_err(out.double(), out_r) < tol
    assert rel_err(energy.double(), energy_r) < tol


def test_choice_by_length():
    t = DEFAULT_THRESHOLDS
    assert use_rotated(4, 4096, data_dependent=True, thresholds=t)
    assert not use_rotated(64, 29, data_dependent=True, thresholds=t)
    # compiled, from 2,560 tokens; eager from 2,048
    assert not use_rotated(4, 1024, data_dependent=True, compiled=True, thresholds=t)
    assert not use_rotated(4, 2048, data_dependent=True, compiled=True, thresholds=t)
    assert use_rotated(4, 2560, data_dependent=True, compiled=True, thresholds=t)
    assert not use_rotated(4, 1024, data_dependent=True, compiled=False, thresholds=t)
    assert use_rotated(4, 2048, data_dependent=True, compiled=False, thresholds=t)
    assert use_rotated(4, 2048, data_dependent=True, thresholds=t)  # eager here
    # shared weights (causal) by rows: compiled from 16,384, eager from 8,192
    assert use_rotated(4, 4096, data_dependent=False, compiled=True, thresholds=t)
    assert not use_rotated(4, 2048, data_dependent=False, compiled=True, thresholds=t)
    assert use_rotated(4, 2048, data_dependent=False, compiled=False, thresholds=t)
    assert not use_rotated(16, 128, data_dependent=False, thresholds=t)
    # without a backward to follow: eager never, compiled from 16,384 tokens per sample, shared weights never
    assert not use_rotated(4, 65536, data_dependent=True, compiled=False, backward=False, thresholds=t)
    assert not use_rotated(4, 8192, data_dependent=True, compiled=True, backward=False, thresholds=t)
    assert use_rotated(4, 16384, data_dependent=True, compiled=True, backward=False, thresholds=t)
    assert not use_rotated(16, 4096, data_dependent=False, compiled=True, backward=False, thresholds=t)
    # CPU only: on CUDA the eigendecomposition synchronises with the host, which a layer forward must not do
    assert not use_rotated(4, 4096, data_dependent=True, device_type="cuda", thresholds=t)
    assert not use_rotated(4, 4096, data_dependent=False, device_type="cuda", thresholds=t)


def test_the_defaults_are_the_measured_crossovers():
    assert asdict(DEFAULT_THRESHOLDS) == {
        "min_tokens_compiled": 2560,
        "min_tokens_eager": 2048,
        "min_rows_shared_compiled": 16384,
        "min_rows_shared_eager": 8192,
        "min_tokens_forward_compiled": 16384,
    }
    assert inspect.signature(use_rotated).parameters["thresholds"].default is DEFAULT_THRESHOLDS


def test_choice_by_custom_thresholds():
    # each field moves only its own case
    t = RotatedThresholds(
        min_tokens_compiled=100,
        min_tokens_eager=200,
        min_rows_shared_compiled=300,
        min_rows_shared_eager=400,
        min_tokens_forward_compiled=500,
    )
    for compiled, tokens in ((True, 100), (False, 200)):
        assert not use_rotated(1, tokens - 1, data_dependent=True, compiled=compiled, thresholds=t)
        assert use_rotated(1, tokens, data_dependent=True, compiled=compiled, thresholds=t)
    for compiled, rows in ((True, 300), (False, 400)):
        assert not use_rotated(2, rows // 2 - 1, data_dependent=False, compiled=compiled, thresholds=t)
        assert use_rotated(2, rows // 2, data_dependent=False, compiled=compiled, thresholds=t)
    assert not use_rotated(1, 499, data_dependent=True, compiled=True, backward=False, thresholds=t)
    assert use_rotated(1, 500, data_dependent=True, compiled=True, backward=False, thresholds=t)
    assert not use_rotated(1, 10**6, data_dependent=True, compiled=False, backward=False, thresholds=t)
    assert not use_rotated(1, 10**6, data_dependent=True, device_type="cuda", thresholds=t)


def test_bad_shapes_are_named():
    x, qk_w, qk_b, w, out_w, out_b, lam, mask = _inputs(2, 5, 2, 4, 3, True, True)
    with pytest.raises(ValueError, match="out_weight must have shape"):
        primal_output_rotated(x, qk_w, qk_b, w, out_w[:, :-1], out_b, lam, mask)
    with pytest.raises(ValueError, match="lam must have shape"):
        primal_output_rotated(x, qk_w, qk_b, w, out_w, out_b, lam.T, mask)
    with pytest.raises(ValueError, match="w must have shape"):
        primal_output_rotated(x, qk_w, qk_b, w[:1], out_w, out_b, lam, mask)
    with pytest.raises(ValueError, match=r"x must be \(B, N, C\)"):
        primal_output_rotated(x[0], qk_w, qk_b, w, out_w, out_b, lam, mask)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_give_non_finite_outputs_not_a_solver_error(bad):
    # a diverged run (NaN / Inf weights or activations) must surface as NaN / Inf outputs, as on the score paths,
    # not as LAPACK's "failed to converge" from the eigendecomposition; the other samples stay finite
    torch.manual_seed(0)
    B, N, C, H, p, s = 3, 16, 8, 2, 4, 3
    x = torch.randn(B, N, C)
    w = torch.randn(B, 2, H, p, s)
    w[1, 0, 1, 2, 0] = bad
    t = rotated_basis(w, torch.rand(H, s))
    assert torch.isfinite(t).all()
    out, energy = primal_output_rotated(
        x, torch.randn(2 * H * p, C), torch.randn(2 * H * p), w, torch.randn(C, H * 2 * s), None, torch.rand(H, s)
    )
    assert not torch.isfinite(out[1]).all() and not torch.isfinite(energy[1]).all()
    assert torch.isfinite(out[[0, 2]]).all() and torch.isfinite(energy[[0, 2]]).all()
    lam = torch.rand(H, s)
    lam[0, 1] = bad
    t = rotated_basis(torch.randn(B, 2, H, p, s), lam)  # a non-finite Lambda reaches the energy matrix only
    assert torch.isfinite(t).all()


def test_without_energy_the_output_is_the_same_and_no_energy_is_returned():
    torch.manual_seed(0)
    B, N, C, H, p, s = 2, 9, 8, 2, 4, 3
    args = (torch.randn(B, N, C), torch.randn(2 * H * p, C), torch.randn(2 * H * p), torch.randn(B, 2, H, p, s))
    rest = (torch.randn(C, H * 2 * s), torch.randn(C), torch.rand(H, s))
    out, energy = primal_output_rotated(*args, *rest)
    out2, none = primal_output_rotated(*args, *rest, with_energy=False)
    assert none is None and energy.shape == (B, 2 * H)
    # without energies the basis is not diagonalised (no eigendecomposition): the same output up to rounding
    torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-5)
