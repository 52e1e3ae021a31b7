"""Reference sparse attention: the dense pattern built by explicit loops, then a masked softmax.

With a key mask the pattern is between ranks among each sequence's real tokens (padded tokens rank after the real
ones, in order), so that padding never moves the global tokens, windows or strides.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .softmax import softmax_attention_ref

__all__ = ["sparse_attention_ref", "sparse_pattern_ref"]


def sparse_pattern_ref(n: int, window: int, stride: int, num_global: int, causal: bool) -> Tensor:
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            ok = abs(i - j) <= window
            ok = ok or (stride > 0 and (i - j) % stride == 0)
            ok = ok or i < num_global or j < num_global
            allowed[i, j] = ok and (j <= i or not causal)
    return allowed


def _ranks(row_mask: list[bool]) -> list[int]:
    """Rank of each position: real tokens counted first, in order, then the pads, in order."""
    real = [i for i, m in enumerate(row_mask) if m]
    pads = [i for i, m in enumerate(row_mask) if not m]
    rank = [0] * len(row_mask)
    for r, i in enumerate(real + pads):
        rank[i] = r
    return rank


def sparse_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    stride: int = 0,
    num_global: int = 0,
    key_mask: Tensor | None = None,
    causal: bool = False,
    softcap: float | None = None,
) -> Tensor:
    """q, k ``(B, H, N, D)``, v ``(B, H, N, Dv)``; the pattern's logits capped as ``softcap * tanh(s / softcap)``
    when ``softcap`` is given."""
    B, _, N, _ = q.shape
    by_rank = sparse_pattern_ref(N, window, stride, num_global, causal)
    if key_mask is None:
        return softmax_attention_ref(q, k, v, allowed=by_rank.to(q.device), softcap=softcap)
    pattern = torch.zeros(B, 1, N, N, dtype=torch.bool)
    for b in range(B):
        rank = _ranks(key_mask[b].tolist())
        for i in range(N):
            for j in range(N):
                pattern[b, 0, i, j] = by_rank[rank[i], rank[j]]
    return softmax_attention_ref(q, k, v, key_mask=key_mask, allowed=pattern.to(q.device), softcap=softcap)
