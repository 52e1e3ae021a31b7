"""Reference sparse attention: the dense pattern built by explicit loops, then a masked softmax."""

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


def sparse_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    stride: int = 0,
    num_global: int = 0,
    key_mask: Tensor | None = None,
    causal: bool = False,
) -> Tensor:
    pattern = sparse_pattern_ref(q.shape[2], window, stride, num_global, causal).to(q.device)
    return softmax_attention_ref(q, k, v, key_mask=key_mask, allowed=pattern)
