"""Attention-BN, Attention-SH and BN+SH kernels on ``(B, H, N, D)`` tensors (Nguyen et al., ICLR 2023).

The SVR framework reads attention as a support vector expansion whose training inputs are the keys. Two
mechanisms follow from changing the SVR's primal:

* **Attention-BN**: a batch-normalisation layer in front of the feature map. The "batch" is the SVR's training
  set, the keys of one sequence and head; queries (test points) are normalised with the keys' statistics::

      mu = mean_j k_j,   s = sqrt(var_j k_j + eps),   q^ = (q - beta mu) / s,   k^ = (k - beta mu) / s

* **Attention-SH** (scaled heads): head h fits its SVR on fewer points, its keys and values downsampled
  along the tokens by a factor ``r_h``; queries stay at full length, so every head still outputs N vectors.

Both wrap the existing kernels (:func:`~primaldual.functional.softmax.softmax_attention`,
:func:`~primaldual.functional.linear.linear_attention`). Heads sharing a factor are processed as one group
(one batched call per distinct factor, not one per head) and the group outputs are concatenated back into
head order.

The defaults are **this project's reading of the derivation**, not the paper's numbers (the paper's code and
hyperparameters are not public): ``beta=1``, divide by the standard deviation, ``eps=1e-5``, statistics over the
real tokens of each sequence, factor ladder ``1, 1, 2, 2, 4, 4, ...`` (``1, 2, 4`` below 4 heads), average pooling.

Choices made here, and why:

* **Padding-aware statistics and pooling, windows aligned to the real tokens.** Statistics use real keys only.
  The pooling windows of a sequence are cut from its real tokens in order (window w holds the real tokens of
  rank ``w r .. (w + 1) r - 1``, rank = index among the real tokens), so they start at the first real token, pads
  never enter a window, and the last, partial window is what an unpadded sequence of that length has; a window
  slot with no real token is masked out of the keys. Adding pads anywhere (left, right, inside) therefore never
  changes an output at a real token. A factor of 1 pools nothing (each token is its own key).
* **Half precision.** Under float16 / bfloat16 (inputs, or CPU/CUDA autocast to those) Attention-BN computes its
  statistics, the normalisation and the kernel in float32 with autocast off, and returns the input dtype:
  prefix sums of squared keys and the ``1 / s^2`` rescaling pass float16's 65,504 (and ``1 / eps`` does at a
  query that has seen one key), and the shift-invariance shortcut leaves logits too large for float16's
  resolution.
* **Causal BN uses prefix statistics.** Whole-sequence statistics would leak the future, so query i is
  normalised, together with the keys it sees, with the statistics of the keys it may see (``j <= i``, or the
  pooled windows visible to it). For softmax this stays one ``O(N^2)`` pass: with per-query statistics
  ``(mu_i, s_i)``, ``q^_i . k^_j = q~_i . k_j - q~_i . beta mu_i`` where ``q~_i = (q_i - beta mu_i) / s_i^2``, and the
  second term is constant over j, which the softmax ignores. The non-causal softmax path uses the same identity
  (only the queries are transformed), which is exact and saves normalising the keys; the reference
  (:mod:`primaldual.naive.svr`) normalises both explicitly, so the tests check the identity. Linear attention applies a non-linear feature
  map to ``k^_j``, so per-query key statistics would need an ``O(N^2)`` kernel: causal linear BN is refused.
* **Causal SH without leakage.** A pooled key depends on every token of its window, so query i sees the
  windows that *end* at or before i. With ``c_i`` the number of real tokens at positions ``<= i``, average
  pooling shows the complete windows, ``w < floor(c_i / r)`` (window w is visible once its last real token, of
  rank ``(w + 1) r - 1``, has been seen; the partial window at the end stays hidden until it fills); strided
  subsampling shows the sampled tokens seen so far, ``w < ceil(c_i / r)``. Without padding ``c_i = i + 1``.
  A query before the end of the first window of a pooled head gets a zero output from that head. The decoding
  path reruns the causal forward on the prefix, so it sees the same windows.
* **Weights at token resolution.** ``need_weights`` returns ``(B, H, N, N)``: the weight of a pooled key is
  spread over the tokens it pools with the pooling weights (average pooling: equally over the window's real
  tokens; strided: all on the sampled token), i.e. ``weights = A P`` with ``A`` the ``(N, N_h)`` attention over
  pooled keys and ``P`` the ``(N_h, N)`` pooling matrix, so ``weights @ v`` reproduces the output with
  full-resolution values.
* **2-D pooling** (``grid=(gh, gw)``): the first ``num_cls`` tokens (CLS and the like) stay unpooled, the next
  ``gh * gw`` tokens are a row-major patch grid pooled by ``r x r`` windows (so ``r_h`` is the factor per axis).
  The windows are spatial, so they cannot follow padding: the sequence must be exactly ``num_cls + gh * gw``
  tokens (padding a grid sequence is an error), and a False in the mask means a *missing patch* in place, left
  out of the mean of its window (a window with no real patch is masked).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_qkv
from .linear import elu_feature_map, linear_attention
from .softmax import softmax_attention

__all__ = [
    "bn_attention",
    "bn_sh_attention",
    "check_bn",
    "check_factors",
    "check_pool",
    "downsample",
    "factor_ladder",
    "key_statistics",
    "memory_ratio",
    "pooled_key_ends",
    "pooled_visibility",
    "pooling_matrix",
    "prefix_key_statistics",
    "real_first_order",
    "sh_attention",
    "svr_attention",
]

_KERNELS = ("softmax", "linear")


# ----------------------------------------------------------------------------------------------------------
# Attention-BN: key statistics
# ----------------------------------------------------------------------------------------------------------


def check_bn(beta: float, eps: float, stats_over: str) -> None:
    """Validate the Attention-BN options (``eps`` is ``bn_eps``); raises ValueError naming the option."""
    if torch.compiler.is_compiling():  # floats traced with dynamic=True are symbolic; the eager calls check them
        return
    if not isinstance(beta, (int, float)) or not math.isfinite(beta):
        raise ValueError(f"beta must be a finite number (weight on the key mean), got {beta!r}")
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a number > 0 (added to the key variance), got {eps!r}")
    if stats_over not in ("tokens", "batch"):
        raise ValueError(f"stats_over must be 'tokens' (per sequence) or 'batch' (batch x tokens), got {stats_over!r}")


def key_statistics(
    k: Tensor, key_mask: Tensor | None = None, *, stats_over: str = "tokens", eps: float = 1e-5
) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation of the keys over real tokens, per head and channel.

    Args:
        k: ``(B, H, N, D)`` keys.
        key_mask: ``(B, N)`` bool, True = real token; padded keys are excluded.
        stats_over: ``"tokens"`` (per sequence) or ``"batch"`` (pooled over batch x tokens).
        eps: added to the (biased) variance before the square root.

    Returns:
        ``(mu, std)``, each ``(B, H, 1, D)`` (``(1, H, 1, D)`` for ``stats_over="batch"``). A sequence without a
        real token gets ``mu = 0`` and ``std = sqrt(eps)``.
    """
    dims = (0, 2) if stats_over == "batch" else (2,)
    if k.numel() == 0:  # no token at all: mu 0, std sqrt(eps), as documented (var_mean would warn and give NaN)
        mu = k.new_zeros(1 if stats_over == "batch" else k.shape[0], k.shape[1], 1, k.shape[3])
        return mu, torch.full_like(mu, eps).sqrt()
    if key_mask is None:
        var, mu = torch.var_mean(k, dim=dims, correction=0, keepdim=True)  # one fused pass
        return mu, (var + eps).sqrt()
    w = key_mask[:, None, :, None].to(k.dtype).expand(k.shape[0], k.shape[1], k.shape[2], 1)  # (B, H, N, 1)
    count = w.sum(dims, keepdim=True).clamp_min(1.0)
    mu = (k * w).sum(dims, keepdim=True) / count
    # masked_fill rather than multiply: padded keys may hold anything, their square must not reach the sum
    dev = (k - mu).masked_fill(w == 0, 0.0)
    var = dev.pow(2).sum(dims, keepdim=True) / count
    return mu, (var + eps).sqrt()


def prefix_key_statistics(
    k: Tensor,
    key_mask: Tensor | None,
    visible: Tensor,
    *,
    stats_over: str = "tokens",
    eps: float = 1e-5,
) -> tuple[Tensor, Tensor]:
    """Per-query statistics over the keys each query may see (causal Attention-BN).

    Args:
        k: ``(B, H, Nk, D)`` keys (full-resolution or pooled).
        key_mask: ``(B, Nk)`` bool, True = real key.
        visible: ``(Nq,)`` or ``(B|1, Nq)`` long, query i (of sample b) sees keys ``j < visible[(b,) i]`` (a prefix).
        stats_over, eps: as :func:`key_statistics`; ``"batch"`` pools, for query i, what every sample sees at i.

    Returns:
        ``(mu, std)``, each ``(B, H, Nq, D)`` (``(1, H, Nq, D)`` for ``stats_over="batch"``).
    """
    B, H, Nk, D = k.shape
    w = torch.ones(B, Nk, dtype=k.dtype, device=k.device) if key_mask is None else key_mask.to(k.dtype)
    w = w[:, None, :, None].expand(B, H, Nk, 1)  # (B, H, Nk, 1)
    kw = k.masked_fill(w == 0, 0.0)
    zero = k.new_zeros(B, H, 1, 1)
    # cumulative count / sum / sum of squares with a leading zero row: index c = statistics of keys j < c
    cnt = torch.cat([zero, w.cumsum(2)], 2)  # (B, H, Nk+1, 1)
    s1 = torch.cat([zero.expand(B, H, 1, D), kw.cumsum(2)], 2)  # (B, H, Nk+1, D)
    s2 = torch.cat([zero.expand(B, H, 1, D), kw.pow(2).cumsum(2)], 2)  # (B, H, Nk+1, D)
    if visible.dim() == 1:
        cnt, s1, s2 = (t.index_select(2, visible) for t in (cnt, s1, s2))  # (B, H, Nq, .)
    else:
        idx = visible.expand(B, visible.shape[-1])[:, None, :, None]  # (B, 1, Nq, 1)
        cnt, s1, s2 = (t.gather(2, idx.expand(B, H, -1, t.shape[-1])) for t in (cnt, s1, s2))  # (B, H, Nq, .)
    if stats_over == "batch":
        cnt, s1, s2 = (t.sum(0, keepdim=True) for t in (cnt, s1, s2))  # (1, H, Nq, .)
    cnt = cnt.clamp_min(1.0)
    mu = s1 / cnt
    # E[k^2] - mu^2 loses precision when |mu| >> std; clamp keeps the root real, eps keeps it positive
    var = (s2 / cnt - mu.pow(2)).clamp_min(0.0)
    return mu, (var + eps).sqrt()


def _bn_compute_dtype(q: Tensor) -> torch.dtype | None:
    """float32 where Attention-BN would run in float16 / bfloat16 (such inputs, or autocast to them), else None.

    Prefix sums of squared keys, ``1 / s^2`` (``1 / eps`` at a query that has seen a single key) and the logits of
    the shift-invariance shortcut (``q~ . k`` with uncentred keys) overflow float16 or outrun its resolution.
    """
    if q.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    dev = q.device.type
    if q.dtype == torch.float32 and torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev):
        return torch.float32 if torch.get_autocast_dtype(dev) in (torch.float16, torch.bfloat16) else None
    return None


def _no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off on ``device_type`` (a no-op where autocast does not exist, e.g. the meta device)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _normalise(t: Tensor, mu: Tensor, std: Tensor | None, beta: float) -> Tensor:
    t = t - beta * mu if beta != 0 else t
    return t / std if std is not None else t


# ----------------------------------------------------------------------------------------------------------
# Attention-SH: per-head downsampling of keys and values
# ----------------------------------------------------------------------------------------------------------


def factor_ladder(num_heads: int) -> list[int]:
    """The default factors: ``1, 1, 2, 2, 4, 4, ...`` (two heads per octave) for 4 or more heads, ``1, 2, 4``
    (one per octave) for 2 or 3 heads, so that at least one head is always downsampled (the two-per-octave
    ladder of 2 heads is ``1, 1``: SH would silently be plain multi-head attention). One head: ``[1]``, no
    downsampling; pass ``factors`` explicitly.
    """
    per_octave = 2 if num_heads >= 4 else 1
    return [2 ** (h // per_octave) for h in range(num_heads)]


def check_factors(factors: Sequence[int] | None, num_heads: int) -> list[int]:
    """Validate per-head factors (None: :func:`factor_ladder`); returns a list of ``num_heads`` ints >= 1."""
    if factors is None:
        return factor_ladder(num_heads)
    if isinstance(factors, int) and not isinstance(factors, bool):
        factors = [factors] * num_heads
    factors = list(factors) if isinstance(factors, Sequence) and not isinstance(factors, str) else [factors]
    if len(factors) != num_heads or not all(isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in factors):
        raise ValueError(
            f"factors must be one int >= 1 or a sequence of num_heads ({num_heads}) ints >= 1 (downsampling "
            f"factor per head), got {factors!r}"
        )
    return factors


def memory_ratio(factors: Sequence[int], grid: tuple[int, int] | None = None) -> float:
    """Predicted attention-matrix memory of SH over multi-head attention: ``(1/H) sum_h 1/r_h`` (1-D pooling).

    With ``grid`` pooling a factor r pools ``r x r`` patches, so the ratio is ``(1/H) sum_h 1/r_h^2``.
    """
    p = 2 if grid is not None else 1
    return sum(1.0 / f**p for f in factors) / len(factors)


def check_pool(pooling: str, grid: tuple[int, int] | None, num_cls: int, n: int | None = None) -> None:
    """Validate the Attention-SH pooling options (and, given ``n``, the grid against the sequence length)."""
    if pooling not in ("avg", "stride"):
        raise ValueError(f"pooling must be 'avg' (average pooling) or 'stride' (strided subsampling), got {pooling!r}")
    if not isinstance(num_cls, int) or num_cls < 0:
        raise ValueError(f"num_cls must be an int >= 0 (unpooled leading tokens), got {num_cls!r}")
    if grid is not None:
        if len(tuple(grid)) != 2 or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid):
            raise ValueError(f"grid must be None or a pair of ints >= 1 (patch-grid height, width), got {grid!r}")
        if n is not None and n != num_cls + grid[0] * grid[1]:
            raise ValueError(
                f"with grid={tuple(grid)} and num_cls={num_cls} the sequence must have "
                f"{num_cls + grid[0] * grid[1]} tokens (num_cls + gh * gw), got {n}; grid pooling windows are "
                f"spatial and cannot be realigned to padding, so a grid sequence cannot be padded (mark missing "
                f"patches False in the mask in place instead)"
            )
    elif num_cls:
        raise ValueError("num_cls is only used with grid pooling; pass grid=(gh, gw) or num_cls=0")


def _pool_1d(x: Tensor, w: Tensor, r: int, pooling: str) -> tuple[Tensor, Tensor]:
    """x ``(B, H, N, E)``, w ``(B, 1, N, 1)`` real-token weights -> pooled ``(B, H, ceil(N/r), E)``, counts."""
    B, H, N, E = x.shape
    if pooling == "stride":
        return x[:, :, ::r], w[:, :, ::r]
    M = math.ceil(N / r)
    pad = M * r - N
    xw = F.pad(x.masked_fill(w == 0, 0.0), (0, 0, 0, pad)).reshape(B, H, M, r, E)  # (B, H, M, r, E)
    cnt = F.pad(w, (0, 0, 0, pad)).reshape(B, 1, M, r, 1).sum(3)  # (B, 1, M, 1)
    return xw.sum(3) / cnt.clamp_min(1.0), cnt


def _pool_2d(x: Tensor, w: Tensor, r: int, pooling: str, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """x ``(B, H, gh*gw, E)`` row-major grid -> ``(B, H, ceil(gh/r)*ceil(gw/r), E)``, counts."""
    B, H, _, E = x.shape
    gh, gw = grid
    xg = x.masked_fill(w == 0, 0.0).reshape(B, H, gh, gw, E)  # (B, H, gh, gw, E)
    wg = w.reshape(B, 1, gh, gw, 1)  # (B, 1, gh, gw, 1)
    if pooling == "stride":
        xs = xg[:, :, ::r, ::r].reshape(B, H, -1, E)  # (B, H, Mh*Mw, E)
        return xs, wg[:, :, ::r, ::r].reshape(B, 1, -1, 1)
    mh, mw = math.ceil(gh / r), math.ceil(gw / r)
    pads = (0, 0, 0, mw * r - gw, 0, mh * r - gh)
    xg = F.pad(xg, pads).reshape(B, H, mh, r, mw, r, E)  # (B, H, Mh, r, Mw, r, E)
    wg = F.pad(wg, pads).reshape(B, 1, mh, r, mw, r, 1)  # (B, 1, Mh, r, Mw, r, 1)
    cnt = wg.sum((3, 5)).reshape(B, 1, mh * mw, 1)  # (B, 1, Mh*Mw, 1)
    xs = xg.sum((3, 5)).reshape(B, H, mh * mw, E)  # (B, H, Mh*Mw, E)
    return xs / cnt.clamp_min(1.0), cnt


def downsample(
    x: Tensor,
    key_mask: Tensor | None,
    factor: int,
    *,
    pooling: str = "avg",
    grid: tuple[int, int] | None = None,
    num_cls: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """Downsample keys or values along the tokens, padding-aware.

    1-D pooling cuts the windows from each sequence's real tokens in order: window w holds the real tokens of rank
    ``w r .. (w + 1) r - 1``, so padding (left, right or inside) never shifts a window or enters one, and the last
    window is partial exactly as in the unpadded sequence. Grid pooling keeps its spatial windows; a masked token
    there is a missing patch left out of its window's mean.

    Args:
        x: ``(B, H, N, E)``.
        key_mask: ``(B, N)`` bool, True = real token (None: all real).
        factor: r >= 1 (per axis for grid pooling); 1 returns ``x`` and ``key_mask`` unchanged.
        pooling: ``"avg"`` (mean of a window's real tokens) or ``"stride"`` (first real token of each window).
        grid: ``(gh, gw)`` to pool a row-major patch grid in 2-D; None for 1-D pooling.
        num_cls: leading tokens kept unpooled (grid mode).

    Returns:
        ``(pooled (B, H, M, E), pooled mask (B, M) or None)`` with ``M = ceil(N / r)`` (1-D); a window slot with no
        real token (past the end of a shorter sequence) is masked.
    """
    check_pool(pooling, grid, num_cls, x.shape[2])
    if factor == 1:
        return x, key_mask
    B, H, N, E = x.shape
    w = torch.ones(B, 1, N, 1, dtype=x.dtype, device=x.device) if key_mask is None else key_mask[:, None, :, None]
    w = w.to(x.dtype)  # (B, 1, N, 1)
    if grid is None:
        if key_mask is not None:  # real tokens first, in order: the windows are then cut from the real tokens
            order = real_first_order(key_mask)[:, None, :, None]  # (B, 1, N, 1)
            x = x.gather(2, order.expand(B, H, N, E))  # (B, H, N, E)
            w = w.gather(2, order)  # (B, 1, N, 1): ones, then zeros
        xs, cnt = _pool_1d(x, w, factor, pooling)
    else:
        xs, cnt = _pool_2d(x[:, :, num_cls:], w[:, :, num_cls:], factor, pooling, grid)
        xs = torch.cat([x[:, :, :num_cls], xs], 2)  # (B, H, num_cls + M, E)
        cnt = torch.cat([w[:, :, :num_cls], cnt], 2)
    pooled_mask = None if key_mask is None else cnt[:, 0, :, 0] > 0  # (B, M)
    return xs, pooled_mask


def real_first_order(key_mask: Tensor) -> Tensor:
    """``(B, N)`` long: each sequence's real-token positions in order, then its pad positions (stable)."""
    return torch.sort(key_mask.logical_not().to(torch.uint8), dim=1, stable=True).indices


def pooling_matrix(
    key_mask: Tensor | None,
    n: int,
    factor: int,
    *,
    pooling: str = "avg",
    grid: tuple[int, int] | None = None,
    num_cls: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The ``(B|1, M, N)`` matrix P with ``downsample(x) = P x`` (rows of masked windows are zero).

    Used to map pooled-key attention weights back to token positions (``weights = A P``).
    """
    eye = torch.eye(n, dtype=dtype, device=device)[None, None]  # (1, 1, N, N): pool the identity
    if key_mask is not None:
        eye = eye.expand(key_mask.shape[0], 1, n, n)
    p, _ = downsample(eye, key_mask, factor, pooling=pooling, grid=grid, num_cls=num_cls)
    p = p[:, 0]  # (B|1, M, N)
    return p if key_mask is None else p * key_mask[:, None, :].to(dtype)


def pooled_key_ends(n: int, factor: int, pooling: str = "avg", device: torch.device | str | None = None) -> Tensor:
    """``(M,)`` the last real-token rank each pooled key of a 1-D pooling depends on (its causal visibility).

    Average pooling: the nominal window end ``(w + 1) r - 1`` (independent of N, so appending tokens never
    changes what a query sees); strided: the sampled token ``w r``. Without padding a rank is a position; with
    padding see :func:`pooled_visibility`.
    """
    w = torch.arange(math.ceil(n / factor), device=device)
    return w * factor if pooling == "stride" else (w + 1) * factor - 1


def pooled_visibility(
    key_mask: Tensor | None, n: int, factor: int, pooling: str = "avg", device: torch.device | str | None = None
) -> Tensor:
    """``(B|1, N)`` long: causal query i of sample b sees the 1-D pooled keys ``w < visible[b, i]``.

    With ``c_i`` the real tokens at positions ``<= i``: ``floor(c_i / r)`` complete windows for average pooling
    (window w needs its real token of rank ``(w + 1) r - 1``), ``ceil(c_i / r)`` sampled tokens for strided
    pooling. A factor of 1 pools nothing, so the keys stay at their positions: ``i + 1``.
    """
    pos = torch.arange(1, n + 1, device=device)[None]  # (1, N)
    if factor == 1:
        return pos
    seen = pos if key_mask is None else key_mask.long().cumsum(1)  # (B|1, N) real tokens at positions <= i
    return seen // factor if pooling == "avg" else (seen + factor - 1) // factor


def _visible_slots(key_mask: Tensor | None, n: int, m: int, factor: int, pooling: str, device) -> Tensor:
    """``(B|1, M)`` long: the position at which each 1-D pooled key becomes visible (its last real token), or ``n``
    where that token does not exist (a partial or empty window, never visible)."""
    last = pooled_key_ends(m * factor, factor, pooling, device)  # (M,) rank of the real token that completes w
    if key_mask is None:
        return last.clamp_max(n)[None]
    order = real_first_order(key_mask)  # (B, N) position of the real token of each rank
    slot = order.gather(1, last.clamp_max(n - 1)[None].expand(key_mask.shape[0], m))  # (B, M)
    return slot.masked_fill(last[None] >= key_mask.sum(1, keepdim=True), n)


# ----------------------------------------------------------------------------------------------------------
# The combined kernel
# ----------------------------------------------------------------------------------------------------------


def svr_attention(
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
    factors: Sequence[int] | None = (),
    pooling: str = "avg",
    grid: tuple[int, int] | None = None,
    num_cls: int = 0,
    scale: float | None = None,
    dropout_p: float = 0.0,
    eps: float = 1e-6,
    chunk_size: int = 64,
    need_weights: bool = False,
    backend: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Attention with optional BN normalisation and per-head key/value downsampling (self-attention).

    Args:
        q, k: ``(B, H, N, D)``; v: ``(B, H, N, Dv)``.
        kernel: ``"softmax"`` (exponential kernel) or ``"linear"`` (elu + 1 features).
        key_mask: ``(B, N)`` bool, True = real token.
        causal: query i uses only tokens ``j <= i`` (keys, values and statistics).
        bn: apply Attention-BN with ``beta``, ``divide_std``, ``bn_eps``, ``stats_over``.
        stats_from: with SH, BN statistics from each head's ``"pooled"`` keys (default) or ``"full"`` keys.
        factors: per-head downsampling factors; ``()`` means no downsampling, None the default ladder.
        pooling, grid, num_cls: see :func:`downsample`.
        scale: softmax logit scale (default ``1 / sqrt(D)``). dropout_p: softmax weight dropout.
        eps, chunk_size: linear attention's normaliser epsilon and causal chunk length.
        need_weights: also return ``(B, H, N, N)`` weights at token resolution (see the module docstring).
        backend: softmax backend (``"auto"``, ``"sdpa"``, ``"eager"``).

    Returns:
        ``(out (B, H, N, Dv), weights or None)``.
    """
    key_mask = check_qkv(q, k, v, key_mask)
    B, H, N, D = q.shape
    if k.shape[2] != N:
        raise ValueError(f"svr attention is self-attention: q and k lengths differ ({N} vs {k.shape[2]})")
    if kernel not in _KERNELS:
        raise ValueError(f"kernel must be one of {_KERNELS}, got {kernel!r}")
    if bn:
        check_bn(beta, bn_eps, stats_over)
        if causal and kernel == "linear":
            raise ValueError(
                "causal Attention-BN is not available for linear attention: causal statistics differ per query and "
                "the elu+1 feature map of the normalised keys would need an O(N^2) kernel; use kernel='softmax'"
            )
    if stats_from not in ("pooled", "full"):
        raise ValueError(f"stats_from must be 'pooled' or 'full', got {stats_from!r}")
    factors = [1] * H if factors is not None and len(factors) == 0 else check_factors(factors, H)
    check_pool(pooling, grid, num_cls, N)
    if causal and grid is not None:
        raise ValueError("grid pooling is for non-causal patch grids; causal=True needs grid=None")
    work = _bn_compute_dtype(q) if bn else None
    if work is not None:
        # BN in float32 (statistics, normalisation, kernel), autocast off; the output is cast back at the end
        with _no_autocast(q.device.type):
            out, wts = svr_attention(
                q.to(work), k.to(work), v.to(work), kernel=kernel, key_mask=key_mask, causal=causal, bn=bn,
                beta=beta, divide_std=divide_std, bn_eps=bn_eps, stats_over=stats_over, stats_from=stats_from,
                factors=factors, pooling=pooling, grid=grid, num_cls=num_cls, scale=scale, dropout_p=dropout_p,
                eps=eps, chunk_size=chunk_size, need_weights=need_weights, backend=backend,
            )  # fmt: skip
        return out.to(v.dtype), None if wts is None else wts.to(v.dtype)

    full_stats = None
    if bn and stats_from == "full" and not causal:
        full_stats = key_statistics(k, key_mask, stats_over=stats_over, eps=bn_eps)  # 2 x (B|1, H, 1, D)

    groups: dict[int, list[int]] = {}
    for h, f in enumerate(factors):
        groups.setdefault(f, []).append(h)
    outs, weights, order = [], [], []
    for f, heads in groups.items():
        contiguous = heads == list(range(heads[0], heads[0] + len(heads)))
        idx = None if len(groups) == 1 or contiguous else torch.tensor(heads, device=q.device)
        if len(groups) > 1 and contiguous:  # a view, no copy (the default ladder's groups are head ranges)
            qg, kg, vg = (t.narrow(1, heads[0], len(heads)) for t in (q, k, v))  # (B, Hg, N, .)
            idx = torch.arange(heads[0], heads[0] + len(heads), device=q.device)
        else:
            qg, kg, vg = (t if idx is None else t.index_select(1, idx) for t in (q, k, v))  # (B, Hg, N, .)
        stats = None
        if full_stats is not None:
            stats = full_stats if idx is None else tuple(s.index_select(1, idx) for s in full_stats)
        elif bn and causal and stats_from == "full":
            visible = torch.arange(1, N + 1, device=q.device)
            stats = prefix_key_statistics(kg, key_mask, visible, stats_over=stats_over, eps=bn_eps)
        o, w = _group(
            qg, kg, vg, key_mask, f, kernel, causal, bn, beta, divide_std, bn_eps, stats_over, stats, pooling,
            grid, num_cls, scale, dropout_p, eps, chunk_size, need_weights, backend,
        )  # fmt: skip
        outs.append(o)
        weights.append(w)
        order.extend(heads)
    if len(groups) == 1:
        return outs[0], weights[0]
    out = torch.cat(outs, 1)  # (B, H, N, Dv) in group order
    wts = torch.cat(weights, 1) if need_weights else None
    if order != sorted(order):
        inv = torch.argsort(torch.tensor(order, device=q.device))
        out = out.index_select(1, inv)  # back to head order
        wts = wts.index_select(1, inv) if wts is not None else None
    return out, wts


def _group(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None,
    f: int,
    kernel: str,
    causal: bool,
    bn: bool,
    beta: float,
    divide_std: bool,
    bn_eps: float,
    stats_over: str,
    stats: tuple[Tensor, Tensor] | None,
    pooling: str,
    grid: tuple[int, int] | None,
    num_cls: int,
    scale: float | None,
    dropout_p: float,
    eps: float,
    chunk_size: int,
    need_weights: bool,
    backend: str,
) -> tuple[Tensor, Tensor | None]:
    """One group of heads sharing factor f: ``(B, Hg, N, D)`` in, ``(B, Hg, N, Dv)`` out."""
    N = q.shape[2]
    kp, pmask = downsample(k, key_mask, f, pooling=pooling, grid=grid, num_cls=num_cls)  # (B, Hg, M, D)
    vp, _ = downsample(v, key_mask, f, pooling=pooling, grid=grid, num_cls=num_cls)  # (B, Hg, M, Dv)
    M = kp.shape[2]
    # query i of sample b sees pooled keys j < visible[b, i] (a prefix: windows complete in rank order)
    visible = pooled_visibility(key_mask, N, f, pooling, q.device) if causal else None  # (B|1, N)

    if bn:
        if stats is None and causal:
            stats = prefix_key_statistics(kp, pmask, visible, stats_over=stats_over, eps=bn_eps)  # (B|1, Hg, N, D)
        elif stats is None:
            stats = key_statistics(kp, pmask, stats_over=stats_over, eps=bn_eps)  # (B|1, Hg, 1, D)
        mu, std = stats
        std = std if divide_std else None
        if kernel == "softmax":
            # q^.k^ = q~.k - q~.(beta mu) with q~ = (q - beta mu) / s^2; the second term is constant over keys
            # and the softmax drops it, so only the queries are transformed (also with per-query causal stats)
            q = _normalise(q, mu, None if std is None else std.pow(2), beta)
        else:
            q, kp = _normalise(q, mu, std, beta), _normalise(kp, mu, std, beta)

    if kernel == "softmax":
        attn_mask = None
        if causal:
            attn_mask = (torch.arange(M, device=q.device) < visible[:, :, None])[:, None]  # (B|1, 1, N, M)
        o, a = softmax_attention(
            q, kp, vp, key_mask=pmask, attn_mask=attn_mask, scale=scale, dropout_p=dropout_p,
            need_weights=need_weights, backend="auto" if need_weights else backend,
        )  # fmt: skip
    elif not causal:
        o, a = linear_attention(q, kp, vp, key_mask=pmask, eps=eps, need_weights=need_weights)
    elif f == 1:
        o, a = linear_attention(
            q, kp, vp, key_mask=pmask, causal=True, eps=eps, chunk_size=chunk_size, need_weights=need_weights
        )
    else:
        # place each pooled key at the position where it becomes visible (its last real token), mask the other
        # positions, run the causal scan; keys that never become visible go to a dropped extra slot N
        B, Hg = q.shape[:2]
        slot = _visible_slots(key_mask, N, M, f, pooling, q.device).expand(B, M)  # (B, M)
        idx = slot[:, None, :, None]  # (B, 1, M, 1)
        kt = kp.new_zeros(B, Hg, N + 1, kp.shape[-1]).scatter(2, idx.expand_as(kp), kp)[:, :, :N]  # (B, Hg, N, D)
        vt = vp.new_zeros(B, Hg, N + 1, vp.shape[-1]).scatter(2, idx.expand_as(vp), vp)[:, :, :N]  # (B, Hg, N, Dv)
        real = torch.ones(B, M, dtype=torch.bool, device=q.device) if pmask is None else pmask
        # slots past a sequence's end are all N, which is dropped: the values written there do not matter
        mt = torch.zeros(B, N + 1, dtype=torch.bool, device=q.device).scatter(1, slot, real)[:, :N]  # (B, N)
        o, _ = linear_attention(q, kt, vt, key_mask=mt, causal=True, eps=eps, chunk_size=chunk_size)
        a = _causal_linear_weights(q, kp, pmask, visible, eps) if need_weights else None

    if a is not None and f != 1:
        p = pooling_matrix(key_mask, N, f, pooling=pooling, grid=grid, num_cls=num_cls, dtype=a.dtype, device=a.device)
        a = torch.matmul(a, p[:, None])  # (B, Hg, N, M) @ (B|1, 1, M, N) -> (B, Hg, N, N)
    return o, a


def _causal_linear_weights(q: Tensor, kp: Tensor, pmask: Tensor | None, visible: Tensor, eps: float) -> Tensor:
    """``(B, Hg, N, M)`` causal linear-attention weights over pooled keys (query i sees ``j < visible[b, i]``)."""
    fq, fk = elu_feature_map(q), elu_feature_map(kp)
    if pmask is not None:
        fk = fk * pmask[:, None, :, None].to(fk.dtype)
    a = torch.matmul(fq, fk.transpose(-2, -1))  # (B, Hg, N, M)
    a = a * (torch.arange(kp.shape[2], device=q.device) < visible[:, None, :, None]).to(a.dtype)  # (B|1, 1, N, M)
    return a / (a.sum(-1, keepdim=True) + eps)


def bn_attention(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> tuple[Tensor, Tensor | None]:
    """Attention-BN: :func:`svr_attention` with ``bn=True`` and no downsampling."""
    return svr_attention(q, k, v, bn=True, factors=(), **kwargs)


def sh_attention(q: Tensor, k: Tensor, v: Tensor, *, factors=None, **kwargs) -> tuple[Tensor, Tensor | None]:
    """Attention-SH: :func:`svr_attention` with per-head downsampling (None: the default ladder)."""
    return svr_attention(q, k, v, bn=False, factors=factors, **kwargs)


def bn_sh_attention(q: Tensor, k: Tensor, v: Tensor, *, factors=None, **kwargs) -> tuple[Tensor, Tensor | None]:
    """Attention-BN+SH: :func:`svr_attention` with ``bn=True`` and per-head downsampling."""
    return svr_attention(q, k, v, bn=True, factors=factors, **kwargs)
