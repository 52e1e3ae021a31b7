"""Softmax attention on ``(B, H, N, D)`` tensors: an SDPA fast path and an eager path with weights.

Both paths share one masking rule: query i may attend key j iff ``key_mask[b, j]`` (True = real
token), ``attn_mask[..., i, j]`` (True = may attend) and, when causal, ``j <= i``. A query with no
admissible key outputs exactly zero (never NaN), which is what fully padded rows need.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_qkv
from ..options import check_bool, check_number

__all__ = ["CPU_EAGER_MAX_KEYS", "allowed_mask", "softmax_attention"]

# backend "auto" on the CPU: bfloat16 / float16 attention over at most this many keys takes the explicit matrix
# (measured 1.6-2.3x faster than the CPU flash kernel, forward + backward, at 60-128 keys; even at 256)
CPU_EAGER_MAX_KEYS = 128


def allowed_mask(
    batch: int,
    q_len: int,
    k_len: int,
    device: torch.device,
    key_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    causal: bool = False,
) -> Tensor | None:
    """Combine the masks into one broadcastable boolean ``(B|1, H|1, Nq|1, Nk)`` (None: all allowed).

    Causal alignment: query i sees keys ``j <= i + (k_len - q_len)`` (the last query sees everything).
    """
    allowed: Tensor | None = None
    if key_mask is not None:
        allowed = key_mask[:, None, None, :]  # (B, 1, 1, Nk)
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool or attn_mask.dim() != 4:
            raise (TypeError if attn_mask.dtype != torch.bool else ValueError)(
                "attn_mask must be a 4-D torch.bool tensor broadcastable to (B, H, Nq, Nk), True = may attend; "
                f"got dtype {attn_mask.dtype}, shape {tuple(attn_mask.shape)}"
            )
        allowed = attn_mask if allowed is None else allowed & attn_mask
    if causal:
        tri = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
        allowed = tri[None, None] if allowed is None else allowed & tri
    return allowed


def _no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off on ``device_type`` (a no-op where autocast does not exist, e.g. the meta device)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: str = "auto",
    softcap: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention with safe masking.

    Args:
        q: ``(B, H, Nq, D)``; k: ``(B, H, Nk, D)``; v: ``(B, H, Nk, Dv)``.
        key_mask: ``(B, Nk)`` bool, True = real key.
        attn_mask: bool broadcastable to ``(B, H, Nq, Nk)``, True = may attend.
        causal: query i sees keys ``j <= i`` (ends aligned when lengths differ).
        scale: logit scale, default ``1 / sqrt(D)``.
        dropout_p: dropout on the weights (pass 0.0 in eval).
        need_weights: also return the softmax weights ``(B, H, Nq, Nk)`` (before dropout).
        backend: ``"sdpa"`` (PyTorch fused kernel), ``"eager"`` (explicit matrix), ``"auto"``:
            eager when weights are needed or, on the CPU, for bfloat16 / float16 inputs with at most
            :data:`CPU_EAGER_MAX_KEYS` keys (there PyTorch's CPU flash kernel is 1.5-3x slower than the explicit
            matrix, forward and backward), else SDPA.
        softcap: None, or a cap ``c > 0`` on the logits, ``s -> c * tanh(s / c)`` after the scale (Gemma 2); SDPA
            has no such option, so a capped call takes the explicit matrix (``backend="sdpa"`` is refused).

    Returns:
        ``(out (B, H, Nq, Dv), weights or None)``.
    """
    key_mask = check_qkv(q, k, v, key_mask)
    check_bool("causal", causal)
    check_bool("need_weights", need_weights)
    check_number("scale", scale, allow_none=True)
    check_number("dropout_p", dropout_p, low=0, high=1, high_open=True)
    if backend not in ("auto", "sdpa", "eager"):
        raise ValueError(f"backend must be 'auto', 'sdpa' or 'eager', got {backend!r}")
    if need_weights and backend == "sdpa":
        raise ValueError("backend='sdpa' cannot return weights; use backend='eager' or 'auto'")
    check_number("softcap", softcap, low=0, low_open=True, allow_none=True)
    if softcap is not None and backend == "sdpa":
        raise ValueError("backend='sdpa' cannot cap the logits (softcap); use backend='eager' or 'auto'")
    B, _, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    use_sdpa = backend == "sdpa" or (
        backend == "auto"
        and not need_weights
        and softcap is None
        and not (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and Nk <= CPU_EAGER_MAX_KEYS)
    )
    if use_sdpa and key_mask is None and attn_mask is None and (not causal or Nq == Nk):
        # No padding: the fused kernel handles causality itself, no mask tensor is built.
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale), None

    allowed = allowed_mask(B, Nq, Nk, q.device, key_mask, attn_mask, causal)
    has_key = None
    if allowed is not None and (key_mask is not None or attn_mask is not None or Nk < Nq):
        has_key = allowed.any(-1, keepdim=True)  # (B|1, H|1, Nq, 1)
        allowed = allowed | ~has_key  # keep empty rows finite; they are zeroed below

    if not use_sdpa:
        half = q.dtype in (torch.float16, torch.bfloat16)
        # half precision: q k^T in float32 (float16 overflows at inputs of a few hundred), autocast off so that it
        # stays there; the weights return to the input dtype for the product with v, as SDPA's kernels do
        ctx = _no_autocast(q.device.type) if half else contextlib.nullcontext()
        with ctx:
            scores = (
                torch.matmul(q.float(), k.float().transpose(-2, -1)) if half else torch.matmul(q, k.transpose(-2, -1))
            )
            scores = scores * scale  # (B, H, Nq, Nk)
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            if allowed is not None:
                scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            weights = scores.softmax(-1)
            if allowed is not None:
                weights = weights.masked_fill(~allowed, 0.0)
            if has_key is not None:
                weights = weights * has_key
            weights = weights.to(v.dtype)
            dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
            out = torch.matmul(dropped, v)
        return out, (weights if need_weights else None)

    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale)
    if has_key is not None:
        out = out * has_key
    return out, None
