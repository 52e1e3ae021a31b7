"""Primal-Attention building blocks on ``(B, H, N, D)`` tensors (Chen et al., NeurIPS 2023).

The layer (:class:`primaldual.attention.primal.PrimalAttention`) is a composition of these pieces:

* :func:`even_positions` / :func:`sample_tokens`: the n evenly spaced token positions of the
  data-dependent projection weights, per sequence (padding-correct) or over the padded length
  (the reference code's behaviour);
* :func:`data_dependent_weights`: ``W_{e|X} = f(X)^T W_e`` with ``f_h(X)`` the sampled tokens' h-th
  contiguous channel chunk;
* :func:`cosine_feature_map`: row-wise L2 normalisation with a zero-norm guard;
* :func:`causal_prefix_mean`: the causal variant's prefix means of q and k (before the feature map);
* :func:`primal_scores`: ``e = phi_q(Q) W_e``, ``r = phi_k(K) W_r`` concatenated to ``(B, H, N, 2s)``;
  :func:`primal_scores_from_input` is the layer's fused equivalent, token-major ``(B, N, H, 2, s)``;
* :func:`ksvd_objective` / :func:`ksvd_loss` (and :func:`ksvd_loss_from_scores` on token-major scores):
  the KSVD objective J and its squared regulariser in the reference code's convention (``Lambda`` plays
  ``Lambda^{1/2}`` of the paper, means instead of sums);
* :func:`primal_kernel`: the implicit asymmetric kernel matrix ``phi_q(Q) phi_k(K)^T`` (for analysis).

Masks are ``(B, N)`` bool with **True = real token**. Nothing here materialises an ``N x N`` or
``N x n`` tensor except :func:`primal_kernel`, which exists to be inspected.

Hand-written: no library implements Primal-Attention; the tensor work is plain ``torch`` ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .scan import prefix_sum

__all__ = [
    "causal_prefix_mean",
    "cosine_feature_map",
    "data_dependent_weights",
    "even_positions",
    "ksvd_loss",
    "ksvd_loss_from_energies",
    "ksvd_loss_from_scores",
    "ksvd_objective",
    "primal_kernel",
    "primal_scores",
    "primal_scores_from_input",
    "fold_scores",
    "sample_tokens",
]

PADDING_MODES = ("exact", "reference")
KSVD_REDUCTIONS = ("global", "sample")


def even_positions(lengths: Tensor, n: int) -> Tensor:
    """``n`` evenly spaced indices into sequences of the given lengths: ``torch.linspace(0, L - 1, n, dtype=long)``.

    The reference code samples with ``torch.linspace``, whose integer rounding is not
    ``floor(j (L - 1) / (n - 1))``: on CPU it computes ``step * j`` in float64 for the first half and the fused
    multiply-add ``(L - 1) - step * (n - 1 - j)`` for the second, then truncates, which differs at some points
    (e.g. L=3, n=151, j=75). This reproduces that arithmetic with plain element-wise float64 ops (the fused
    multiply-add through error-free transformations), so the positions are computed on the device, for every
    length at once, with no host synchronisation and inside ``torch.compile`` graphs (whose C++ code is built
    without floating-point contraction, so the transformations stay exact).

    Args:
        lengths: ``(B,)`` integer lengths (0 is allowed and gives index 0).
        n: number of positions, >= 1.

    Returns:
        ``(B, n)`` int64 indices in ``[0, max(L - 1, 0)]``.
    """
    last = (lengths.to(torch.float64) - 1.0).clamp_min(0.0)[:, None]  # (B, 1): L - 1
    if n == 1:
        return torch.zeros(lengths.shape[0], 1, dtype=torch.long, device=lengths.device)
    step = last / (n - 1)  # (B, 1)
    j = torch.arange(n, device=lengths.device, dtype=torch.float64)  # (n,)
    head = (step * j).trunc()  # (B, n)
    tail = _fma(-step, (n - 1) - j, last).trunc()  # (B, n)
    return torch.where(j < n // 2, head, tail).long()


def _split(a: Tensor) -> tuple[Tensor, Tensor]:
    """Veltkamp split of float64 ``a`` into a high and a low half whose product terms are exact."""
    c = a * 134217729.0  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _fma(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """``a * b + c`` rounded once (float64), from Dekker's exact product and Knuth's exact sum."""
    p = a * b
    (a_hi, a_lo), (b_hi, b_lo) = _split(a), _split(b)
    p_err = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo  # a * b = p + p_err exactly
    s = p + c
    v = s - p
    s_err = (p - (s - v)) + (c - v)  # p + c = s + s_err exactly
    return s + (s_err + p_err)


def sample_tokens(x: Tensor, n: int, mask: Tensor | None = None, padding: str = "exact") -> Tensor:
    """The n evenly spaced tokens of ``x`` that the data-dependent projection weights are built from.

    Args:
        x: ``(B, N, C)`` layer input.
        n: number of tokens to sample (may exceed N: positions then repeat).
        mask: ``(B, N)`` bool, True = real token, or None.
        padding: ``"exact"`` samples among each sequence's real tokens only (a sequence with no real
            token gives zeros); ``"reference"`` samples positions over the padded length N, padding included,
            as the reference code does. Identical when there is no padding.

    Returns:
        ``(B, n, C)`` sampled tokens.
    """
    if padding not in PADDING_MODES:
        raise ValueError(f"padding must be one of {PADDING_MODES}, got {padding!r}")
    B, N, C = x.shape
    if mask is None or padding == "reference":
        pos = even_positions(torch.full((1,), N, device=x.device), n)[0]  # (n,)
        return x[:, pos]  # (B, n, C)
    lengths = mask.sum(1)  # (B,)
    ranks = even_positions(lengths, n)  # (B, n): rank among the sequence's real tokens
    # the r-th real token is the first position where the running count of real tokens reaches r + 1
    counts = mask.cumsum(1)  # (B, N)
    pos = torch.searchsorted(counts, ranks + 1).clamp_max(N - 1)  # (B, n)
    out = torch.gather(x, 1, pos[..., None].expand(B, n, C))  # (B, n, C)
    return out * (lengths > 0).to(x.dtype)[:, None, None]


def data_dependent_weights(samples: Tensor, weight: Tensor) -> Tensor:
    """``W_{.|X, h} = f_h(X)^T W_h``: projection weights from the sampled tokens.

    Args:
        samples: ``(B, n, C)`` sampled layer inputs, ``C = H * p``; head h uses channels ``h*p ... h*p+p-1``.
        weight: ``(H, n, s)`` learnable ``W_e`` or ``W_r``, or ``(T, H, n, s)`` for several at once
            (e.g. ``torch.stack((W_e, W_r))``).

    Returns:
        ``(B, H, p, s)``, or ``(B, T, H, p, s)``.
    """
    B, n, C = samples.shape
    H = weight.shape[-3]
    if weight.shape[-2] != n or C % H:
        raise ValueError(f"samples {tuple(samples.shape)} do not fit weight {tuple(weight.shape)} (need C = H * p)")
    p, s = C // H, weight.shape[-1]
    # bmm with the batch folded into the rows, not einsum (whose path search and copies cost more than these small
    # products) nor a broadcasting matmul (which would copy the weights once per sample)
    f = samples.reshape(B, n, H, p).permute(2, 0, 3, 1).reshape(H, B * p, n)  # (B, n, C) -> (H, B*p, n)
    if weight.dim() == 3:
        return torch.bmm(f, weight).view(H, B, p, s).transpose(0, 1)  # (H, B*p, s) -> (B, H, p, s)
    T = weight.shape[0]
    wt = weight.permute(1, 2, 0, 3).reshape(H, n, T * s)  # (T, H, n, s) -> (H, n, T*s)
    out = torch.bmm(f, wt).view(H, B, p, T, s)  # (H, B*p, T*s) -> (H, B, p, T, s)
    return out.permute(1, 3, 0, 2, 4)  # (B, T, H, p, s)


def cosine_feature_map(x: Tensor, eps: float = 1e-12) -> Tensor:
    """Row-wise L2 normalisation ``x / max(||x||, eps)`` along the last dim; the zero vector maps to 0."""
    return F.normalize(x, p=2.0, dim=-1, eps=eps)


def causal_prefix_mean(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Prefix means along the token dimension: ``out_i = mean_{j <= i, j real} x_j``.

    Args:
        x: ``(B, N, ...)`` token-major tensor (dim 1 is the token axis).
        mask: ``(B, N)`` bool, True = real token; padded tokens are left out of both sum and count.
            A position with no real token at or before it gets 0.

    Returns:
        Same shape and dtype as ``x``. The sums run through :func:`~primaldual.functional.scan.prefix_sum`: chunked
        on a GPU, in float32 for half-precision inputs.
    """
    B, N = x.shape[:2]
    extra = (1,) * (x.dim() - 2)
    if mask is None:
        sums = prefix_sum(x)  # (B, N, ...), float32 for half inputs
        count = torch.arange(1, N + 1, device=x.device, dtype=sums.dtype).view(1, N, *extra)  # (1, N, 1...)
        return (sums / count).to(x.dtype)
    m = mask.to(x.dtype).view(B, N, *extra)  # (B, N, 1...)
    count = mask.long().cumsum(1).clamp_min(1).view(B, N, *extra)  # (B, N, 1...): integer counts are exact
    return (prefix_sum(x * m) / count).to(x.dtype)


def primal_scores(phi_q: Tensor, phi_k: Tensor, w_e: Tensor, w_r: Tensor) -> Tensor:
    """Projection scores ``[e; r]`` with ``e = phi_q W_e`` and ``r = phi_k W_r`` (r at the same token as e).

    Args:
        phi_q, phi_k: ``(B, H, N, p)`` feature-mapped queries and keys.
        w_e, w_r: ``(B, H, p, s)`` data-dependent or ``(H, p, s)`` data-independent weights.

    Returns:
        ``(B, H, N, 2s)``: e in ``[..., :s]``, r in ``[..., s:]``. It is a permuted view of a token-major
        ``(B, N, H, 2s)`` buffer, so ``scores.transpose(1, 2)`` is contiguous (what the concat Linear wants).
    """
    B, H, N, p = phi_q.shape
    s = w_e.shape[-1]
    phi = torch.stack((phi_q, phi_k), 3)  # (B, H, N, 2, p)
    w = torch.stack((w_e, w_r), -3)  # (B, H, 2, p, s) or (H, 2, p, s)
    eq = "bhntp,bhtps->bnhts" if w.dim() == 5 else "bhntp,htps->bnhts"
    scores = torch.einsum(eq, phi, w)  # (B, N, H, 2, s)
    return scores.reshape(B, N, H, 2 * s).transpose(1, 2)  # (B, H, N, 2s)


def fold_scores(batch: int, tokens: int, dim: int, heads: int, s: int) -> bool:
    """Whether :func:`primal_scores_from_input` folds ``W_q^T W_e`` (one wide GEMM) rather than multiplying per head.

    Multiply-adds per call: folded ``B (C 2C s + N C 2H s)`` (fold, then apply), per head ``B N 2C s``; the
    per-head product's skinny GEMMs and layout copies run at about a third of a wide GEMM's rate on CPU, so it is
    charged 3x. Both give the same scores up to rounding.
    """
    folded = batch * (dim * 2 * dim * s + tokens * dim * 2 * heads * s)
    per_head = 3 * batch * tokens * 2 * dim * s
    return folded <= per_head


def primal_scores_from_input(
    x: Tensor, qk_weight: Tensor, qk_bias: Tensor | None, w: Tensor, eps: float = 1e-12
) -> tuple[Tensor, Tensor]:
    """The layer's fast path: token-major scores ``[e; r]`` straight from the layer input.

    Mathematically ``primal_scores(phi(Q), phi(K), w[..., 0, :, :, :], w[..., 1, :, :, :])`` with
    ``[Q, K] = x W^T + b``, scaled by the per-token norms of ``[Q, K]`` instead of normalising them (no normalised
    ``(B, N, 2C)`` copy). The unnormalised products ``u = [Q, K] W_e`` are computed one of two ways, whichever costs
    fewer multiply-adds (:func:`fold_scores`):

    * **per head**: a batched GEMM of each head's ``(N, p)`` queries / keys with its ``(p, s)`` weights,
      ``2 C s`` per token;
    * **folded**: ``e_i = x_i A + c`` with ``A = W_q^T W_e`` folded per head (a ``(C, 2 H s)`` matrix,
      ``(B, C, 2 H s)`` if data-dependent), one wide GEMM over the tokens, ``C 2 H s`` per token plus
      ``C 2 C s`` per sample to fold. With two heads and long sequences (the LRA models) its single wide GEMM
      beats the per-head product's skinny ones; with more heads or short sequences the fold costs more than it
      saves (JapaneseVowels: 8 heads of 64, 29 tokens, the fold is 25x the per-head work).

    Args:
        x: ``(B, N, C)`` layer input (prefix means of it for the causal variant: q, k are affine in x).
        qk_weight: ``(2 H p, C)`` fused Q/K projection; qk_bias: ``(2 H p,)`` or None.
        w: ``torch.stack((W_e, W_r), -4)``: ``(B, 2, H, p, s)`` data-dependent or ``(2, H, p, s)``.
        eps: zero-norm guard.

    Returns:
        ``(scores, qk)``: scores ``(B, N, H, 2, s)`` token-major (``[..., 0, :]`` is e, ``[..., 1, :]`` is r);
        qk ``(B, N, 2, H, p)`` the unnormalised queries / keys.
    """
    B, N, C = x.shape
    H, p, s = w.shape[-3:]
    qk = F.linear(x, qk_weight, qk_bias).view(B, N, 2, H, p)  # (B, N, 2, H, p)
    inv = torch.linalg.vector_norm(qk, dim=-1).clamp_min(eps).reciprocal()  # (B, N, 2, H)
    if not fold_scores(B, N, C, H, s):
        u = torch.matmul(qk.permute(0, 2, 3, 1, 4), w)  # (B, 2, H, N, p) @ ([B,] 2, H, p, s) -> (B, 2, H, N, s)
        scaled = u * inv.permute(0, 2, 3, 1).unsqueeze(-1)  # (B, 2, H, N, s)
        return scaled.permute(0, 3, 2, 1, 4).contiguous(), qk  # (B, N, H, 2, s)
    wq = qk_weight.view(2, H, p, C)  # (2, H, p, C)
    # A and c by bmm over (q|k, head) with the samples folded into the columns (no per-sample copy of W_q)
    wq_t = wq.transpose(-1, -2).reshape(2 * H, C, p)  # (2H, C, p)
    bq = None if qk_bias is None else qk_bias.view(2 * H, 1, p)  # (2H, 1, p)
    if w.dim() == 5:
        wv = w.permute(1, 2, 3, 0, 4).reshape(2 * H, p, B * s)  # (B, 2, H, p, s) -> (2H, p, B*s)
        a = torch.bmm(wq_t, wv).view(2, H, C, B, s).permute(3, 2, 1, 0, 4).reshape(B, C, H * 2 * s)  # (B, C, H*2*s)
        c = None if bq is None else torch.bmm(bq, wv).view(2, H, B, s).permute(2, 1, 0, 3).reshape(B, 1, H * 2 * s)
    else:
        wv = w.reshape(2 * H, p, s)  # (2H, p, s)
        a = torch.bmm(wq_t, wv).view(2, H, C, s).permute(2, 1, 0, 3).reshape(C, H * 2 * s)  # (C, H*2*s)
        c = None if bq is None else torch.bmm(bq, wv).view(2, H, s).permute(1, 0, 2).reshape(-1)  # (H*2*s,)
    if w.dim() == 4:
        u = F.linear(x, a.T, c)  # (B, N, H*2*s)
    elif c is None:
        u = torch.bmm(x, a)  # (B, N, C) @ (B, C, H*2*s)
    else:
        u = torch.baddbmm(c, x, a)
    scores = u.view(B, N, H, 2, s) * inv.transpose(2, 3).unsqueeze(-1)  # (B, N, H, 2, s)
    return scores, qk


class _MaskedSquareSums(torch.autograd.Function):
    """``S_bk = sum_n m_bn x_bnk^2`` with a two-pass backward ``2 x m grad`` (autograd's chain is ~5 passes)."""

    @staticmethod
    def forward(ctx, x: Tensor, m: Tensor) -> Tensor:
        ctx.save_for_backward(x, m)
        return torch.bmm(m[:, None, :], x * x)[:, 0]  # (B, 1, N) @ (B, N, K) -> (B, K)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None]:
        x, m = ctx.saved_tensors
        return x * (2.0 * grad[:, None, :]) * m[:, :, None], None


def _objective_from_scores(
    scores: Tensor, w_e: Tensor, w_r: Tensor, lam: Tensor, mask: Tensor | None, reduction: str
) -> Tensor:
    B, N, H, _, s = scores.shape
    m = torch.ones(B, N, dtype=scores.dtype, device=scores.device) if mask is None else mask.to(scores.dtype)
    sums = _MaskedSquareSums.apply(scores.reshape(B, N, H * 2 * s), m)  # (B, H*2*s): masked sums of e^2, r^2
    lam2 = lam.square()[:, None, :].expand(H, 2, s).reshape(H * 2 * s)  # (H*2*s,)
    per_sample = sums @ lam2  # (B,): sum over heads, tokens of ||L e||^2 + ||L r||^2
    return _objective_from_sums(per_sample, w_e, w_r, mask, N, reduction)


def _objective_from_sums(
    per_sample: Tensor, w_e: Tensor, w_r: Tensor, mask: Tensor | None, tokens: int, reduction: str
) -> Tensor:
    """J from ``per_sample`` ``(B,)`` = sum over heads and counted tokens of ``||L e||^2 + ||L r||^2``."""
    if reduction not in KSVD_REDUCTIONS:
        raise ValueError(f"ksvd_reduction must be one of {KSVD_REDUCTIONS}, got {reduction!r}")
    H = w_e.shape[0]
    # (B,) number of (head, token) pairs
    count = torch.full_like(per_sample, float(tokens * H)) if mask is None else mask.to(per_sample.dtype).sum(1) * H
    trace = (w_e * w_r).sum() / H  # trace(mean_h W_e,h^T W_r,h)
    if reduction == "global":
        return 0.5 * per_sample.sum() / count.sum().clamp_min(1.0) - trace
    return 0.5 * per_sample / count.clamp_min(1.0) - trace


def _loss_from_objective(j: Tensor, mask: Tensor | None, reduction: str) -> Tensor:
    if mask is None:
        return j.square().mean()
    has = mask.any(1).to(j.dtype)  # (B,)
    if reduction == "global":
        return j.square() * has.max()
    return (j.square() * has).sum() / has.sum().clamp_min(1.0)


def ksvd_objective(
    e: Tensor,
    r: Tensor,
    w_e: Tensor,
    w_r: Tensor,
    lam: Tensor,
    mask: Tensor | None = None,
    reduction: str = "global",
) -> Tensor:
    """The KSVD objective J of one layer as the reference code computes it.

    ``J = 1/2 mean_{h,i} ||Lambda_h * e_{h,i}||^2 + 1/2 mean_{h,j} ||Lambda_h * r_{h,j}||^2
    - trace(mean_h W_{e,h}^T W_{r,h})``. ``Lambda`` here plays ``Lambda^{1/2}`` of the paper.

    Args:
        e, r: ``(B, H, N, s)`` scores.
        w_e, w_r: the raw learnable weights, ``(H, n, s)`` or ``(H, p, s)``.
        lam: ``(H, s)``.
        mask: ``(B, N)`` bool, True = real token: padded tokens are left out of the means (None: all count).
        reduction: ``"global"`` (one mean over batch, heads and tokens; the LRA / vision code) or
            ``"sample"`` (means per sample over heads and tokens; the time-series code).

    Returns:
        A scalar for ``"global"``, ``(B,)`` for ``"sample"``.
    """
    scores = torch.stack((e, r), 3).transpose(1, 2)  # (B, N, H, 2, s)
    return _objective_from_scores(scores, w_e, w_r, lam, mask, reduction)


def ksvd_loss(
    e: Tensor,
    r: Tensor,
    w_e: Tensor,
    w_r: Tensor,
    lam: Tensor,
    mask: Tensor | None = None,
    reduction: str = "global",
) -> Tensor:
    """One layer's KSVD regulariser: ``J^2`` (global) or ``mean_b J_b^2`` (per sample).

    The per-sample form equals the time-series code's "square per sample, add to the per-sample task
    loss, average over the batch". Sequences with no real token contribute nothing (they have no data);
    if there are none at all the term is 0. Arguments as :func:`ksvd_objective`; returns a scalar.
    """
    return _loss_from_objective(ksvd_objective(e, r, w_e, w_r, lam, mask, reduction), mask, reduction)


def ksvd_loss_from_scores(
    scores: Tensor,
    w_e: Tensor,
    w_r: Tensor,
    lam: Tensor,
    mask: Tensor | None = None,
    reduction: str = "global",
) -> Tensor:
    """:func:`ksvd_loss` on the token-major scores of :func:`primal_scores_from_input` ``(B, N, H, 2, s)``."""
    return _loss_from_objective(_objective_from_scores(scores, w_e, w_r, lam, mask, reduction), mask, reduction)


def ksvd_loss_from_energies(
    energy: Tensor,
    w_e: Tensor,
    w_r: Tensor,
    mask: Tensor | None = None,
    tokens: int | None = None,
    reduction: str = "global",
) -> Tensor:
    """:func:`ksvd_loss` from per-group energies ``(B, 2H)``, ``sum_t m_t ||Lambda_h * score||^2`` (as returned by
    :func:`~primaldual.functional.primal_rotated.primal_output_rotated`); ``tokens`` is N, needed when ``mask`` is
    None."""
    if mask is None and tokens is None:
        raise ValueError("ksvd_loss_from_energies needs tokens (the sequence length N) when mask is None")
    n = mask.shape[1] if mask is not None else tokens
    j = _objective_from_sums(energy.sum(1), w_e, w_r, mask, n, reduction)
    return _loss_from_objective(j, mask, reduction)


def primal_kernel(phi_q: Tensor, phi_k: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """The implicit asymmetric kernel ``K_ij = <phi_q(x_i), phi_k(x_j)>`` per head (materialised, for analysis).

    This is the matrix whose SVD the layer's KSVD objective refers to; it is not row-stochastic and the
    layer's output is not ``K @ v``. Padded rows and columns (and, if causal, j > i) are zero.

    Args:
        phi_q, phi_k: ``(B, H, N, p)``. mask: ``(B, N)`` bool, True = real token.

    Returns:
        ``(B, H, N, N)``.
    """
    k = phi_q @ phi_k.transpose(-1, -2)  # (B, H, N, N)
    N = k.shape[-1]
    if causal:
        k = k.masked_fill(~torch.ones(N, N, dtype=torch.bool, device=k.device).tril(), 0.0)
    if mask is not None:
        k = k * (mask[:, None, :, None] & mask[:, None, None, :]).to(k.dtype)
    return k
