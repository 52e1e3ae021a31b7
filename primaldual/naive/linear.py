"""Reference linear attention: one query at a time, sums written out over admissible keys."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["linear_attention_ref"]


def linear_attention_ref(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None, causal: bool = False, eps: float = 1e-6
) -> Tensor:
    """out_i = sum_{j admissible} phi(q_i).phi(k_j) v_j / (sum_{j admissible} phi(q_i).phi(k_j) + eps)."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    B, H, N, _ = q.shape
    outs = []
    for i in range(N):
        ok = torch.ones(B, k.shape[2], dtype=torch.bool, device=q.device)
        if key_mask is not None:
            ok = ok & key_mask
        if causal:
            ok = ok & (torch.arange(k.shape[2], device=q.device) <= i)
        a = torch.einsum("bhd,bhjd->bhj", fq[:, :, i], fk) * ok[:, None, :]  # (B, H, Nk)
        outs.append(torch.einsum("bhj,bhje->bhe", a, v) / (a.sum(-1, keepdim=True) + eps))
    return torch.stack(outs, 2)
