"""primaldual's parameter-free mechanisms as Hugging Face attention implementations.

``register_hf_attentions()`` registers ``primaldual_<name>`` for softmax_bn, softmax_sh, softmax_bn_sh, linear,
linear_bn and sparse with transformers' ``AttentionInterface`` (the function that receives the model's projected
queries, keys and values) and ``AttentionMaskInterface`` (the function that builds the mask it receives). A model
then uses one with ``model.set_attn_implementation("primaldual_sparse")``, or
``from_pretrained(..., attn_implementation="primaldual_sparse")``; its weights are unchanged.

* **Same numbers as the layers.** Each call runs ``attend`` of the layer that ``build_attention(name, ...)``
  builds (created once per configuration on the meta device: it holds no weights), so the function and the
  layer compute the same thing on the same projected inputs.
* **Masks.** The registered mask function hands over the 2-D padding mask ``(B, Nk)``, True = real token (None
  without padding); causality comes from the attention module's ``is_causal``. Mask patterns other than plain
  causal / bidirectional (sliding windows, packed sequences, ...) are refused with an error.
* **Decoding with a cache.** A causal call with fewer queries than keys (``Nq < Nk``) pads the queries on the
  left to ``Nk`` and runs the causal mechanism over the whole sequence, keeping the last ``Nq`` rows: exact for
  every causal mechanism (query i of a causal mechanism depends on queries, keys and values ``<= i`` only).
* **Grouped-query attention.** Key / value heads are repeated to the query heads.
* **Options.** ``register_hf_attentions(options={"sparse": {"window": 64}})`` sets mechanism options for every
  model using that implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...attention.base import QKVAttention
from ...attention.registry import attention_options, build_attention
from ..torch_nn import check_causal_capability
from .compat import is_plain_mask_function, module_is_causal, register_attention_implementation
from .masks import attentions_requested, key_mask_from_hf

__all__ = ["HF_KERNELS", "hf_attention_function", "hf_mask_function", "register_hf_attentions"]

HF_KERNELS: tuple[str, ...] = ("softmax_bn", "softmax_sh", "softmax_bn_sh", "linear", "linear_bn", "sparse")
_PREFIX = "primaldual_"
_OPTIONS: dict[str, dict[str, Any]] = {}
_LAYERS: dict[tuple, QKVAttention] = {}


def _kernel_layer(name: str, heads: int, head_dim: int, causal: bool, scale: float | None) -> QKVAttention:
    """The weightless layer whose ``attend`` runs mechanism ``name`` (cached per configuration)."""
    options = dict(_OPTIONS.get(name, {}))
    if scale is not None and "scale" in attention_options(name):
        options.setdefault("scale", float(scale))
    key = (name, heads, head_dim, causal, tuple(sorted((k, repr(v)) for k, v in options.items())))
    layer = _LAYERS.get(key)
    if layer is None:
        layer = build_attention(name, heads * head_dim, heads, causal=causal, device="meta", **options)
        _LAYERS[key] = layer
    return layer


def _repeat_kv(t: Tensor, heads: int, name: str) -> Tensor:
    """``(B, Hkv, N, D)`` -> ``(B, H, N, D)``: each key / value head serves ``H / Hkv`` consecutive query heads."""
    B, Hkv, N, D = t.shape
    if Hkv == heads:
        return t
    if heads % Hkv:
        raise ValueError(f"{name} has {Hkv} heads, which do not divide the {heads} query heads")
    return t[:, :, None].expand(B, Hkv, heads // Hkv, N, D).reshape(B, heads, N, D)  # (B, H, N, D)


def hf_attention_function(name: str) -> Callable[..., tuple[Tensor, Tensor | None]]:
    """The ``AttentionInterface`` function for mechanism ``name``.

    Its signature is transformers': ``fn(module, query (B, H, Nq, D), key (B, Hkv, Nk, D), value (B, Hkv, Nk, Dv),
    attention_mask, scaling=None, dropout=0.0, **kwargs) -> (out (B, Nq, H, Dv), weights (B, H, Nq, Nk) or None)``.
    """

    def attention(
        module: torch.nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Any,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        causal = module_is_causal(module)
        check_causal_capability(name, causal, f"attention module {type(module).__name__}")
        B, H, Nq, D = query.shape
        Nk = key.shape[2]
        key, value = _repeat_kv(key, H, "key"), _repeat_kv(value, H, "value")
        key_mask = key_mask_from_hf(attention_mask, batch=B, q_len=Nq, kv_len=Nk, causal=causal)
        if Nq != Nk and not causal:
            raise ValueError(
                f"{_PREFIX}{name} is self-attention: {Nq} queries and {Nk} keys in a bidirectional module "
                "(cross-attention is not supported)"
            )
        if Nq > Nk:
            raise ValueError(f"{_PREFIX}{name}: more queries ({Nq}) than keys ({Nk})")
        layer = _kernel_layer(name, H, D, causal, scaling)
        layer.attn_drop = float(dropout)
        layer.train(dropout > 0)
        q = F.pad(query, (0, 0, Nk - Nq, 0)) if Nq < Nk else query  # (B, H, Nk, D): left-padded while decoding
        need_weights = attentions_requested(kwargs)
        out, weights = layer.attend(q, key, value, key_mask, need_weights)  # (B, H, Nk, Dv)
        out = out[:, :, Nk - Nq :]  # (B, H, Nq, Dv)
        if weights is not None:
            weights = weights[:, :, Nk - Nq :]  # (B, H, Nq, Nk)
        return out.transpose(1, 2).contiguous(), weights  # (B, Nq, H, Dv)

    attention.__name__ = f"{_PREFIX}{name}_attention"
    return attention


def hf_mask_function(name: str) -> Callable[..., Tensor | None]:
    """The ``AttentionMaskInterface`` function: the 2-D padding mask ``(B, Nk)``, True = real token, or None."""

    def mask(
        batch_size: int,
        q_length: int,
        kv_length: int,
        q_offset: int = 0,
        kv_offset: int = 0,
        mask_function: Callable | None = None,
        attention_mask: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor | None:
        if not is_plain_mask_function(mask_function):
            raise ValueError(
                f"attention implementation {_PREFIX}{name} supports causal or bidirectional masks with padding; "
                f"this model asks for another pattern ({getattr(mask_function, '__name__', mask_function)!r}: "
                "a sliding window, chunked attention, packed sequences, ...)"
            )
        if attention_mask is None:
            return None
        padding = attention_mask.to(torch.bool)
        end = kv_offset + kv_length
        if padding.shape[-1] < end:  # positions the 2-D mask does not cover yet are real tokens
            padding = F.pad(padding, (0, end - padding.shape[-1]), value=True)
        padding = padding[:, kv_offset:end]  # (B, Nk)
        return None if bool(padding.all()) else padding

    mask.__name__ = f"{_PREFIX}{name}_mask"
    return mask


def register_hf_attentions(
    names: Sequence[str] | None = None, options: dict[str, dict[str, Any]] | None = None
) -> list[str]:
    """Register ``primaldual_<name>`` attention and mask functions with transformers.

    Args:
        names: mechanisms to register (default: :data:`HF_KERNELS`, the parameter-free ones); primal has
            parameters of its own: use :func:`~primaldual.integrations.hf.convert` for it.
        options: per-mechanism options, e.g. ``{"sparse": {"window": 64}, "softmax_sh": {"factors": [1, 2]}}``;
            calling again replaces them.

    Returns:
        The registered implementation names (``["primaldual_softmax_bn", ...]``).
    """
    if isinstance(names, str) or not (names is None or isinstance(names, Sequence)):
        raise TypeError(f"names must be a sequence of mechanism names (e.g. ['softmax_bn']), got {names!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must map a mechanism name to its options, got {options!r}")
    names = list(HF_KERNELS if names is None else names)
    for name in names:
        if name not in HF_KERNELS:
            raise ValueError(
                f"names: {name!r} cannot be registered as an attention function; choose from {', '.join(HF_KERNELS)}"
                + (" (primal has parameters: use convert(model, 'primal'))" if name == "primal" else "")
            )
    for name, opts in (options or {}).items():
        if name not in names:
            raise ValueError(f"options given for {name!r}, which is not among the registered names {names}")
        if not isinstance(opts, dict):
            raise TypeError(f"options for {name!r} must be a mapping of option names to values, got {opts!r}")
        reserved = sorted({"causal", "device", "dtype", "head_dim", "qkv_bias"} & set(opts))
        if reserved:
            raise TypeError(f"options for {name!r}: {reserved} are set by the model, not by options")
        unknown = sorted(set(opts) - set(attention_options(name)))
        if unknown:
            raise TypeError(
                f"unknown option(s) {unknown} for {name!r}; valid: {', '.join(sorted(attention_options(name)))}"
            )
    for name, opts in (options or {}).items():  # the values too: here, not at the model's first forward
        factors = opts.get("factors")
        heads = len(factors) if isinstance(factors, list | tuple) and factors else 1  # one factor per head
        build_attention(name, 8 * heads, heads, device="meta", **opts)  # (a causal-only one builds causal)
    registered = []
    for name in names:
        _OPTIONS[name] = dict((options or {}).get(name, {}))
        register_attention_implementation(f"{_PREFIX}{name}", hf_attention_function(name), hf_mask_function(name))
        registered.append(f"{_PREFIX}{name}")
    _LAYERS.clear()
    return registered
