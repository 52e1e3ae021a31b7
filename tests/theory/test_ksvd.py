"""KSVD theory: primal scores equal dual scores at the SVD solution, J = 0 there (both Lambda conventions)."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.functional.primal import cosine_feature_map
from primaldual.theory.ksvd import objective_code, objective_paper, stationary_point
from tests.conftest import rel_err

N, DIM, S = 17, 8, 3


def _layer_and_features():
    torch.manual_seed(3)
    layer = pd.build_attention("primal", DIM, 1, s=S, data_dependent=False, dtype=torch.float64)
    x = torch.randn(1, N, DIM, dtype=torch.float64)
    q, k = layer.qk(x)[0].chunk(2, -1)  # (N, p) each, one head
    return layer, x, cosine_feature_map(q).detach(), cosine_feature_map(k).detach()


def test_primal_scores_equal_dual_scores():
    _, _, fq, fk = _layer_and_features()
    sol = stationary_point(fq, fk, S)
    assert torch.allclose(sol.kernel, fq @ fk.T) and not torch.allclose(sol.kernel, sol.kernel.T)
    e, r = fq @ sol.w_e, fk @ sol.w_r
    assert rel_err(e, sol.kernel @ sol.h_r) < 1e-12  # e = K H_r
    assert rel_err(e, sol.h_e * sol.sigma) < 1e-12  # = H_e Sigma
    assert rel_err(r, sol.kernel.T @ sol.h_e) < 1e-12  # r = K^T H_e
    assert rel_err(r, sol.h_r * sol.sigma) < 1e-12  # = H_r Sigma


def test_objective_zero_and_stationary_at_svd_solution():
    _, _, fq, fk = _layer_and_features()
    sol = stationary_point(fq, fk, S)
    w_e = sol.w_e.clone().requires_grad_(True)
    w_r = sol.w_r.clone().requires_grad_(True)
    j = objective_paper(fq @ w_e, fk @ w_r, w_e, w_r, sol.lam_paper)  # Lambda = Sigma^{-1}
    scale = float(sol.sigma.sum())  # each of the three terms equals Tr(Sigma)
    assert abs(float(j.detach())) < 1e-12 * scale
    g_e, g_r = torch.autograd.grad(j, (w_e, w_r))
    assert g_e.abs().max() < 1e-12 * scale and g_r.abs().max() < 1e-12 * scale  # a stationary point
    # the layer's (code) convention: Lambda_c = (N Sigma^{-1})^{1/2}, means instead of sums
    jc = objective_code(fq @ sol.w_e, fk @ sol.w_r, sol.w_e, sol.w_r, sol.lam_code)
    assert abs(float(jc)) < 1e-12 * scale
    # and with the paper's Lambda plugged into the code convention it is NOT zero (the conventions differ)
    assert abs(float(objective_code(fq @ sol.w_e, fk @ sol.w_r, sol.w_e, sol.w_r, sol.lam_paper))) > 1e-3


def test_code_objective_is_paper_objective_rescaled():
    torch.manual_seed(0)
    e, r = torch.randn(2, N, S, dtype=torch.float64)
    w_e, w_r = torch.randn(2, 5, S, dtype=torch.float64)
    lam_c = torch.rand(S, dtype=torch.float64)
    assert rel_err(objective_code(e, r, w_e, w_r, lam_c), objective_paper(e, r, w_e, w_r, lam_c**2 / N)) < 1e-12


def test_random_point_is_not_stationary():
    _, _, fq, fk = _layer_and_features()
    torch.manual_seed(1)
    w_e, w_r = torch.randn(2, DIM, S, dtype=torch.float64)
    lam = torch.rand(S, dtype=torch.float64)
    assert abs(float(objective_paper(fq @ w_e, fk @ w_r, w_e, w_r, lam))) > 1e-3
    assert abs(float(objective_code(fq @ w_e, fk @ w_r, w_e, w_r, lam))) > 1e-3


def test_layer_ksvd_term_vanishes_at_svd_solution():
    """Load the SVD solution into a primal layer: its scores are the dual ones and its KSVD term is 0."""
    layer, x, fq, fk = _layer_and_features()
    sol = stationary_point(fq, fk, S)
    with torch.no_grad():
        layer.w_e.copy_(sol.w_e[None])
        layer.w_r.copy_(sol.w_r[None])
        layer.lam.copy_(sol.lam_code[None])
    layer(x)
    assert float(layer.pop_aux_losses()[0]) < 1e-20 * float(sol.sigma.sum()) ** 2
    with torch.no_grad():
        layer.lam.mul_(1.5)
    layer(x)
    assert float(layer.pop_aux_losses()[0]) > 1e-3


def test_rank_checked():
    _, _, fq, fk = _layer_and_features()
    with pytest.raises(ValueError, match="s must be in"):
        stationary_point(fq, fk, DIM + 1)
