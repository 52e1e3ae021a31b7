"""Reference Attention-BN / SH / BN+SH: explicit windows, explicit statistics, one query at a time.

Everything is spelled out: the pooling windows are Python lists, each pooled key is the mean of the real tokens
of its window, a query's statistics are the mean and variance of exactly the keys it may see, and the query and
those keys are normalised before the scores are formed (no shift-invariance shortcut, which is what the fast
path relies on for causal BN and what the comparison therefore checks).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["pooling_windows_ref", "svr_attention_ref"]


def pooling_windows_ref(
    n: int, factor: int, pooling: str = "avg", grid: tuple[int, int] | None = None, num_cls: int = 0
) -> list[tuple[list[int], int]]:
    """Each pooled key as ``(token positions it pools, last position it depends on for causal use)``."""
    if grid is None:
        out = []
        for w in range(math.ceil(n / factor)):
            if pooling == "stride":
                out.append(([w * factor], w * factor))
            else:
                out.append((list(range(w * factor, min((w + 1) * factor, n))), (w + 1) * factor - 1))
        return out
    gh, gw = grid
    out = [([c], c) for c in range(num_cls)]
    for a in range(0, gh, factor):
        for b in range(0, gw, factor):
            rows = [a] if pooling == "stride" else range(a, min(a + factor, gh))
            cols = [b] if pooling == "stride" else range(b, min(b + factor, gw))
            toks = [num_cls + r * gw + c for r in rows for c in cols]
            out.append((toks, max(toks)))
    return out


def svr_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    kernel: str = "softmax",
    key_mask: Tensor | None = None,
    causal: bool = False,
    bn: bool = False,
    beta: float = 1.0,
    divide_std: bool = True,
    bn_eps: float = 1e-5,
    stats_over: str = "tokens",
    stats_from: str = "pooled",
    factors: list[int] | None = None,
    pooling: str = "avg",
    grid: tuple[int, int] | None = None,
    num_cls: int = 0,
    eps: float = 1e-6,
) -> Tensor:
    """q, k ``(B, H, N, D)``, v ``(B, H, N, Dv)``; key_mask ``(B, N)`` True = real. Returns ``(B, H, N, Dv)``.

    ``factors`` None means every head at full resolution.
    """
    B, H, N, D = q.shape
    km = torch.ones(B, N, dtype=torch.bool) if key_mask is None else key_mask.cpu()
    factors = [1] * H if factors is None else factors
    out = torch.zeros(B, H, N, v.shape[-1], dtype=v.dtype, device=v.device)
    for h in range(H):
        wins = pooling_windows_ref(N, factors[h], pooling, grid, num_cls)
        # pooled keys/values and whether each has a real token, per sample
        pk, pv, preal = [], [], []
        for b in range(B):
            ks, vs, rs = [], [], []
            for toks, _ in wins:
                real = [t for t in toks if km[b, t]]
                ks.append(k[b, h, real].mean(0) if real else torch.zeros_like(k[b, h, 0]))
                vs.append(v[b, h, real].mean(0) if real else torch.zeros_like(v[b, h, 0]))
                rs.append(bool(real))
            pk.append(torch.stack(ks))
            pv.append(torch.stack(vs))
            preal.append(rs)
        for i in range(N):
            seen = [w for w, (_, end) in enumerate(wins) if not causal or end <= i]
            stats = _stats_ref(k[:, h], pk, preal, km, seen, i, causal, stats_over, stats_from) if bn else None
            for b in range(B):
                idx = [w for w in seen if preal[b][w]]
                if not idx:
                    continue
                qi, kj, vj = q[b, h, i], pk[b][idx], pv[b][idx]
                if bn:
                    mu, var = stats[b]
                    s = (var + bn_eps).sqrt() if divide_std else torch.ones_like(var)
                    qi, kj = (qi - beta * mu) / s, (kj - beta * mu) / s
                if kernel == "softmax":
                    a = torch.softmax(kj @ qi / math.sqrt(D), 0)
                else:
                    a = (F.elu(kj) + 1) @ (F.elu(qi) + 1)
                    a = a / (a.sum() + eps)
                out[b, h, i] = a @ vj
    return out


def _stats_ref(kh, pk, preal, km, seen, i, causal, stats_over, stats_from):
    """Per-sample (mu, var) over the keys query i may see (pooled or full-resolution)."""
    B = kh.shape[0]
    sets = []
    for b in range(B):
        if stats_from == "full":
            sets.append(kh[b, [j for j in range(kh.shape[1]) if km[b, j] and (not causal or j <= i)]])
        else:
            sets.append(pk[b][[w for w in seen if preal[b][w]]])
    if stats_over == "batch":
        sets = [torch.cat(sets, 0)] * B
    res = []
    for s in sets:
        if s.shape[0] == 0:
            res.append((torch.zeros_like(kh[0, 0]), torch.zeros_like(kh[0, 0])))
        else:
            mu = s.mean(0)
            res.append((mu, (s - mu).pow(2).mean(0)))
    return res
