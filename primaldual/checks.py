"""Input validation shared by every attention: one mask convention, clear errors.

Mask convention (everywhere in primaldual): a boolean tensor where **True = real token**
(attend to it), False = padding. This is PyTorch SDPA's meaning and the opposite of
``nn.MultiheadAttention``'s ``key_padding_mask``; integer/float masks are rejected rather than
guessed, because guessing the polarity silently is the classic padding bug.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "check_finite",
    "check_heads",
    "check_mask",
    "check_qkv",
    "check_tokens",
    "input_checks_enabled",
    "set_input_checks",
]

_CHECK_FINITE = True


def set_input_checks(enabled: bool) -> None:
    """Turn the NaN/Inf check at model entry (:class:`primaldual.Encoder`) on or off globally.

    It costs one reduction and one host synchronisation per model forward; layers never run it.
    """
    global _CHECK_FINITE
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool (True or False), got {enabled!r}")
    _CHECK_FINITE = enabled


def input_checks_enabled() -> bool:
    """Whether the NaN/Inf check runs (never while ``torch.compile`` traces)."""
    return _CHECK_FINITE and not torch.compiler.is_compiling()


def check_finite(t: Tensor, name: str) -> None:
    """Raise if ``t`` holds NaN or Inf (skipped while compiling, on the meta device, or when checks are off)."""
    if input_checks_enabled() and t.device.type != "meta" and not bool(torch.isfinite(t).all()):
        raise ValueError(
            f"{name} contains NaN or Inf values; primaldual refuses non-finite inputs instead of "
            f"returning garbage (disable with primaldual.set_input_checks(False))"
        )


def check_heads(dim: int, num_heads: int, head_dim: int | None) -> int:
    """Validate the width / head split and return the per-head width: a value that is not an int (a bool, a float
    such as ``2.0``, a string) is a ``TypeError``, one that is not positive or does not divide a ``ValueError``."""
    for name, value in (("dim", dim), ("num_heads", num_heads), ("head_dim", head_dim)):
        if name == "head_dim" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            extra = " or None" if name == "head_dim" else ""
            raise TypeError(f"{name} must be a positive int{extra}, got {value!r} ({type(value).__name__})")
        if value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if head_dim is None:
        if dim % num_heads != 0:
            raise ValueError(
                f"dim ({dim}) must be divisible by num_heads ({num_heads}); pass head_dim explicitly "
                f"to use an inner width other than dim"
            )
        return dim // num_heads
    return head_dim


def check_tokens(x: Tensor, dim: int, name: str = "x") -> None:
    """``x`` must be a floating ``(B, N, dim)`` tensor (shape and dtype only: free, no host synchronisation).

    Values (NaN / Inf) are checked once at model entry by :func:`check_finite`, not in every layer.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, N, {dim}), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape (B, N, {dim}) (3 dims), got shape {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise ValueError(f"{name} must have last dimension {dim} (the layer's dim), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_mask(mask: Tensor | None, batch: int, length: int, device: torch.device, name: str = "mask"):
    """Validate a ``(B, N)`` boolean mask (True = real token); returns it on ``device`` or None."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.bool tensor of shape ({batch}, {length}) or None")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must have dtype torch.bool with True = real token (attend) and False = padding, "
            f"got {mask.dtype}; convert explicitly, e.g. mask = attention_mask.bool() for Hugging Face "
            f"masks or mask = ~key_padding_mask for nn.MultiheadAttention masks"
        )
    if tuple(mask.shape) != (batch, length):
        raise ValueError(f"{name} must have shape (B, N) = ({batch}, {length}), got {tuple(mask.shape)}")
    return mask.to(device)


def check_qkv(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None) -> Tensor | None:
    """Validate functional-level ``(B, H, N, D)`` inputs; returns the key mask on the right device.

    ``q`` may have a different length than ``k``/``v``; ``k`` and ``v`` must share ``(B, H, N)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor of shape (B, H, N, D), got {shape}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"q, k, v must share batch and heads, and k, v the length: got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head width D, got {q.shape[-1]} and {k.shape[-1]}")
    return check_mask(key_mask, k.shape[0], k.shape[2], k.device, name="key_mask")
