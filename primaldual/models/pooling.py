"""Masked pooling of ``(B, N, D)`` token states into ``(B, D)``."""

from __future__ import annotations

from torch import Tensor

__all__ = ["masked_mean"]


def masked_mean(h: Tensor, mask: Tensor | None) -> Tensor:
    """Mean over real tokens: h ``(B, N, D)``, mask ``(B, N)`` bool (True = real) -> ``(B, D)``."""
    if mask is None:
        return h.mean(dim=1)
    w = mask.unsqueeze(-1).to(h.dtype)  # (B, N, 1)
    return (h * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)
