"""primaldual attentions as timm attention layers: ``VisionTransformer(attn_layer=PrimalTimmAttention)``.

timm builds a block's attention as ``attn_layer(dim, num_heads=, qkv_bias=, qk_norm=, scale_norm=, proj_bias=,
attn_drop=, proj_drop=, norm_layer=, device=, dtype=)`` and calls ``attn(x, attn_mask=None, is_causal=False)`` on
``(B, N, C)`` tokens. :class:`TimmAttention` takes exactly that; the mechanism and its options are class attributes,
so a configured class is what ``attn_layer`` receives (timm checks ``issubclass``; a ``functools.partial`` would
not do):

    from timm.models.vision_transformer import VisionTransformer
    from primaldual.integrations.timm import PrimalTimmAttention, timm_attention

    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                            attn_layer=timm_attention("primal", s=10))
    aux = primaldual.collect_aux_loss(vit)   # after a training forward

This module imports torch only; timm itself is needed only to build timm models (it imports torchvision, which
must match the installed torch).

Masks: timm's ``attn_mask`` follows SDPA (bool True = may attend, or additive float) and is converted to
primaldual's key mask (True = real token); it may express padding (and causality for causal classes) only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer
from ..attention.registry import attention_options, build_attention
from .torch_nn import (
    accepts_attention_dropout,
    attention_from_projections,
    check_causal_capability,
    keep_frozen,
    key_mask_from_attention_mask,
    resolve_layer_indices,
    with_original,
)

__all__ = ["PrimalTimmAttention", "TimmAttention", "convert_vision_transformer", "layer_from_timm", "timm_attention"]


class TimmAttention(nn.Module):
    """A registered attention with timm's ``Attention`` constructor and forward.

    Class attributes (set by :func:`timm_attention`): ``attention`` (mechanism name, default ``"softmax"``),
    ``options`` (mechanism options), ``causal``.

    Args:
        dim: token width C. num_heads: heads H. qkv_bias, attn_drop, proj_drop: as timm (``attn_drop`` is ignored
            by mechanisms without a weight matrix, e.g. primal).
        qk_norm, scale_norm: must be False (timm's query / key norm is its ``norm_layer``, a LayerNorm by default,
            where primaldual's ``qk_norm`` is an RMS norm; primaldual layers have no output normalisation).
        proj_bias: must be True (every primaldual layer has an output bias).
        norm_layer: accepted for timm's call, unused.
        attn_head_dim: per-head width (default ``dim // num_heads``). dim_out: must be None or ``dim``.
        device, dtype: factory arguments. options: more mechanism options (override the class's).
        layer: an already built primaldual attention to wrap instead (what :func:`convert_vision_transformer` passes).
    """

    attention: ClassVar[str] = "softmax"
    options: ClassVar[dict[str, Any]] = {}
    causal: ClassVar[bool] = False

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        layer: AttentionLayer | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        name = type(self).attention
        if qk_norm or scale_norm:
            raise ValueError(f"qk_norm / scale_norm are not supported by primaldual attention {name!r}")
        if not proj_bias:
            raise ValueError("proj_bias must be True: primaldual layers always have an output bias")
        if dim_out not in (None, dim):
            raise ValueError(f"dim_out must be None or dim ({dim}), got {dim_out}")
        check_causal_capability(name, type(self).causal, f"{type(self).__name__}")
        if layer is None:
            opts = {**type(self).options, **options}
            if "attn_drop" not in opts:
                opts["attn_drop"] = float(attn_drop) if accepts_attention_dropout(name) else 0.0
            layer = build_attention(
                name,
                dim,
                num_heads,
                head_dim=attn_head_dim,
                qkv_bias=qkv_bias,
                proj_drop=proj_drop,
                causal=type(self).causal,
                device=device,
                dtype=dtype,
                **opts,
            )
        elif (layer.dim, layer.num_heads, layer.causal) != (dim, num_heads, type(self).causal):
            raise ValueError(f"layer has dim={layer.dim}, num_heads={layer.num_heads}; expected {dim}, {num_heads}")
        self.attn = layer
        self.num_heads = num_heads
        self.head_dim = self.attn.head_dim

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """Args: x ``(B, N, C)``; attn_mask SDPA-style (bool True = attend, or additive), padding only.

        Returns:
            ``(B, N, C)``; outputs at padded tokens are zero.
        """
        if bool(is_causal) != type(self).causal:
            raise ValueError(
                f"{type(self).__name__} was built with causal={type(self).causal}, but is_causal={is_causal}; use "
                f"timm_attention({type(self).attention!r}, causal={bool(is_causal)})"
            )
        B, N, _ = x.shape
        mask = key_mask_from_attention_mask(
            attn_mask, batch=B, q_len=N, kv_len=N, causal=type(self).causal, name="attn_mask"
        )
        return self.attn(x, mask)

    def extra_repr(self) -> str:
        return f"attention={type(self).attention!r}, options={type(self).options}, causal={type(self).causal}"


class PrimalTimmAttention(TimmAttention):
    """Primal-Attention as a timm attention layer (default options; see :func:`timm_attention` to set them)."""

    attention = "primal"


def timm_attention(attention: str = "primal", *, causal: bool = False, **options: Any) -> type[TimmAttention]:
    """A :class:`TimmAttention` subclass running ``attention`` with ``options``: pass it as ``attn_layer``.

    Raises:
        KeyError: unknown mechanism. TypeError: unknown option. ValueError: ``causal`` not supported.
    """
    valid = attention_options(attention)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for attention {attention!r}; valid: {', '.join(sorted(valid))}")
    check_causal_capability(attention, causal, "the requested timm attention")
    name = "".join(p.capitalize() for p in attention.split("_")) + "TimmAttention"
    return type(name, (TimmAttention,), {"attention": attention, "options": dict(options), "causal": bool(causal)})


def layer_from_timm(old: nn.Module, attention: str, *, causal: bool = False, **options: Any) -> AttentionLayer:
    """Attention ``attention`` built from a timm ``Attention`` (fused ``qkv``, ``proj``) with its weights, dropout and
    scale copied (primal keeps query, key and output)."""
    inner = old.qkv.out_features // 3
    w, b = old.qkv.weight, old.qkv.bias  # (3 inner, C), (3 inner,) or None
    layer = attention_from_projections(
        attention,
        num_heads=old.num_heads,
        q=(w[:inner], None if b is None else b[:inner]),
        k=(w[inner : 2 * inner], None if b is None else b[inner : 2 * inner]),
        v=(w[2 * inner :], None if b is None else b[2 * inner :]),
        out=(old.proj.weight, old.proj.bias),
        causal=causal,
        **with_original(
            attention,
            options,
            attn_drop=float(getattr(getattr(old, "attn_drop", None), "p", 0.0)),
            proj_drop=float(getattr(getattr(old, "proj_drop", None), "p", 0.0)),
            scale=getattr(old, "scale", None),
        ),
    )
    return keep_frozen(layer, [w, b], [old.proj.weight, old.proj.bias])


def convert_vision_transformer(
    model: nn.Module, attention: str = "primal", layers: int | Sequence[int] | str = (-1,), **options: Any
) -> nn.Module:
    """Replace ``model.blocks[i].attn`` (timm ``Attention``: fused ``qkv``, ``proj``) by :class:`TimmAttention`.

    The query / key / value / output weights are copied (primal keeps query, key and output). Returns ``model``.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)):
        raise TypeError(f"expected a timm VisionTransformer with .blocks, got {type(model).__name__}")
    cls = timm_attention(attention, **options)
    chosen = resolve_layer_indices(layers, len(blocks))
    for i in chosen:
        old = blocks[i].attn
        if isinstance(old, TimmAttention):
            raise ValueError(f"layers: block {i} is already converted")
        if not isinstance(getattr(old, "qkv", None), nn.Linear) or not isinstance(
            getattr(old, "proj", None), nn.Linear
        ):
            raise ValueError(f"block {i}: expected a timm Attention with a fused qkv Linear and a proj Linear")
        for norm in ("q_norm", "k_norm", "norm"):
            if not isinstance(getattr(old, norm, nn.Identity()), nn.Identity):
                raise ValueError(f"block {i}: {norm} is not supported by primaldual attentions")
    for i in chosen:
        old = blocks[i].attn
        layer = layer_from_timm(old, attention, causal=False, **options)
        blocks[i].attn = cls(layer.dim, old.num_heads, layer=layer).train(old.training)  # the mode it replaces
    return model
