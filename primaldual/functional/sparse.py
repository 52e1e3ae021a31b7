"""Sparse softmax attention on ``(B, H, N, D)``: sliding window, optional strided and global tokens.

Query i may attend key j when any of these holds (and j is a real token, and j <= i if causal):

* local: ``|i - j| <= window``;
* strided (``stride > 0``): ``(i - j) % stride == 0`` (Sparse-Transformer style);
* global (``num_global > 0``): ``i < num_global`` or ``j < num_global`` (Longformer-style tokens at
  the start of the sequence that see, and are seen by, everyone).

With a ``key_mask``, i and j are **ranks among each sequence's real tokens**, not positions: the first
``num_global`` real tokens are global and windows and strides count real tokens, so the output at a real token
does not depend on how much padding surrounds it, on either side or inside. Padded queries rank after every real
token of their sequence (their rows are arbitrary; layers zero them). Without a mask, ranks are positions.

The fast path never builds an N x N matrix. With a ``key_mask`` it moves each sequence's real tokens to the
front (a stable sort of the mask), runs on that order, where ranks are positions, and moves the outputs back:
two O(N D) gathers. Then queries are processed in blocks of ``window`` tokens
against three neighbouring key blocks (local), the global keys, and the keys of the query's residue
class (strided); the three candidate sets are made disjoint and share one softmax. Time and memory
are O(N (window + num_global + N / stride)). :func:`sparse_pattern` builds the dense boolean pattern,
used by the reference, by ``need_weights`` and by the tests.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_qkv
from ..options import check_bool, check_number
from .softmax import softmax_attention

__all__ = ["check_pattern", "real_first_order", "sparse_attention", "sparse_pattern"]


def sparse_pattern(
    n: int, window: int, stride: int = 0, num_global: int = 0, causal: bool = False, device=None
) -> Tensor:
    """Dense ``(N, N)`` boolean pattern, True where query i may attend key j (padding not included)."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    allowed = (i - j).abs() <= window
    if stride > 0:
        allowed |= (i - j) % stride == 0
    if num_global > 0:
        allowed |= (i < num_global) | (j < num_global)
    if causal:
        allowed &= j <= i
    return allowed


def real_first_order(key_mask: Tensor) -> Tensor:
    """``(B, N)`` permutation of each row: its real tokens first, in order, then its pads, in order.

    Index ``r`` of the result is the position of the token of rank ``r``; for a real token the rank is the number
    of real tokens before it.
    """
    # a stable sort on "is padding" keeps the order within the real tokens and within the pads
    return torch.sort((~key_mask).to(torch.uint8), dim=1, stable=True).indices


def check_pattern(window: int, stride: int, num_global: int) -> None:
    """Validate the sparse pattern options; raises ValueError naming the option."""
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (keys within |i - j| <= window), got {window!r}")
    if not isinstance(stride, int) or stride < 0:
        raise ValueError(f"stride must be an int >= 0 (0 = no strided keys), got {stride!r}")
    if not isinstance(num_global, int) or num_global < 0:
        raise ValueError(f"num_global must be an int >= 0, got {num_global!r}")


def sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    stride: int = 0,
    num_global: int = 0,
    key_mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Sparse attention (self-attention: q, k, v share N).

    Args:
        q, k: ``(B, H, N, D)``; v: ``(B, H, N, Dv)``.
        window: local radius (keys with ``|i - j| <= window``).
        stride: also attend keys with ``(i - j) % stride == 0`` (0 = off).
        num_global: the first ``num_global`` tokens are global.
        key_mask: ``(B, N)`` bool, True = real key. The pattern is then counted over each sequence's real
            tokens (see the module docstring).
        need_weights: use the dense path and return ``(B, H, N, N)`` weights (zeros off-pattern).
        softcap: None, or a cap ``c > 0`` on the scaled logits, ``s -> c * tanh(s / c)`` (Gemma 2's sliding layers).

    Returns:
        ``(out (B, H, N, Dv), weights or None)``.
    """
    key_mask = check_qkv(q, k, v, key_mask)
    check_pattern(window, stride, num_global)
    check_bool("causal", causal)
    check_bool("need_weights", need_weights)
    check_number("scale", scale, allow_none=True)
    check_number("dropout_p", dropout_p, low=0, high=1, high_open=True)
    check_number("softcap", softcap, low=0, low_open=True, allow_none=True)
    B, H, N, D = q.shape
    if k.shape[2] != N:
        raise ValueError(f"sparse attention is self-attention: q and k lengths differ ({N} vs {k.shape[2]})")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if q.dtype == torch.float16:
        # q k^T of inputs of a few hundred passes float16's 65,504 before the softmax can scale it: compute in
        # float32 (as SDPA's CPU kernel accumulates) and return float16
        no_autocast = torch.amp.is_autocast_available(q.device.type)
        with torch.autocast(q.device.type, enabled=False) if no_autocast else contextlib.nullcontext():
            out, weights = sparse_attention(
                q.float(),
                k.float(),
                v.float(),
                window=window,
                stride=stride,
                num_global=num_global,
                key_mask=key_mask,
                causal=causal,
                scale=scale,
                dropout_p=dropout_p,
                need_weights=need_weights,
                softcap=softcap,
            )
        return out.to(q.dtype), None if weights is None else weights.to(q.dtype)
    if need_weights:
        pattern = sparse_pattern(N, window, stride, num_global, causal, q.device)[None, None]  # (1, 1, N, N)
        if key_mask is not None:  # the pattern between ranks: rank[b, i] is where position i sits in real-first order
            rank = real_first_order(key_mask).argsort(1)  # (B, N)
            pattern = pattern[0, 0][rank[:, :, None], rank[:, None, :]][:, None]  # (B, 1, N, N)
        return softmax_attention(
            q,
            k,
            v,
            key_mask=key_mask,
            attn_mask=pattern,
            scale=scale,
            dropout_p=dropout_p,
            need_weights=True,
            backend="eager",
            softcap=softcap,
        )
    if key_mask is None:  # ranks are positions
        return _blocked(q, k, v, window, stride, num_global, None, causal, scale, dropout_p, softcap), None
    # real tokens first: there a token's position is its rank, so the positional kernel counts real tokens
    order = real_first_order(key_mask)  # (B, N)
    qo, ko, vo = (_gather_tokens(t, order) for t in (q, k, v))  # (B, H, N, D) each, real-first order
    out = _blocked(qo, ko, vo, window, stride, num_global, key_mask.gather(1, order), causal, scale, dropout_p, softcap)
    return _gather_tokens(out, order.argsort(1)), None  # (B, H, N, Dv) back in the input order


def _gather_tokens(t: Tensor, order: Tensor) -> Tensor:
    """``t`` ``(B, H, N, D)`` with its tokens in the ``(B, N)`` ``order`` of each row."""
    rows = torch.arange(t.shape[0], device=t.device)[:, None]  # (B, 1)
    # advanced indices around a slice put their dims first: (B, N, H, D); a view back to (B, H, N, D)
    return t[rows, :, order].transpose(1, 2)


def _blocked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    stride: int,
    num_global: int,
    key_mask: Tensor | None,
    causal: bool,
    scale: float,
    dropout_p: float,
    softcap: float | None = None,
) -> Tensor:
    B, H, N, D = q.shape

    def logits(a: Tensor, b: Tensor) -> Tensor:  # scaled (and capped) q k^T of two blocks
        s = torch.matmul(a, b.transpose(-2, -1)) * scale
        return s if softcap is None else softcap * torch.tanh(s / softcap)

    E = v.shape[-1]
    G = min(num_global, N)
    neg = torch.finfo(q.dtype).min
    dev = q.device
    kmask = key_mask if key_mask is not None else torch.ones(B, N, dtype=torch.bool, device=dev)

    # ---- local: query block m against key blocks m-1, m, m+1 (a block size b >= window covers the band; b = N
    # covers every key, so a window wider than the sequence, such as a Mistral layer's 4,096, costs no more than N)
    b = max(min(window, N), 1)
    M = math.ceil(N / b)
    P = M * b - N
    qp = F.pad(q, (0, 0, 0, P)).reshape(B, H, M, b, D)  # (B, H, M, b, D)
    kp = F.pad(k, (0, 0, b, P + b))  # (B, H, (M+2) b, D): one zero block each side
    vp = F.pad(v, (0, 0, b, P + b))
    mp = F.pad(kmask, (b, P + b))  # (B, (M+2) b), pads False
    idx = torch.arange(M, device=dev)[:, None] * b + torch.arange(3 * b, device=dev)  # (M, 3b) padded coords
    k_loc = kp[:, :, idx]  # (B, H, M, 3b, D)
    v_loc = vp[:, :, idx]  # (B, H, M, 3b, E)
    qi = torch.arange(M * b, device=dev).reshape(M, b, 1)  # (M, b, 1) query positions
    kj = (idx - b)[:, None, :]  # (M, 1, 3b) key positions (may be <0 or >=N: padding)
    loc_ok = ((qi - kj).abs() <= window) & mp[:, idx][:, :, None, :]  # (B, M, b, 3b)
    loc_ok &= kj >= G  # global keys are handled by the global set
    if causal:
        loc_ok &= kj <= qi
    s_loc = logits(qp, k_loc)  # (B, H, M, b, 3b)
    s_loc = s_loc.masked_fill(~loc_ok[:, None], neg).reshape(B, H, M * b, 3 * b)  # (B, H, Np, 3b)
    ok_parts = [loc_ok.reshape(B, 1, M * b, 3 * b)]
    scores = [s_loc]

    i_all = torch.arange(M * b, device=dev)[:, None]  # (Np, 1)
    q_flat = qp.reshape(B, H, M * b, D)  # (B, H, Np, D)
    if G > 0:  # ---- global keys, seen by every query
        jg = torch.arange(G, device=dev)[None, :]
        g_ok = kmask[:, None, :G] & ((jg <= i_all) if causal else torch.ones_like(jg <= i_all))  # (B, Np, G)
        s_g = logits(q_flat, k[:, :, :G])  # (B, H, Np, G)
        scores.append(s_g.masked_fill(~g_ok[:, None], neg))
        ok_parts.append(g_ok[:, None])
    if stride > 0:  # ---- strided keys of the query's residue class, outside the band and globals
        S = stride
        R = math.ceil(M * b / S)
        Pq = R * S - M * b
        qs = F.pad(q_flat, (0, 0, 0, Pq)).reshape(B, H, R, S, D).transpose(2, 3)  # (B, H, S, R, D)
        Pk = R * S - N
        ks = F.pad(k, (0, 0, 0, Pk)).reshape(B, H, R, S, D).transpose(2, 3)  # (B, H, S, R, D)
        vs = F.pad(v, (0, 0, 0, Pk)).reshape(B, H, R, S, E).transpose(2, 3)  # (B, H, S, R, E)
        ms = F.pad(kmask, (0, Pk)).reshape(B, R, S).transpose(1, 2)  # (B, S, R)
        pos = torch.arange(R * S, device=dev).reshape(R, S).T  # (S, R) position of each slot
        ii, jj = pos[:, :, None], pos[:, None, :]  # (S, R, 1), (S, 1, R)
        st_ok = ((ii - jj).abs() > window) & (jj >= G) & ms[:, :, None, :]  # (B, S, R, R)
        if causal:
            st_ok &= jj <= ii
        s_st = logits(qs, ks)  # (B, H, S, R, R)
        s_st = s_st.masked_fill(~st_ok[:, None], neg)
        # back to query order: (B, H, S, R, R) -> (B, H, R, S, R) -> (B, H, R*S, R)
        s_st = s_st.transpose(2, 3).reshape(B, H, R * S, R)[:, :, : M * b]
        st_ok_q = st_ok.transpose(1, 2).reshape(B, 1, R * S, R)[:, :, : M * b]
        scores.append(s_st)
        ok_parts.append(st_ok_q)

    all_ok = torch.cat([o.expand(B, 1, M * b, o.shape[-1]) for o in ok_parts], -1)  # (B, 1, Np, L)
    has_key = all_ok.any(-1, keepdim=True)  # (B, 1, Np, 1)
    w = torch.cat(scores, -1).softmax(-1)  # (B, H, Np, L)
    w = w.masked_fill(~all_ok, 0.0) * has_key
    if dropout_p > 0:
        w = F.dropout(w, p=dropout_p)
    sizes = [s.shape[-1] for s in scores]
    parts = list(w.split(sizes, -1))
    out = torch.matmul(parts.pop(0).reshape(B, H, M, b, 3 * b), v_loc).reshape(B, H, M * b, E)  # (B, H, Np, E)
    if G > 0:
        out = out + torch.matmul(parts.pop(0), v[:, :, :G])
    if stride > 0:
        w_st = F.pad(parts.pop(0), (0, 0, 0, R * S - M * b))  # (B, H, R*S, R)
        w_st = w_st.reshape(B, H, R, S, R).transpose(2, 3)  # (B, H, S, R, R)
        o_st = torch.matmul(w_st, vs).transpose(2, 3).reshape(B, H, R * S, E)[:, :, : M * b]  # (B, H, Np, E)
        out = out + o_st
    out = out[:, :, :N]
    if G > 0:  # global queries see every key: a dense (G x N) softmax overwrites their rows
        gq_allowed = kmask[:, None, None, :]  # (B, 1, 1, N)
        if causal:
            # a global query i sees every key j <= i: the pattern's first G rows, (G, N), without its N x N
            upto = torch.arange(N, device=dev)[None, :] <= torch.arange(G, device=dev)[:, None]  # (G, N)
            gq_allowed = gq_allowed & upto[None, None]
        o_g, _ = softmax_attention(
            q[:, :, :G],
            k,
            v,
            attn_mask=gq_allowed.expand(B, 1, G, N),
            scale=scale,
            dropout_p=dropout_p,
            backend="eager",
            softcap=softcap,
        )
        out = torch.cat([o_g, out[:, :, G:]], 2)
    return out
