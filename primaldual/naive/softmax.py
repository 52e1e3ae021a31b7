"""Reference softmax attention: an explicit masked softmax over an explicit ``(N, N)`` mask."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["softmax_attention_ref"]


def softmax_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None = None,
    causal: bool = False,
    allowed: Tensor | None = None,
    scale: float | None = None,
    softcap: float | None = None,
) -> Tensor:
    """q, k ``(B, H, N, D)``, v ``(B, H, N, Dv)``; key_mask ``(B, N)`` True = real; allowed ``(N, N)``; softcap:
    logits ``s`` become ``softcap * tanh(s / softcap)`` (Gemma 2).

    A query with no admissible key returns zeros.
    """
    B, H, N, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    ok = torch.ones(B, 1, N, k.shape[2], dtype=torch.bool, device=q.device)
    if key_mask is not None:
        ok = ok & key_mask[:, None, None, :]
    if allowed is not None:
        ok = ok & allowed
    if causal:
        ok = ok & torch.ones(N, k.shape[2], dtype=torch.bool, device=q.device).tril()
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    # inadmissible scores out before the max: a large one (e.g. a padded key's) would underflow the admissible ones
    scores = scores.masked_fill(~ok, float("-inf"))
    top = scores.amax(-1, keepdim=True).detach()
    e = torch.exp(scores - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))  # exp(-inf) = 0
    den = e.sum(-1, keepdim=True)
    w = torch.where(den > 0, e / den.clamp_min(torch.finfo(q.dtype).tiny), torch.zeros_like(e))
    return torch.einsum("bhij,bhje->bhie", w, v)
