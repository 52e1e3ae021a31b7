"""Capture every attention layer's weights and padding mask from any model, without changing its forward.

Forward pre-hooks switch ``need_weights=True`` on each :class:`~primaldual.attention.base.AttentionLayer`
whose capabilities return weights, and forward hooks strip the weights from the output again, so the
surrounding model sees exactly what it always sees. Used by the spectrum analysis and ``analyze``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from torch import Tensor, nn

from ..attention.base import AttentionLayer

__all__ = ["CapturedAttention", "capture_attention"]


@dataclass
class CapturedAttention:
    """One layer call: ``weights`` ``(B, H, N, N)`` (None if the mechanism has none), ``mask`` ``(B, N)`` or None."""

    name: str
    mechanism: str
    weights: Tensor | None
    mask: Tensor | None
    weights_meaning: str


@contextmanager
def capture_attention(model: nn.Module, weights: bool = True) -> Iterator[list[CapturedAttention]]:
    """Context manager: records one :class:`CapturedAttention` per attention-layer call inside the block.

    Args:
        model: any module containing primaldual attention layers at any depth.
        weights: request weights where the mechanism can return them.
    """
    records: list[CapturedAttention] = []
    handles = []
    for name, module in model.named_modules():
        if not isinstance(module, AttentionLayer):
            continue
        want = weights and type(module).capabilities.weights

        def pre(mod, args, kwargs, want=want):
            if want:
                kwargs = {**kwargs, "need_weights": True}
            return args, kwargs

        def post(mod, args, kwargs, output, name=name, want=want):
            mask = kwargs.get("mask", args[1] if len(args) > 1 else None)
            out, w = output if want else (output, None)
            caps = type(mod).capabilities
            records.append(
                CapturedAttention(
                    name, mod.registry_name, None if w is None else w.detach(), mask, caps.weights_meaning
                )
            )
            return out

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        yield records
    finally:
        for h in handles:
            h.remove()
