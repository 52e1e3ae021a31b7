"""Asymmetric kernel SVD (KSVD) behind Primal-Attention: the dual solution and the primal objective J.

For one head with feature matrices ``Phi_q, Phi_k`` ``(N, p)`` (rows phi_q(x_i), phi_k(x_j)), the kernel
matrix is ``K = Phi_q Phi_k^T`` ``(N, N)``, asymmetric. Its top-s singular triplets
``K H_r = H_e Sigma`` and ``K^T H_e = H_r Sigma`` give the dual solution; the primal weights are

    W_e = Phi_k^T H_r,   W_r = Phi_q^T H_e      (p, s),

so that the primal scores equal the dual ones, ``e = Phi_q W_e = K H_r = H_e Sigma`` and
``r = Phi_k W_r = K^T H_e = H_r Sigma``, and the primal objective is stationary with value zero.

Two conventions of Lambda (be explicit about which one a number refers to):

* **paper**: ``J = 1/2 sum_i e_i^T Lambda e_i + 1/2 sum_j r_j^T Lambda r_j - Tr(W_e^T W_r)``; the stationary
  point has ``Lambda = Sigma^{-1}`` (:func:`objective_paper`).
* **code** (what the layer's KSVD loss computes): ``J = 1/2 mean_i ||Lambda_c e_i||^2 + 1/2 mean_j
  ||Lambda_c r_j||^2 - Tr(W_e^T W_r)``: ``Lambda_c`` plays ``Lambda^{1/2}`` and the sums are means, so the
  same stationary point has ``Lambda_c = (N Sigma^{-1})^{1/2}`` (:attr:`KSVDSolution.lam_code`); with it the
  code objective equals the paper objective.

The SVD is ``torch.linalg.svd`` (LAPACK); nothing here is hand-rolled linear algebra.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..functional.primal import ksvd_objective

__all__ = [
    "KSVDSolution",
    "kernel_matrix",
    "objective_code",
    "objective_paper",
    "primal_stationary_point",
    "stationary_point",
]


def kernel_matrix(phi_q: Tensor, phi_k: Tensor) -> Tensor:
    """``K_ij = <phi_q(x_i), phi_k(x_j)>``: ``(N, p), (N, p) -> (N, N)``."""
    return phi_q @ phi_k.T


@dataclass
class KSVDSolution:
    """The top-s KSVD solution of one head.

    Attributes:
        kernel: ``(N, N)`` K.
        h_e, h_r: ``(N, s)`` left / right singular vectors (dual variables).
        sigma: ``(s,)`` singular values (descending).
        w_e, w_r: ``(p, s)`` primal weights ``Phi_k^T H_r`` and ``Phi_q^T H_e``.
        lam_paper: ``(s,)`` ``Sigma^{-1}`` (paper convention).
        lam_code: ``(s,)`` ``(N Sigma^{-1})^{1/2}`` (the layer's convention: means, Lambda^{1/2}).
    """

    kernel: Tensor
    h_e: Tensor
    h_r: Tensor
    sigma: Tensor
    w_e: Tensor
    w_r: Tensor
    lam_paper: Tensor
    lam_code: Tensor


def stationary_point(phi_q: Tensor, phi_k: Tensor, s: int) -> KSVDSolution:
    """Top-s singular triplets of ``K = Phi_q Phi_k^T`` and the primal weights built from them.

    Args:
        phi_q, phi_k: ``(N, p)`` feature matrices. s: rank, at most ``min(N, p)`` with non-zero singular values.
    """
    n, p = phi_q.shape
    if not 1 <= s <= min(n, p):
        raise ValueError(f"s must be in [1, min(N, p)] = [1, {min(n, p)}] (rank of K), got {s}")
    k = kernel_matrix(phi_q, phi_k)
    u, sig, vh = torch.linalg.svd(k)
    h_e, h_r, sigma = u[:, :s], vh[:s].T, sig[:s]
    if bool((sigma <= 0).any()):
        raise ValueError("K has fewer than s non-zero singular values; choose a smaller s")
    return KSVDSolution(
        kernel=k,
        h_e=h_e,
        h_r=h_r,
        sigma=sigma,
        w_e=phi_k.T @ h_r,
        w_r=phi_q.T @ h_e,
        lam_paper=sigma.reciprocal(),
        lam_code=(n / sigma).sqrt(),
    )


def primal_stationary_point(phi_q: Tensor, phi_k: Tensor, s: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The primal weights of :func:`stationary_point` without forming the ``(N, N)`` kernel: for many tokens.

    ``K = Phi_q Phi_k^T`` has rank at most p. With thin QR factorisations ``Phi_q = Q_a R_a`` and ``Phi_k = Q_b R_b``,
    ``K = Q_a (R_a R_b^T) Q_b^T``, so the top-s SVD of the ``(p, p)`` matrix ``R_a R_b^T = U Sigma V^T`` gives
    ``H_e = Q_a U``, ``H_r = Q_b V`` and the primal weights ``W_e = Phi_k^T H_r = R_b^T V`` and
    ``W_r = Phi_q^T H_e = R_a^T U``: O(N p^2) time and O(N p) memory instead of O(N^3) and O(N^2).

    Args:
        phi_q, phi_k: ``(N, p)`` feature matrices, ``N >= p``. s: rank, ``1 <= s <= p``.

    Returns:
        ``(w_e, w_r, sigma, lam_code)``: ``(p, s)``, ``(p, s)``, ``(s,)`` and ``(s,)`` as :class:`KSVDSolution`'s
        fields of the same names (equal up to the sign of each singular pair).
    """
    n, p = phi_q.shape
    if phi_k.shape != phi_q.shape:
        raise ValueError(
            f"phi_q and phi_k must have one shape (N, p), got {tuple(phi_q.shape)} and {tuple(phi_k.shape)}"
        )
    if n < p:
        raise ValueError(f"primal_stationary_point needs N >= p tokens (N={n}, p={p}); use stationary_point")
    if not 1 <= s <= p:
        raise ValueError(f"s must be in [1, p] = [1, {p}], got {s}")
    _, r_a = torch.linalg.qr(phi_q)  # (p, p)
    _, r_b = torch.linalg.qr(phi_k)  # (p, p)
    u, sig, vh = torch.linalg.svd(r_a @ r_b.T)
    sigma = sig[:s]
    if bool((sigma <= 0).any()):
        raise ValueError("K has fewer than s non-zero singular values; choose a smaller s")
    return r_b.T @ vh[:s].T, r_a.T @ u[:, :s], sigma, (n / sigma).sqrt()


def objective_paper(e: Tensor, r: Tensor, w_e: Tensor, w_r: Tensor, lam: Tensor) -> Tensor:
    """Paper convention: ``1/2 sum_i e_i^T diag(lam) e_i + 1/2 sum_j r_j^T diag(lam) r_j - Tr(W_e^T W_r)``.

    Args: e, r ``(N, s)``; w_e, w_r ``(p, s)``; lam ``(s,)``.
    """
    return 0.5 * (e * e * lam).sum() + 0.5 * (r * r * lam).sum() - torch.trace(w_e.T @ w_r)


def objective_code(e: Tensor, r: Tensor, w_e: Tensor, w_r: Tensor, lam: Tensor) -> Tensor:
    """The layer's convention, computed by :func:`primaldual.functional.primal.ksvd_objective` (one head).

    Args: e, r ``(N, s)``; w_e, w_r ``(p, s)``; lam ``(s,)`` (``Lambda_c``).
    """
    return ksvd_objective(e[None, None], r[None, None], w_e[None], w_r[None], lam[None])
