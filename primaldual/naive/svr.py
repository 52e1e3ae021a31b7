"""Reference Attention-BN / SH / BN+SH: explicit windows, explicit statistics, one query at a time.

Everything is spelled out: the pooling windows are Python lists cut from each sequence's real tokens in order
(so padding never shifts or enters a 1-D window), each pooled key is the mean of the real tokens of its window, a
query's statistics are the mean and variance of exactly the keys it may see, and the query and those keys are
normalised before the scores are formed (no shift-invariance shortcut, which is what the fast path relies on for
causal BN and what the comparison therefore checks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["pooling_windows_ref", "svr_attention_ref"]


def pooling_windows_ref(
    n: int,
    factor: int,
    pooling: str = "avg",
    grid: tuple[int, int] | None = None,
    num_cls: int = 0,
    real: Sequence[int] | None = None,
) -> list[tuple[list[int], int]]:
    """Each pooled key as ``(token positions it pools, last position it depends on for causal use)``.

    1-D: the windows are cut from ``real`` (the real-token positions in order; None: all ``n`` positions), window
    w pooling the real tokens of rank ``w r .. (w + 1) r - 1`` (``stride``: the one of rank ``w r``). The last
    position is that of the rank the window needs to be complete; a rank the sequence does not reach (a partial
    last window) is given the position ``n + (rank - len(real))``, past the end, so it is never visible.
    Grid: spatial ``r x r`` windows at fixed positions (padding cannot move them; masked patches are skipped by
    the caller).
    """
    if grid is None:
        real = list(range(n)) if real is None else list(real)
        out = []
        for w in range(math.ceil(len(real) / factor)):
            last = w * factor if pooling == "stride" else (w + 1) * factor - 1
            toks = [real[w * factor]] if pooling == "stride" else real[w * factor : (w + 1) * factor]
            out.append((toks, real[last] if last < len(real) else n + last - len(real)))
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

    ``factors`` None means every head at full resolution. Every query row is computed, pads included (the
    layers zero those rows).
    """
    B, H, N, D = q.shape
    km = torch.ones(B, N, dtype=torch.bool) if key_mask is None else key_mask.cpu()
    factors = [1] * H if factors is None else factors
    out = torch.zeros(B, H, N, v.shape[-1], dtype=v.dtype, device=v.device)
    for h in range(H):
        # per sample: the pooled keys / values with a real token, and the position from which each is visible
        pk, pv, ends = [], [], []
        for b in range(B):
            real_pos = [t for t in range(N) if km[b, t]]
            ks, vs, es = [], [], []
            for toks, end in pooling_windows_ref(N, factors[h], pooling, grid, num_cls, real_pos):
                real = [t for t in toks if km[b, t]]  # grid windows may hold missing patches
                if real:
                    ks.append(k[b, h, real].mean(0))
                    vs.append(v[b, h, real].mean(0))
                    es.append(end)
            pk.append(torch.stack(ks) if ks else k.new_zeros(0, D))
            pv.append(torch.stack(vs) if vs else v.new_zeros(0, v.shape[-1]))
            ends.append(es)
        for i in range(N):
            seen = [[w for w, end in enumerate(ends[b]) if not causal or end <= i] for b in range(B)]
            stats = _stats_ref(k[:, h], pk, km, seen, i, causal, stats_over, stats_from) if bn else None
            for b in range(B):
                if not seen[b]:
                    continue
                qi, kj, vj = q[b, h, i], pk[b][seen[b]], pv[b][seen[b]]
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


def _stats_ref(kh, pk, km, seen, i, causal, stats_over, stats_from):
    """Per-sample (mu, var) over the keys query i may see (pooled or full-resolution real keys)."""
    B = kh.shape[0]
    sets = []
    for b in range(B):
        if stats_from == "full":
            sets.append(kh[b, [j for j in range(kh.shape[1]) if km[b, j] and (not causal or j <= i)]])
        else:
            sets.append(pk[b][seen[b]])
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
