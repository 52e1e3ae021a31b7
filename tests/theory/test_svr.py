"""The SVR framework's derivation as tests: the QP solutions agree, and attention is the support vector expansion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import primaldual as pd
from primaldual.functional import linear_attention, softmax_attention, sparse_attention, sparse_pattern
from primaldual.theory.svr import (
    dual_objective,
    elu_features,
    exp_kernel,
    kkt_violation,
    normalised_gram,
    primal_objective,
    solve_svr_dual,
    solve_svr_primal,
    support_vector_expansion,
)
from tests.conftest import rel_err

N, D, DV = 11, 3, 2


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = torch.randn(N, DV, generator=g, dtype=torch.float64)
    return keys, y


# ---- the QP: dual and primal agree ------------------------------------------------------------------------


@pytest.mark.parametrize("C,eps", [(1.0, 0.1), (20.0, 0.05), (1e4, 0.01), (0.05, 0.3)])
def test_dual_and_primal_agree(C, eps):
    pytest.importorskip("clarabel")
    keys, y = _data()
    phi = elu_features(keys)
    h = phi @ phi.sum(0)  # linear attention's normaliser at each key
    psi = (phi / h[:, None]).numpy()  # normalised features psi(k_j) = Phi(k_j) / h(k_j)
    gram = psi @ psi.T
    dual = solve_svr_dual(gram, y.numpy(), C=C, epsilon=eps)
    primal = solve_svr_primal(psi, y.numpy(), C=C, epsilon=eps)
    w_from_dual = dual.coef.T @ psi  # w_d = sum_j beta_j(d) psi(k_j)
    assert np.abs(w_from_dual - primal.w).max() <= 1e-6 * np.abs(primal.w).max()
    assert kkt_violation(dual, gram, y.numpy(), C=C, epsilon=eps) < 1e-6
    # duality gap: primal objective at (w(beta), b) minus the dual objective
    fitted = gram @ dual.coef + dual.b
    p_at_dual = primal_objective(fitted, np.einsum("jd,jl,ld->d", dual.coef, gram, dual.coef), y.numpy(), C, eps)
    scale = np.abs(primal.objective).max()
    assert np.abs(p_at_dual - dual.objective).max() < 1e-7 * scale
    assert np.abs(primal.objective - dual.objective).max() < 1e-7 * scale
    # b is unique when some multiplier is strictly inside (0, C); it must then match the primal's
    free = ((dual.alpha > 1e-6 * C) & (dual.alpha < (1 - 1e-6) * C)) | (
        (dual.alpha_star > 1e-6 * C) & (dual.alpha_star < (1 - 1e-6) * C)
    )
    for d in range(DV):
        if free[:, d].any():
            assert abs(dual.b[d] - primal.b[d]) < 1e-6 * max(1.0, abs(primal.b[d]))


def test_dual_with_exponential_kernel_is_optimal():
    pytest.importorskip("clarabel")
    keys, y = _data(1)
    gram, _ = normalised_gram(exp_kernel, keys)
    C, eps = 50.0, 0.05
    sol = solve_svr_dual(gram.numpy(), y.numpy(), C=C, epsilon=eps)
    assert kkt_violation(sol, gram.numpy(), y.numpy(), C=C, epsilon=eps) < 1e-6
    coef = sol.coef
    quad = np.einsum("jd,jl,ld->d", coef, gram.numpy(), coef)
    p = primal_objective(gram.numpy() @ coef + sol.b, quad, y.numpy(), C, eps)
    assert np.abs(p - dual_objective(coef, sol.alpha, sol.alpha_star, gram.numpy(), y.numpy(), eps)).max() < 1e-8


def test_dual_solution_gives_the_attention_form():
    """The SVR fitted by the QP predicts with softmax attention: values are the rescaled dual coefficients."""
    pytest.importorskip("clarabel")
    keys, y = _data(2)
    gram, h = normalised_gram(exp_kernel, keys)
    sol = solve_svr_dual(gram.numpy(), y.numpy(), C=10.0, epsilon=0.05)
    coef = torch.from_numpy(sol.coef)
    x = torch.randn(7, D, dtype=torch.float64)  # test points (queries)
    # the SVR predictor: f(x) = w.psi(x) + b = sum_j beta_j k(x, k_j) / (h(x) h(k_j)) + b
    h_x = exp_kernel(x, keys).sum(-1)
    f = (exp_kernel(x, keys) / (h_x[:, None] * h[None, :])) @ coef + torch.from_numpy(sol.b)
    v = coef / h[:, None]  # v_j = beta_j / h(k_j)
    att, _ = softmax_attention(x[None, None], keys[None, None], v[None, None])
    assert rel_err(att[0, 0] + torch.from_numpy(sol.b), f) < 1e-12
    assert kkt_violation(sol, gram.numpy(), y.numpy(), C=10.0, epsilon=0.05) < 1e-6


# ---- the four derivation checks: the expansion equals the registered attentions --------------------------


def test_expansion_with_exponential_kernel_is_softmax_attention():
    q, k, v = (torch.randn(1, 1, 13, 5, dtype=torch.float64) for _ in range(3))
    f = support_vector_expansion(q[0, 0], k[0, 0], v[0, 0], kernel=exp_kernel, normaliser="sum")
    att, _ = softmax_attention(q, k, v)
    assert rel_err(f, att[0, 0]) < 1e-12


def test_expansion_with_elu_features_is_linear_attention():
    q, k, v = (torch.randn(1, 1, 13, 5, dtype=torch.float64) for _ in range(3))

    def kern(x, y):
        return elu_features(x) @ elu_features(y).T

    f = support_vector_expansion(q[0, 0], k[0, 0], v[0, 0], kernel=kern, normaliser="sum")
    att, _ = linear_attention(q, k, v, eps=0.0)
    assert rel_err(f, att[0, 0]) < 1e-12


@pytest.mark.parametrize("window,stride,num_global,causal", [(2, 0, 0, False), (1, 4, 2, False), (3, 5, 0, True)])
def test_restricting_the_training_set_is_sparse_attention(window, stride, num_global, causal):
    n = 17
    q, k, v = (torch.randn(1, 1, n, 5, dtype=torch.float64) for _ in range(3))
    allowed = sparse_pattern(n, window, stride, num_global, causal)  # M_i: the training set of query i
    f = support_vector_expansion(q[0, 0], k[0, 0], v[0, 0], kernel=exp_kernel, allowed=allowed)
    att, _ = sparse_attention(q, k, v, window=window, stride=stride, num_global=num_global, causal=causal)
    assert rel_err(f, att[0, 0]) < 1e-12


def test_one_svr_per_head_is_multihead_attention():
    dim, heads, n = 12, 3, 9
    layer = pd.build_attention("softmax", dim, heads, dtype=torch.float64)
    x = torch.randn(1, n, dim, dtype=torch.float64)
    q, k, v = layer.qkv(x).reshape(1, n, 3, heads, dim // heads).permute(2, 0, 3, 1, 4).unbind(0)  # (1, H, N, D)
    per_head = [support_vector_expansion(q[0, h], k[0, h], v[0, h]) for h in range(heads)]  # H SVRs
    out = layer.proj(torch.cat(per_head, -1))  # concatenate and mix with W_O
    assert rel_err(out, layer(x)[0]) < 1e-12


def test_bad_inputs():
    pytest.importorskip("clarabel")
    with pytest.raises(ValueError, match="gram"):
        solve_svr_dual(np.eye(3), np.zeros(4))
    with pytest.raises(ValueError, match="C must be"):
        solve_svr_dual(np.eye(3), np.zeros(3), C=0.0)
    with pytest.raises(ValueError, match="features"):
        solve_svr_primal(np.eye(3), np.zeros(4))
    with pytest.raises(ValueError, match="normaliser"):
        support_vector_expansion(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2), normaliser="max")
