"""Epsilon-SVR, its dual, and the support vector expansion that attention is (Nguyen et al., ICLR 2023).

The SVR framework's model is ``f(x) = W Phi(x) / h(x) + b``: a feature map ``Phi``, a normaliser ``h`` and one
epsilon-insensitive regression per output coordinate d, trained on the keys ``k_j`` with targets ``y_j``. With the
normalised features ``psi(x) = Phi(x) / h(x)`` the primal QP for coordinate d is

    min_{w, b, xi, xi*}  1/2 ||w||^2 + C sum_j (xi_j + xi*_j)
    s.t.  y_j - w.psi(k_j) - b <= eps + xi_j,   w.psi(k_j) + b - y_j <= eps + xi*_j,   xi, xi* >= 0

and its dual, with ``beta = alpha - alpha*`` and the Gram matrix ``G_jl = psi(k_j).psi(k_l)``,

    max_{alpha, alpha* in [0, C]^N}  -1/2 beta^T G beta - eps sum_j (alpha_j + alpha*_j) + y^T beta,   sum_j beta_j = 0

with ``w = sum_j beta_j psi(k_j)``. Substituting w gives the support vector expansion

    f(x) = sum_j [Phi(x).Phi(k_j) / h(x)] v_j + b,    v_j = beta_j / h(k_j),

which is attention: keys are training inputs, values rescaled dual coefficients, the query a test point.

:func:`solve_svr_dual` and :func:`solve_svr_primal` solve the two QPs independently with Clarabel, a
maintained interior-point solver for convex QPs (it accepts the singular Hessians both problems have, which
active-set solvers such as quadprog do not, and reaches 1e-10-level optimality on small problems, which
SciPy's SLSQP did not on badly scaled normalised features). The tests check optimality with the KKT conditions
and the duality gap rather than trusting the solver. Clarabel and SciPy are optional (the ``theory`` extra);
everything else here is torch / numpy. :func:`support_vector_expansion` evaluates the expansion literally, one kernel value per (query, training point) pair, so it can be compared
with the fast attention kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "SVRSolution",
    "elu_features",
    "exp_kernel",
    "kkt_violation",
    "normalised_gram",
    "primal_objective",
    "dual_objective",
    "solve_svr_dual",
    "solve_svr_primal",
    "support_vector_expansion",
]


@dataclass
class SVRSolution:
    """An epsilon-SVR solution for ``Dv`` output coordinates trained on N points.

    Attributes:
        coef: ``(N, Dv)`` dual coefficients ``beta = alpha - alpha*`` (from the dual) or None (primal).
        alpha, alpha_star: ``(N, Dv)`` multipliers (dual) or None.
        w: ``(Dv, F)`` primal weights (primal, or recovered from the dual when features were given) or None.
        b: ``(Dv,)`` biases.
        objective: ``(Dv,)`` the solver's objective value (primal: minimum; dual: maximum).
    """

    b: np.ndarray
    objective: np.ndarray
    coef: np.ndarray | None = None
    alpha: np.ndarray | None = None
    alpha_star: np.ndarray | None = None
    w: np.ndarray | None = None


def _clarabel():
    try:
        import clarabel
        from scipy import sparse
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the SVR QP solvers need Clarabel and SciPy; install them with `pip install primaldual[theory]`"
        ) from err
    return clarabel, sparse


def _as_2d(y: np.ndarray) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2:
        raise ValueError(f"targets y must have shape (N,) or (N, Dv), got {y.shape}")
    return y


def _check_svr(n: int, C: float, epsilon: float) -> None:
    if n < 2:
        raise ValueError(f"an SVR needs at least 2 training points, got {n}")
    if not C > 0:
        raise ValueError(f"C must be > 0 (the box of the dual), got {C!r}")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0 (the insensitive tube), got {epsilon!r}")


# ----------------------------------------------------------------------------------------------------------
# Kernels, features and normalisers
# ----------------------------------------------------------------------------------------------------------


def exp_kernel(x: Tensor, y: Tensor) -> Tensor:
    """The exponential kernel of softmax attention: ``(M, D), (N, D) -> (M, N)``, ``exp(x.y / sqrt(D))``."""
    return torch.exp(x @ y.transpose(-2, -1) / math.sqrt(x.shape[-1]))


def elu_features(x: Tensor) -> Tensor:
    """The finite feature map of linear attention: ``elu(x) + 1``, ``(..., D) -> (..., D)``."""
    return F.elu(x) + 1.0


def normalised_gram(kernel: Callable[[Tensor, Tensor], Tensor], keys: Tensor) -> tuple[Tensor, Tensor]:
    """The SVR's Gram matrix on normalised features and the normaliser at the keys.

    With ``h(x) = sum_l k(x, k_l)`` (the attention normaliser), ``G_jl = k(k_j, k_l) / (h(k_j) h(k_l))``.

    Args:
        kernel: ``(M, D), (N, D) -> (M, N)``.
        keys: ``(N, D)``.

    Returns:
        ``(G (N, N), h (N,))``.
    """
    kk = kernel(keys, keys)  # (N, N)
    h = kk.sum(-1)  # (N,)
    return kk / (h[:, None] * h[None, :]), h


# ----------------------------------------------------------------------------------------------------------
# The dual and the primal QP
# ----------------------------------------------------------------------------------------------------------


def dual_objective(coef: np.ndarray, alpha: np.ndarray, alpha_star: np.ndarray, gram, y, epsilon: float):
    """Dual objective (to be maximised) per output coordinate: ``(Dv,)``."""
    y = _as_2d(y)
    g = np.asarray(gram, dtype=np.float64)
    quad = np.einsum("jd,jl,ld->d", coef, g, coef)
    return -0.5 * quad - epsilon * (alpha + alpha_star).sum(0) + (y * coef).sum(0)


def primal_objective(fitted: np.ndarray, w_sq_norm: np.ndarray, y, C: float, epsilon: float) -> np.ndarray:
    """Primal objective with optimal slacks: ``1/2 ||w||^2 + C sum_j max(0, |y_j - f(k_j)| - eps)``, ``(Dv,)``.

    Args:
        fitted: ``(N, Dv)`` the predictions ``w.psi(k_j) + b`` at the training points.
        w_sq_norm: ``(Dv,)`` ``||w||^2`` (``beta^T G beta`` for a dual solution).
    """
    y = _as_2d(y)
    slack = np.maximum(0.0, np.abs(y - fitted) - epsilon)
    return 0.5 * np.asarray(w_sq_norm) + C * slack.sum(0)


def _qp(P: np.ndarray, q: np.ndarray, A_eq, b_eq, A_in, b_in, tol: float) -> tuple[np.ndarray, np.ndarray, float]:
    """``min 1/2 x^T P x + q^T x  s.t.  A_eq x = b_eq, A_in x <= b_in`` with Clarabel.

    Returns ``(x, equality multipliers, objective)``.
    """
    clarabel, sparse = _clarabel()
    A_parts, b_parts, cones = [], [], []
    if A_eq is not None:
        A_parts.append(A_eq)
        b_parts.append(b_eq)
        cones.append(clarabel.ZeroConeT(A_eq.shape[0]))
    A_parts.append(A_in)
    b_parts.append(b_in)
    cones.append(clarabel.NonnegativeConeT(A_in.shape[0]))
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = settings.tol_ktratio = tol
    settings.max_iter = 500
    solver = clarabel.DefaultSolver(
        sparse.triu(sparse.csc_matrix(P)).tocsc(),
        q,
        sparse.csc_matrix(np.vstack(A_parts)),
        np.concatenate(b_parts),
        cones,
        settings,
    )
    sol = solver.solve()
    if str(sol.status) not in ("Solved", "SolverStatus.Solved"):
        raise RuntimeError(f"Clarabel did not solve the SVR QP: status {sol.status}")
    n_eq = 0 if A_eq is None else A_eq.shape[0]
    return np.asarray(sol.x), np.asarray(sol.z)[:n_eq], float(sol.obj_val)


def solve_svr_dual(gram, y, *, C: float = 1.0, epsilon: float = 0.1, tol: float = 1e-12) -> SVRSolution:
    """Solve the epsilon-SVR dual QP for each output coordinate.

    Args:
        gram: ``(N, N)`` positive semi-definite Gram matrix of the (normalised) features.
        y: ``(N,)`` or ``(N, Dv)`` targets.
        C: box constraint (slack penalty). epsilon: tube half-width.
        tol: the interior-point solver's gap and feasibility tolerances.

    Returns:
        :class:`SVRSolution` with ``alpha``, ``alpha_star``, ``coef`` ``(N, Dv)``, the bias ``b`` (the multiplier
        of ``sum_j beta_j = 0``) and the dual maximum.

    Raises:
        RuntimeError: if the solver does not reach an optimum.
    """
    g = np.asarray(gram, dtype=np.float64)
    y = _as_2d(y)
    n, dv = y.shape
    _check_svr(n, C, epsilon)
    if g.shape != (n, n):
        raise ValueError(f"gram must have shape (N, N) = ({n}, {n}) to match y, got {g.shape}")
    # minimise the negated dual over z = [alpha, alpha*]: P = [[G, -G], [-G, G]], box via two inequalities
    P = np.block([[g, -g], [-g, g]])
    A_eq = np.r_[np.ones(n), -np.ones(n)][None, :]  # (1, 2N): sum(alpha - alpha*) = 0
    A_in = np.vstack([-np.eye(2 * n), np.eye(2 * n)])  # (4N, 2N): -z <= 0, z <= C
    b_in = np.r_[np.zeros(2 * n), np.full(2 * n, float(C))]
    zs, bs = [], []
    for d in range(dv):
        q = np.r_[epsilon - y[:, d], epsilon + y[:, d]]
        z, mult, _ = _qp(P, q, A_eq, np.zeros(1), A_in, b_in, tol)
        zs.append(np.clip(z, 0.0, C))
        # stationarity in alpha_j: (G beta)_j + eps - y_j + nu - ... = 0, so the equality multiplier nu is b
        bs.append(float(mult[0]))
    z = np.stack(zs, 1)  # (2N, Dv)
    alpha, alpha_star = z[:n], z[n:]
    coef = alpha - alpha_star
    return SVRSolution(
        b=np.array(bs),
        objective=dual_objective(coef, alpha, alpha_star, g, y, epsilon),
        coef=coef,
        alpha=alpha,
        alpha_star=alpha_star,
    )


def solve_svr_primal(features, y, *, C: float = 1.0, epsilon: float = 0.1, tol: float = 1e-12) -> SVRSolution:
    """Solve the epsilon-SVR primal QP over ``(w, b, xi, xi*)`` for each output coordinate.

    Args:
        features: ``(N, F)`` the normalised features ``psi(k_j)`` of the training points.
        y: ``(N,)`` or ``(N, Dv)`` targets.
        C, epsilon, tol: as :func:`solve_svr_dual`.

    Returns:
        :class:`SVRSolution` with ``w`` ``(Dv, F)``, ``b`` and the primal minimum.
    """
    p = np.asarray(features, dtype=np.float64)
    y = _as_2d(y)
    n, dv = y.shape
    _check_svr(n, C, epsilon)
    if p.ndim != 2 or p.shape[0] != n:
        raise ValueError(f"features must have shape (N, F) with N = {n}, got {p.shape}")
    nf = p.shape[1]
    nv = nf + 1 + 2 * n  # x = [w, b, xi, xi*]
    P = np.zeros((nv, nv))
    P[:nf, :nf] = np.eye(nf)
    q = np.r_[np.zeros(nf + 1), np.full(2 * n, float(C))]
    eye, zer, one = np.eye(n), np.zeros((n, n)), np.ones((n, 1))
    slack_pos = np.hstack([np.zeros((2 * n, nf + 1)), -np.eye(2 * n)])  # -xi <= 0, -xi* <= 0
    #   y_j - w.psi_j - b - xi_j <= eps   and   w.psi_j + b - y_j - xi*_j <= eps
    A_in = np.vstack([np.block([[-p, -one, -eye, zer], [p, one, zer, -eye]]), slack_pos])  # (4N, nv)
    ws, bs, objs = [], [], []
    for d in range(dv):
        b_in = np.r_[epsilon - y[:, d], epsilon + y[:, d], np.zeros(2 * n)]
        x, _, obj = _qp(P, q, None, None, A_in, b_in, tol)
        ws.append(x[:nf])
        bs.append(x[nf])
        objs.append(obj)
    return SVRSolution(b=np.array(bs), objective=np.array(objs), w=np.stack(ws))


def kkt_violation(sol: SVRSolution, gram, y, *, C: float, epsilon: float, tol: float = 1e-6) -> float:
    """Largest violation of the dual solution's KKT conditions (0 at an exact optimum).

    With residuals ``r_j = y_j - f(k_j)``: ``alpha_j > 0 => r_j >= eps``, ``alpha_j < C => r_j <= eps``,
    ``alpha*_j > 0 => r_j <= -eps``, ``alpha*_j < C => r_j >= -eps``; plus the box, ``sum beta = 0`` and
    ``alpha_j alpha*_j = 0``. A multiplier within ``tol * C`` of a bound counts as at the bound.
    """
    if sol.alpha is None or sol.alpha_star is None or sol.coef is None:
        raise ValueError("kkt_violation needs a dual solution (alpha, alpha_star, coef)")
    g = np.asarray(gram, dtype=np.float64)
    y = _as_2d(y)
    a, a_s = sol.alpha, sol.alpha_star
    r = y - (g @ sol.coef + sol.b[None, :])  # (N, Dv)
    lo, hi = tol * C, C - tol * C
    v = [
        np.abs(sol.coef.sum(0)).max(),
        np.maximum(0, -a).max(),
        np.maximum(0, a - C).max(),
        np.maximum(0, -a_s).max(),
        np.maximum(0, a_s - C).max(),
        (a * a_s).max() / C,
        np.where(a > lo, np.maximum(0, epsilon - r), 0).max(),
        np.where(a < hi, np.maximum(0, r - epsilon), 0).max(),
        np.where(a_s > lo, np.maximum(0, r + epsilon), 0).max(),
        np.where(a_s < hi, np.maximum(0, -epsilon - r), 0).max(),
    ]
    return float(max(v))


# ----------------------------------------------------------------------------------------------------------
# The support vector expansion
# ----------------------------------------------------------------------------------------------------------


def support_vector_expansion(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    kernel: Callable[[Tensor, Tensor], Tensor] = exp_kernel,
    normaliser: str | Callable[[Tensor], Tensor] = "sum",
    allowed: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """``f(x_i) = sum_{j in M_i} k(x_i, k_j) v_j / h(x_i) + b``, written out literally.

    Args:
        queries: ``(M, D)`` test points x_i. keys: ``(N, D)`` training inputs. values: ``(N, Dv)`` the ``v_j``.
        kernel: ``(M, D), (N, D) -> (M, N)``, e.g. :func:`exp_kernel` or ``lambda x, y: phi(x) @ phi(y).T``.
        normaliser: ``"sum"`` (``h(x_i) = sum_{j in M_i} k(x_i, k_j)``, attention's normaliser), ``"none"``
            (h = 1) or a callable ``(M, D) -> (M,)``.
        allowed: ``(M, N)`` bool, the training set ``M_i`` of each query (None: all keys).
        bias: ``(Dv,)`` b.

    Returns:
        ``(M, Dv)``.
    """
    kv = kernel(queries, keys)  # (M, N)
    if allowed is not None:
        kv = kv * allowed.to(kv.dtype)
    if normaliser == "sum":
        h = kv.sum(-1)
    elif normaliser == "none":
        h = torch.ones_like(kv[:, 0])
    elif callable(normaliser):
        h = normaliser(queries)
    else:
        raise ValueError(f"normaliser must be 'sum', 'none' or a callable, got {normaliser!r}")
    out = (kv @ values) / h[:, None]
    return out if bias is None else out + bias
