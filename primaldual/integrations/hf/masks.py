"""Hugging Face attention masks as primaldual's ``(B, N)`` bool key mask (**True = real token**).

What a Hugging Face (transformers 5) attention module receives as ``attention_mask`` depends on the model's
attention implementation:

=================================  ===========================================================================
``sdpa`` (the default)             None (no padding: causality via ``is_causal``) or bool ``(B, 1, Nq, Nk)``,
                                   **True = may attend**
``eager``                          additive float ``(B, 1, Nq, Nk)``: ``0`` attend, ``finfo(dtype).min`` masked
``flash_attention_*``              None or the 2-D ``(B, Nk)`` padding mask, ``1`` = keep
``flex_attention``                 a ``BlockMask``: refused (use ``sdpa`` or ``eager``)
=================================  ===========================================================================

:func:`key_mask_from_hf` accepts all but the last and returns which keys are real, after checking that the mask
holds nothing but padding and (for causal layers) causality.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..torch_nn import check_contiguous_padding, key_mask_from_attention_mask
from .compat import active_output_collector

__all__ = ["attentions_requested", "key_mask_from_hf", "record_attentions"]


def key_mask_from_hf(
    attention_mask: Any,
    *,
    batch: int,
    q_len: int,
    kv_len: int,
    causal: bool,
    name: str = "attention_mask",
    window: int | None = None,
) -> Tensor | None:
    """The keys' padding mask from whatever form of ``attention_mask`` a Hugging Face model passes.

    Args:
        attention_mask: None; a 2-D ``(B, Nk)`` mask with **1 / True = keep** (Hugging Face's user-facing
            convention, also what flash-attention models pass down); or a 4-D bool (True = attend) or additive
            float mask broadcastable to ``(B, H, Nq, Nk)``.
        batch, q_len, kv_len: ``B``, ``Nq`` (the tokens of this call) and ``Nk`` (cached plus new tokens).
        causal: whether the receiving layer is causal (a 4-D mask must then be exactly padding & causal).
        window: the sliding window of the layer the model built the mask for (the keys a query sees, its own
            included), or None. A 4-D mask must then be exactly padding, causality and that window; it may cover
            every key or, as transformers cuts it for a sliding cache, the last ``min(Nk, window - 1 + Nq)``.
            Padding between real tokens is refused (transformers' window counts it, a converted one does not).

    Returns:
        ``(B, Nk')`` bool, True = real key, or None when every key is real: ``Nk'`` is the mask's key axis (``Nk``,
        or the cut one for a sliding layer), whose last ``Nq`` keys are always this call's tokens.
    """
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor):
        raise TypeError(
            f"{name} of type {type(attention_mask).__name__} is not supported by primaldual layers (flex "
            "attention's BlockMask?); use the 'sdpa' or 'eager' attention implementation"
        )
    if attention_mask.dim() == 2:
        if tuple(attention_mask.shape) != (batch, kv_len):
            raise ValueError(
                f"a 2-D {name} must have shape (B, Nk) = ({batch}, {kv_len}), got {tuple(attention_mask.shape)}"
            )
        if attention_mask.is_floating_point() and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError(f"a 2-D {name} must hold 0 (padding) and 1 (keep), got other values")
        keys = attention_mask != 0 if attention_mask.dtype != torch.bool else attention_mask
        if window is not None:
            check_contiguous_padding(keys, name)
        return None if bool(keys.all()) else keys
    if window is not None and attention_mask.shape[-1] == min(kv_len, window - 1 + q_len):
        kv_len = attention_mask.shape[-1]  # a sliding cache's cut: the keys the window can still reach
    return key_mask_from_attention_mask(
        attention_mask, batch=batch, q_len=q_len, kv_len=kv_len, causal=causal, name=name, window=window
    )


def attentions_requested(kwargs: dict[str, Any]) -> bool:
    """Whether the caller wants attention weights back (``output_attentions``).

    Some models pass ``output_attentions=True`` down to their attention modules; others (GPT-2 in transformers 5)
    consume the flag and collect weights through forward hooks while a collector is active. Both are honoured;
    the collector is a private detail of transformers (read by ``compat.active_output_collector``), and a
    collector that cannot be read raises instead of counting as "not requested".
    """
    if kwargs.get("output_attentions"):
        return True
    collected = active_output_collector()
    return collected is not None and "attentions" in collected


def record_attentions(weights: Tensor | None) -> None:
    """Hand a converted layer's weights to transformers' collector (what its hooks do for the original modules)."""
    collected = active_output_collector()
    if weights is not None and collected is not None and "attentions" in collected:
        collected["attentions"].append(weights)
