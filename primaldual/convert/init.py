"""Initialising a student's new parameters from its teacher: KSVD for ``W_e, W_r, Lambda``, least squares for the
output map.

* **KSVD** (Chen et al., 2023, Theorem 1): on a calibration batch, the student's own feature matrices per head,
  ``Phi_q, Phi_k`` ``(T, p)`` over the T real tokens (the cosine feature map of q and k, of their prefix means for a
  causal layer, as the layer computes them), define the asymmetric kernel ``K = Phi_q Phi_k^T``. Its top-s SVD gives
  the stationary point ``W_e = Phi_k^T H_r``, ``W_r = Phi_q^T H_e`` and ``Lambda = (T / Sigma)^{1/2}`` in the
  layer's convention, where the layer's KSVD objective J is zero on that batch (global reduction)
  (:func:`~primaldual.theory.ksvd.primal_stationary_point`, without forming the ``(T, T)`` kernel). The stationary
  points form a cone: ``(c W_e, c W_r, Lambda)`` is one too, with J = 0 (both of J's parts scale by c^2). The solution
  is scaled per head so that its trace term ``tr(W_e^T W_r)`` is 1: unscaled it is the sum of the singular values
  (tens), and J on other batches than the calibration one moves with it, so that ``eta J^2`` would outweigh the LM
  loss; at trace 1 it stays of the order of the layer's own random initialisation.
* **Data-dependent weights** (the bidirectional layer's default, ``W_{e|X} = f(X)^T W_e`` with ``f(X)`` ``(n, p)``
  the n sampled layer inputs of a head and ``W_e`` ``(n, s)``): the stationary point above is a ``(p, s)`` matrix,
  and the ``(n, s)`` coefficients are fitted to it by ridge least squares on the calibration tokens' scores,
  ``min sum_{b,i} ||phi(q_i)^T f(X_b)^T W - phi(q_i)^T W*||^2`` (and alike for ``W_r`` with the keys), so that every
  sequence's scores are as close to the stationary point's as its sampled tokens allow. The layer's trace term reads
  the coefficients, not ``W_{e|X}``, so J is not zero there; ``Lambda`` is then scaled by one factor, which sets J
  to zero on the batch when the coefficients' trace is positive.
* **Least squares**: with the scores fixed, the head output ``Linear(2s -> p)(scores)`` is linear in the map's
  weight and bias, so they are fitted in closed form to the teacher's per-head outputs (``softmax(q k^T) v`` of each
  head, before the output projection, which the student keeps). The hybrid's branch is fitted to the residual the
  window leaves (teacher heads minus window heads) and its gate set to 1, so where the window already covers the
  sequence the fit is zero and the layer is the teacher's.

The SVDs and the least squares run in float64; the results are written in the layer's dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..attention.base import QKVAttention, RopeTables
from ..attention.hybrid import HybridAttention
from ..attention.primal import PrimalAttention
from ..functional.primal import (
    causal_prefix_mean,
    cosine_feature_map,
    data_dependent_weights,
    ksvd_objective,
    primal_scores_from_input,
    sample_tokens,
)
from ..theory.ksvd import primal_stationary_point

__all__ = [
    "FIT_SEQUENCES_PER_COEFFICIENT",
    "branch_features",
    "branch_scores",
    "check_calibration",
    "init_from_teacher",
    "ksvd_init",
    "ksvd_objective_global",
    "least_squares_map",
    "rebuild_error",
    "teacher_heads",
]


def _check_student(layer: Any) -> None:
    if not isinstance(layer, PrimalAttention | HybridAttention):
        raise TypeError(f"expected a primal or hybrid student layer, got {type(layer).__name__}")
    if isinstance(layer, HybridAttention) and not layer.has_branch:
        raise ValueError("this hybrid layer has no primal branch (primal_branch=False): nothing to initialise")


def branch_features(layer: PrimalAttention | HybridAttention, x: Tensor, mask: Tensor | None) -> Tensor:
    """The student's feature-mapped q and k (their prefix means for a causal layer) on the layer input ``x``
    ``(B, N, C)``: ``(B, N, 2, H, p)`` (``[:, :, 0]`` queries, ``[:, :, 1]`` keys)."""
    _check_student(layer)
    B, N, _ = x.shape
    H, p = layer.num_heads, layer.head_dim
    if isinstance(layer, PrimalAttention):
        exact = mask if layer.padding == "exact" else None
        qk = torch.nn.functional.linear(x, layer.qk.weight, layer.qk.bias).view(B, N, 2, H, p)  # (B, N, 2, H, p)
    else:  # the window's (unrotated) projections, through its query / key norms where it has them
        exact = mask
        q, k, _ = layer._qkv(x)  # (B, H, N, p) each
        qk = torch.stack((q, k), 1).permute(0, 3, 1, 2, 4)  # (B, 2, H, N, p) -> (B, N, 2, H, p)
    return cosine_feature_map(causal_prefix_mean(qk, exact) if layer.causal else qk, layer.eps)


def _weights(layer: PrimalAttention | HybridAttention, x: Tensor, mask: Tensor | None) -> Tensor:
    """``stack(W_e, W_r)`` as the layer's scores use them on ``x`` ``(B, N, C)``: ``(2, H, p, s)``, or
    ``(B, 2, H, p, s)`` for data-dependent weights."""
    w = torch.stack((layer.w_e, layer.w_r))  # (2, H, n or p, s)
    if not getattr(layer, "data_dependent", False):
        return w
    return data_dependent_weights(sample_tokens(x, layer.n, mask, layer.padding), w)


def branch_scores(layer: PrimalAttention | HybridAttention, x: Tensor, mask: Tensor | None) -> Tensor:
    """The student's scores ``[e; r]`` on ``x`` ``(B, N, C)``, token-major ``(B, N, H, 2, s)``."""
    _check_student(layer)
    if isinstance(layer, HybridAttention):
        q, k, _ = layer._qkv(x)  # (B, H, N, D) each
        return layer.branch_scores(q, k, mask)
    exact = mask if layer.padding == "exact" else None
    src = causal_prefix_mean(x, exact) if layer.causal else x  # (B, N, C): q, k are affine in x
    return primal_scores_from_input(src, layer.qk.weight, layer.qk.bias, _weights(layer, x, mask), layer.eps)[0]


def _tables(layer: QKVAttention, rope: RopeTables | None, x: Tensor) -> RopeTables | None:
    """Validated ``(B or 1, 1, N, D)`` rotary tables for ``layer`` on ``x`` ``(B, N, C)``, or None."""
    return None if rope is None else layer._check_rope(rope, x.shape[0], x.shape[1], x.device)


@torch.no_grad()
def teacher_heads(teacher: QKVAttention, x: Tensor, mask: Tensor | None, rope: RopeTables | None = None) -> Tensor:
    """The teacher's per-head outputs before its output projection, ``(B, H, N, D)``, on the layer input ``x``
    (queries and keys rotated by ``rope``, ``(cos, sin)`` each ``(B, N, D)``, for a rotary teacher such as Llama)."""
    q, k, v = teacher._qkv(x, _tables(teacher, rope, x))  # (B, H, N, D) each
    return teacher.attend(q, k, v, mask, False)[0]


@torch.no_grad()
def rebuild_error(
    teacher: QKVAttention, x: Tensor, y: Tensor, mask: Tensor | None, rope: RopeTables | None = None
) -> float:
    """How far ``teacher`` (a layer rebuilt from a model's weights) is from what the model's own layer gave: the
    relative Frobenius error of its output on the layer input ``x`` against the recorded output ``y`` (both
    ``(B, N, C)``), over the real tokens of ``mask``, in float64."""
    real = _real(mask, x.shape[0], x.shape[1], x.device)
    got = teacher(x, mask, rope=rope)[real].double()  # (T, C)
    want = y[real].double()  # (T, C)
    return float((got - want).norm() / want.norm().clamp_min(torch.finfo(torch.float64).tiny))


def _real(mask: Tensor | None, B: int, N: int, device: torch.device) -> Tensor:
    return torch.ones(B, N, dtype=torch.bool, device=device) if mask is None else mask  # (B, N)


@torch.no_grad()
def ksvd_init(
    layer: PrimalAttention | HybridAttention, x: Tensor, mask: Tensor | None = None, ridge: float = 1e-6
) -> dict[str, float]:
    """Set ``W_e, W_r, Lambda`` of a primal layer (or hybrid branch) to the KSVD stationary point of its own kernel
    on the calibration batch ``x`` ``(B, N, C)`` (real tokens by ``mask``); data-dependent weights are fitted to it
    (``ridge`` as :func:`least_squares_map`'s, see the module docstring).

    Returns:
        ``{"tokens": T, "J": the layer's objective on the batch afterwards (global reduction: 0 up to rounding, for
        weights that are not data-dependent, and for data-dependent ones whose fitted trace is positive),
        "sigma_max": largest singular value, "sigma_min": s-th}``, and for data-dependent weights
        ``"weights_residual"``: the fit's relative residual on the calibration scores (0: the stationary point's).
    """
    phi = branch_features(layer, x, mask)  # (B, N, 2, H, p)
    real = _real(mask, x.shape[0], x.shape[1], x.device)
    flat = phi[real]  # (T, 2, H, p)
    T, p, s = flat.shape[0], layer.head_dim, layer.s
    if p > T:
        raise ValueError(f"the calibration batch has {T} real tokens; the KSVD initialisation needs at least p={p}")
    if s > p:
        raise ValueError(
            f"s={s} exceeds the head width p={p}: the kernel has rank at most p, so the KSVD initialisation has p "
            f"directions; choose s <= {p}, or init 'random'"
        )
    sig, targets = [], []
    for h in range(layer.num_heads):
        w_e, w_r, sigma, lam = primal_stationary_point(flat[:, 0, h].double(), flat[:, 1, h].double(), s)
        c = sigma.sum().rsqrt()  # the trace term tr(W_e^T W_r) becomes 1 (see the module docstring)
        targets.append(torch.stack((c * w_e, c * w_r)))  # (2, p, s)
        layer.lam[h].copy_(lam)
        sig.append(sigma)
    sig = torch.stack(sig)  # (H, s)
    target = torch.stack(targets, 1)  # (2, H, p, s)
    info: dict[str, float] = {"tokens": int(T), "sigma_max": float(sig.max()), "sigma_min": float(sig[:, -1].min())}
    if getattr(layer, "data_dependent", False):
        info["weights_residual"] = _fit_data_dependent(layer, x, mask, phi, target, ridge)
    else:
        layer.w_e.copy_(target[0])
        layer.w_r.copy_(target[1])
    scores = branch_scores(layer, x, mask)
    j = ksvd_objective_global(layer, scores, mask)
    if getattr(layer, "data_dependent", False):
        trace = float((layer.w_e.double() * layer.w_r.double()).sum() / layer.num_heads)
        energy = float(j) + trace  # J = energy - trace, and the energy scales with Lambda^2
        if trace > 0 and energy > 0:
            layer.lam.mul_((trace / energy) ** 0.5)
            j = ksvd_objective_global(layer, scores, mask)
    info["J"] = float(j)
    return info


#: the data-dependent fit needs sequences x head width >= this x n: each sequence's scores span at most p directions,
#: and with fewer the ridge least squares interpolates the calibration batch (on a small trained encoder, held-out
#: layer errors relative to the teacher's output of 99, 2.1, 0.59 and 0.43 at 1.3, 5.3, 21 and 85 x n)
FIT_SEQUENCES_PER_COEFFICIENT = 8


def check_calibration(layer: PrimalAttention, x: Tensor, mask: Tensor | None) -> None:
    """Whether the calibration batch ``x`` ``(B, N, C)`` has enough sequences for ``layer``'s data-dependent fit
    (:data:`FIT_SEQUENCES_PER_COEFFICIENT`); a ``ValueError`` that says how many it needs otherwise."""
    used = int(_real(mask, x.shape[0], x.shape[1], x.device).any(1).sum())  # sequences with a real token
    n, p = layer.n, layer.head_dim
    if used * p < FIT_SEQUENCES_PER_COEFFICIENT * n:
        need = -(-FIT_SEQUENCES_PER_COEFFICIENT * n // p)
        longer = f" (n is above the {x.shape[1]} tokens of a sequence: set max_len)" if n > x.shape[1] else ""
        raise ValueError(
            f"the data-dependent W_e, W_r have n={n} coefficients per head{longer}, and the calibration batch's "
            f"{used} sequences give at most {used} x p={p} independent scores per head: the fit would reproduce this "
            f"batch and miss every other; give a calibration batch of at least {need} sequences, or "
            "data_dependent=False"
        )


def _fit_data_dependent(
    layer: PrimalAttention, x: Tensor, mask: Tensor | None, phi: Tensor, target: Tensor, ridge: float
) -> float:
    """Fit the ``(H, n, s)`` coefficients of data-dependent ``W_e, W_r`` so that every calibration token's scores,
    ``phi(q_i)^T f(X_b)^T W``, are those of the ``(2, H, p, s)`` ``target`` weights, ``phi(q_i)^T W*`` (ridge least
    squares per head, over the real tokens; ``phi`` ``(B, N, 2, H, p)``). Returns the relative residual."""
    samples = sample_tokens(x, layer.n, mask, layer.padding).double()  # (B, n, C)
    B, n, _ = samples.shape
    H, p = layer.num_heads, layer.head_dim
    f = samples.view(B, n, H, p)  # (B, n, C) -> (B, n, H, p)
    real = _real(mask, B, x.shape[1], x.device).double()  # (B, N)
    phi = phi.double() * real[:, :, None, None, None]  # padded tokens out of the fit
    a = torch.einsum("bithp,bmhp->tbihm", phi, f)  # (2, B, N, H, n): each token's design row
    y = torch.einsum("bithp,thps->tbihs", phi, target.double())  # (2, B, N, H, s): the target scores
    gram = torch.einsum("tbihm,tbihk->thmk", a, a)  # (2, H, n, n)
    rhs = torch.einsum("tbihm,tbihs->thms", a, y)  # (2, H, n, s)
    scale = gram.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-30)  # (2, H)
    eye = torch.eye(n, dtype=gram.dtype, device=gram.device)
    # Cholesky, not a batched torch.linalg.solve: the normal matrix is positive definite (ridge > 0), and the batched
    # LU of some CPU builds fails on these shapes (MKL's DLASWP parameter error, then a hang)
    chol, info = torch.linalg.cholesky_ex(gram + ridge * scale[..., None, None] * eye)  # (2, H, n, n)
    if bool((info != 0).any()):
        raise ValueError(
            f"the data-dependent fit's normal matrix is singular ({B} calibration sequences for n={n} sampled "
            "tokens): give more calibration batches, or a ridge > 0"
        )
    coef = torch.cholesky_solve(rhs, chol)  # (2, H, n, s)
    fitted = torch.einsum("tbihm,thms->tbihs", a, coef)  # (2, B, N, H, s)
    residual = (fitted - y).square().sum() / y.square().sum().clamp_min(1e-30)
    layer.w_e.copy_(coef[0])
    layer.w_r.copy_(coef[1])
    return float(residual)


def ksvd_objective_global(layer: PrimalAttention | HybridAttention, scores: Tensor, mask: Tensor | None) -> Tensor:
    """J of the layer on ``scores`` ``(B, N, H, 2, s)``, one mean over the batch's real tokens (the sign kept)."""
    e, r = scores.transpose(1, 2).unbind(3)  # (B, H, N, s) each
    return ksvd_objective(e, r, layer.w_e, layer.w_r, layer.lam, mask, "global")


@torch.no_grad()
def least_squares_map(
    layer: PrimalAttention | HybridAttention, scores: Tensor, target: Tensor, mask: Tensor | None, ridge: float = 1e-6
) -> float:
    """Fit the shared ``Linear(2s -> p)`` of ``layer`` to ``target`` ``(B, H, N, p)`` from ``scores``
    ``(B, N, H, 2, s)`` over the real tokens and every head, by ridge-regularised least squares (``ridge`` times the
    mean diagonal of the normal matrix). Returns the relative residual ``||fit - target||^2 / ||target||^2``."""
    B, N, H, _, s = scores.shape
    real = _real(mask, B, N, scores.device)
    x = scores.double()[real].reshape(-1, 2 * s)  # (T*H, 2s)
    y = target.double().transpose(1, 2)[real].reshape(-1, target.shape[-1])  # (B, N, H, p) -> (T*H, p)
    x1 = torch.cat([x, x.new_ones(x.shape[0], 1)], 1)  # (T*H, 2s+1)
    gram = x1.T @ x1
    gram = gram + ridge * gram.diagonal().mean().clamp_min(1e-30) * torch.eye(
        2 * s + 1, dtype=gram.dtype, device=gram.device
    )
    a = torch.linalg.solve(gram, x1.T @ y)  # (2s+1, p)
    layer.concat.weight.copy_(a[: 2 * s].T)
    layer.concat.bias.copy_(a[2 * s])
    denom = y.square().sum().clamp_min(1e-30)
    return float((x1 @ a - y).square().sum() / denom)


@torch.no_grad()
def init_from_teacher(
    student: PrimalAttention | HybridAttention,
    teacher: QKVAttention,
    x: Tensor,
    mask: Tensor | None = None,
    rope: RopeTables | None = None,
) -> dict[str, float]:
    """KSVD for ``W_e, W_r, Lambda`` and least squares for the output map, on the teacher layer's inputs ``x``
    ``(B, N, C)`` (its calibration batch). For the hybrid the map is fitted to the residual of the window and the
    gates set to 1. ``rope`` (``(cos, sin)``, each ``(B, N, D)``): the teacher's rotary tables, applied to its
    queries and keys and to the hybrid's window (the primal branch takes none). Returns the KSVD figures of
    :func:`ksvd_init` and ``lstsq_residual``."""
    if getattr(student, "data_dependent", False):
        check_calibration(student, x, mask)
    info = ksvd_init(student, x, mask)
    target = teacher_heads(teacher, x, mask, rope).double()  # (B, H, N, p)
    if isinstance(student, HybridAttention):
        q, k, v = student._qkv(x, _tables(student, rope, x))
        window, _ = student.attend(q, k, v, mask, False)  # (B, H, N, p)
        target = target - window.double()
        student.gate.fill_(1.0)
    scores = branch_scores(student, x, mask)
    info["lstsq_residual"] = least_squares_map(student, scores, target, mask)
    return info
