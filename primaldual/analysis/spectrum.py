"""Singular-value spectra of attention matrices: normalised cumulative singular values and effective rank.

For a ``(N, N)`` attention matrix A of one sample and head (restricted to the sample's real tokens),
with singular values s_1 >= ... >= s_N:

* normalised cumulative singular values ``c_k = sum_{i<=k} s_i / sum_i s_i`` (the Primal-Attention paper's
  plot; with ``power=2`` the cumulative explained variance ``sum s_i^2 / sum s^2``);
* effective rank ``exp(H(p))`` with ``p_i = s_i / sum s`` (Roy and Vetterli, 2007);
* ``rank_at(c, q)``: the smallest k with ``c_k >= q`` (e.g. components for 90% of the mass).

Spectra of different lengths are averaged on two axes:

* the fraction ``k / N`` (curves resampled by linear interpolation on a fixed grid; the paper's axis), and
* the absolute component index ``k = 1..K`` (:func:`first_k`: the first ``K`` values of each curve; a sample
  with fewer than ``K`` real tokens is padded with its last value ``c_n``, which is 1 for any nonzero matrix,
  since its curve has saturated). For long sequences of low-rank matrices the ``k / N`` curve reaches 1 within
  the first grid points; the absolute axis shows where (k = 1, 2, 5, ...), and ``k90`` / ``k99`` count it.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["cumulative_spectrum", "effective_rank", "first_k", "layer_spectra", "rank_at", "resample"]


def cumulative_spectrum(a: Tensor, power: int = 1) -> Tensor:
    """``(..., N, M)`` matrices -> ``(..., min(N, M))`` normalised cumulative singular values (0 rows -> 0)."""
    s = torch.linalg.svdvals(a.double()).pow(power)
    total = s.sum(-1, keepdim=True)
    return torch.where(total > 0, s.cumsum(-1) / total.clamp_min(1e-300), torch.zeros_like(s))


def effective_rank(a: Tensor) -> Tensor:
    """``(..., N, M)`` -> ``(...)`` effective rank exp(entropy of the normalised singular values)."""
    s = torch.linalg.svdvals(a.double())
    p = s / s.sum(-1, keepdim=True).clamp_min(1e-300)
    h = -(p * p.clamp_min(1e-300).log()).sum(-1)
    return h.exp()


def rank_at(cum: Tensor, q: float) -> Tensor:
    """Smallest k (1-based) with ``cum[..., k-1] >= q``."""
    return (cum < q - 1e-12).sum(-1) + 1


def resample(cum: Tensor, points: int = 50) -> Tensor:
    """Resample a ``(..., K)`` cumulative curve on the grid k/K = 1/points, ..., 1 (linear interpolation).

    The curve is read as passing through 0 at k = 0, so a grid point below 1/K lies on the segment from 0 to
    ``c_1`` (no flat plateau when K < points).
    """
    K = cum.shape[-1]
    ext = torch.cat([torch.zeros_like(cum[..., :1]), cum], dim=-1)  # (..., K + 1): c_0 = 0, c_1, ..., c_K
    grid = torch.linspace(1.0 / points, 1.0, points, dtype=torch.float64) * K  # fractional index into ext
    lo = grid.floor().clamp(0, K).long()
    hi = (lo + 1).clamp(max=K)
    frac = (grid - lo).clamp(0, 1)
    return ext[..., lo] * (1 - frac) + ext[..., hi] * frac


def first_k(cum: Tensor, k: int) -> Tensor:
    """The first ``k`` values of a ``(..., n)`` cumulative curve -> ``(..., k)``.

    A curve shorter than ``k`` is padded with its last value (``c_n = 1`` unless the matrix is zero): beyond its
    n components a sample has all of its mass, so averaging padded curves of different lengths stays exact.
    """
    n = cum.shape[-1]
    if n >= k:
        return cum[..., :k]
    return torch.cat([cum, cum[..., -1:].expand(*cum.shape[:-1], k - n)], dim=-1)


def layer_spectra(
    weights: Tensor, mask: Tensor | None = None, points: int = 50, power: int = 1, k_max: int = 64
) -> dict[str, Tensor]:
    """Per-head statistics of one layer's ``(B, H, N, N)`` weights over a batch.

    Each sample's matrix is cut to its real tokens (``mask`` ``(B, N)``, True = real; None = all real) before
    the SVD. N may be any size (no power of two assumed); samples with fewer than 2 real tokens are skipped.

    Returns:
        Means over the kept samples:
        ``curve`` ``(H, points)`` cumulative spectrum on the ``k / N`` grid ``1/points, ..., 1``;
        ``curve_k`` ``(H, K)`` cumulative spectrum at k = 1..K, ``K = min(k_max, largest n)`` (see :func:`first_k`);
        ``effective_rank`` ``(H,)``; ``rank90`` / ``rank99`` ``(H,)`` fraction of the n components needed for
        90% / 99% of the mass; ``k90`` / ``k99`` ``(H,)`` the same as absolute counts;
        ``tokens`` ``()`` mean number of real tokens n.
    """
    B, H, N, _ = weights.shape
    real = [(b, mask[b].nonzero().squeeze(-1) if mask is not None else torch.arange(N)) for b in range(B)]
    real = [(b, idx) for b, idx in real if idx.numel() >= 2]
    if not real:
        raise ValueError("no sample has at least 2 real tokens; cannot compute a spectrum")
    K = min(k_max, max(idx.numel() for _, idx in real))
    stats: dict[str, list[Tensor]] = {k: [] for k in ("curve", "curve_k", "effective_rank", "k90", "k99", "n")}
    for b, idx in real:
        n = idx.numel()
        a = weights[b][:, idx][:, :, idx]  # (H, n, n) real tokens only
        cum = cumulative_spectrum(a, power)  # (H, n)
        stats["curve"].append(resample(cum, points))
        stats["curve_k"].append(first_k(cum, K))
        stats["effective_rank"].append(effective_rank(a))
        stats["k90"].append(rank_at(cum, 0.9).double())
        stats["k99"].append(rank_at(cum, 0.99).double())
        stats["n"].append(torch.tensor(float(n), dtype=torch.float64))
    mean = {k: torch.stack(v).mean(0) for k, v in stats.items()}
    n = torch.stack(stats["n"])  # (S,)
    return {
        "curve": mean["curve"],
        "curve_k": mean["curve_k"],
        "effective_rank": mean["effective_rank"],
        "rank90": (torch.stack(stats["k90"]) / n[:, None]).mean(0),
        "rank99": (torch.stack(stats["k99"]) / n[:, None]).mean(0),
        "k90": mean["k90"],
        "k99": mean["k99"],
        "tokens": mean["n"],
    }
