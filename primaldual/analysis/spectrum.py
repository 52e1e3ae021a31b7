"""Singular-value spectra of attention matrices: normalised cumulative singular values and effective rank.

For a ``(N, N)`` attention matrix A of one sample and head (restricted to the sample's real tokens),
with singular values s_1 >= ... >= s_N:

* normalised cumulative singular values ``c_k = sum_{i<=k} s_i / sum_i s_i`` (the Primal-Attention paper's
  plot; with ``power=2`` the cumulative explained variance ``sum s_i^2 / sum s^2``);
* effective rank ``exp(H(p))`` with ``p_i = s_i / sum s`` (Roy and Vetterli, 2007);
* ``rank_at(c, q)``: the smallest k with ``c_k >= q`` (e.g. components for 90% of the mass).

Spectra of different lengths are compared on a common grid of the fraction ``k / N`` (curves are
resampled by linear interpolation), so variable-length sequences can be averaged.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["cumulative_spectrum", "effective_rank", "layer_spectra", "rank_at", "resample"]


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


def layer_spectra(weights: Tensor, mask: Tensor | None = None, points: int = 50, power: int = 1) -> dict[str, Tensor]:
    """Per-head statistics of one layer's ``(B, H, N, N)`` weights over a batch.

    Each sample's matrix is cut to its real tokens (``mask`` ``(B, N)``, True = real) before the SVD.

    Returns:
        ``curve`` ``(H, points)`` mean resampled cumulative spectrum, ``effective_rank`` ``(H,)``,
        ``rank90`` ``(H,)`` mean fraction of components reaching 90%, ``rank99`` likewise.
    """
    B, H, N, _ = weights.shape
    curves, eranks, r90, r99 = [], [], [], []
    for b in range(B):
        idx = mask[b].nonzero().squeeze(-1) if mask is not None else torch.arange(N)
        if idx.numel() < 2:
            continue
        a = weights[b][:, idx][:, :, idx]  # (H, n, n) real tokens only
        cum = cumulative_spectrum(a, power)
        curves.append(resample(cum, points))
        eranks.append(effective_rank(a))
        r90.append(rank_at(cum, 0.9).double() / idx.numel())
        r99.append(rank_at(cum, 0.99).double() / idx.numel())
    if not curves:
        raise ValueError("no sample has at least 2 real tokens; cannot compute a spectrum")
    return {
        "curve": torch.stack(curves).mean(0),
        "effective_rank": torch.stack(eranks).mean(0),
        "rank90": torch.stack(r90).mean(0),
        "rank99": torch.stack(r99).mean(0),
    }
