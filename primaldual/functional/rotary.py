"""Rotary position embeddings (RoPE, Su et al. 2021) on per-head queries and keys.

The convention is the one of GPT-NeoX, Llama and Hugging Face transformers: a head's D channels are two halves,
channel ``j`` and channel ``j + D/2`` form one rotating pair, and the tables hold each angle twice::

    rotate_half([x1, x2]) = [-x2, x1]
    q' = q * cos + rotate_half(q) * sin            cos, sin: (..., N, D) with cos[..., j] == cos[..., j + D/2]

so ``(cos, sin)`` from a transformers model's rotary module (the ``position_embeddings`` its attention receives)
can be passed as they are, and :func:`rope_tables` builds the plain (unscaled) tables from positions.

**Partial rotary** (GPT-NeoX / Pythia, Phi-4-mini, StableLM): tables of width ``R < D`` rotate a head's first ``R``
channels (pairs ``j``, ``j + R/2``) and leave the other ``D - R`` as they are, as those models do.

Written by hand: three lines of arithmetic; the core layers import nothing but torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply_rope", "check_rope", "rope_tables", "rotate_half"]


def rotate_half(x: Tensor) -> Tensor:
    """``(..., D)`` -> ``(..., D)``: ``[x1, x2] -> [-x2, x1]`` on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate queries and keys ``(B, H, N, D)`` by the tables ``cos``, ``sin`` (broadcast to them, e.g.
    ``(B, 1, N, R)`` from :func:`check_rope`; ``R < D``: the first ``R`` channels only)."""
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    r = cos.shape[-1]
    if r < q.shape[-1]:  # partial rotary: the channels past R pass through
        (qr, q_pass), (kr, k_pass) = q.split((r, q.shape[-1] - r), -1), k.split((r, k.shape[-1] - r), -1)
        qr, kr = apply_rope(qr, kr, cos, sin)
        return torch.cat((qr, q_pass), -1), torch.cat((kr, k_pass), -1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_tables(
    positions: Tensor, head_dim: int, *, theta: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """The plain RoPE tables for integer ``positions`` ``(N,)`` or ``(B, N)``: ``(cos, sin)``, each
    ``positions.shape + (head_dim,)``, with frequencies ``theta ** (-2j / head_dim)``."""
    if not isinstance(positions, Tensor) or positions.dim() not in (1, 2) or positions.is_floating_point():
        raise ValueError("positions must be an integer tensor of shape (N,) or (B, N)")
    if not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 2, got {head_dim!r}")
    if not theta > 0:
        raise ValueError(f"theta must be > 0, got {theta!r}")
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angles = positions.to(torch.float64)[..., None] * inv  # (..., N, D/2)
    angles = torch.cat((angles, angles), dim=-1)  # (..., N, D): each angle for both channels of its pair
    return angles.cos().to(dtype), angles.sin().to(dtype)


def check_rope(
    rope: object, batch: int, n: int, head_dim: int, device: torch.device, name: str = "rope"
) -> tuple[Tensor, Tensor]:
    """Validate ``rope = (cos, sin)`` for ``batch`` sequences of ``n`` tokens and heads of width ``head_dim``.

    Each table is ``(n, R)`` or ``(B, n, R)`` with B equal to ``batch`` or 1, floating point and on ``device``
    (their values are not scanned: that would synchronise a GPU in every layer); ``R`` is ``head_dim``, or an even
    width below it for partial rotary. Returns both as ``(B or 1, 1, n, R)`` (broadcast over the heads).
    """
    if not isinstance(rope, (tuple, list)) or len(rope) != 2 or not all(isinstance(t, Tensor) for t in rope):
        raise ValueError(f"{name} must be a (cos, sin) pair of tensors, got {type(rope).__name__}")
    cos, sin = rope
    if cos.shape != sin.shape:
        raise ValueError(f"{name}: cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    shape = tuple(cos.shape)
    ok = (cos.dim() == 2 and shape[0] == n) or (cos.dim() == 3 and shape[0] in (1, batch) and shape[1] == n)
    if not ok or not (2 <= shape[-1] <= head_dim and shape[-1] % 2 == 0):
        raise ValueError(
            f"{name}: cos and sin must have shape ({n}, R) or ({batch}, {n}, R), R even, {head_dim} (the head width) "
            f"or below it (partial rotary), got {shape}"
        )
    for label, t in (("cos", cos), ("sin", sin)):
        if not t.is_floating_point():
            raise ValueError(f"{name}: {label} must be floating point, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name}: {label} is on {t.device}, the input on {device}")
    if cos.dim() == 2:
        return cos[None, None], sin[None, None]  # (1, 1, n, R)
    return cos[:, None], sin[:, None]  # (B, 1, n, R)
