"""primaldual attentions inside ``torch.nn.Transformer*`` layers, and the mask / weight conversions all integrations share.

* :class:`MultiheadSelfAttention` stands in for ``nn.MultiheadAttention`` as the ``self_attn`` of
  ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``: same call
  ``(query, key, value, key_padding_mask=, need_weights=, attn_mask=, average_attn_weights=, is_causal=)``, same
  ``(out, weights)`` return, same ``batch_first`` layouts.
* :func:`convert_transformer_encoder` / :func:`convert_transformer_decoder` swap the self-attention of chosen layers
  of an existing model, copying its query / key / value / output weights.
* :func:`key_mask_from_padding_mask` and :func:`key_mask_from_attention_mask` turn the other libraries' mask
  conventions into primaldual's ``(B, N)`` bool mask (**True = real token**); :func:`attention_from_projections`
  builds a registered attention from a model's projection weights. :mod:`primaldual.integrations.hf` and
  :mod:`primaldual.integrations.timm` use them too.

Mask conventions, converted explicitly (never guessed):

=============================================  ===================================================================
``nn.MultiheadAttention`` ``key_padding_mask``  ``(B, N)``; bool **True = padding**, or float ``0`` keep / ``-inf`` pad
``nn.MultiheadAttention`` ``attn_mask``         ``(N, N)``; bool **True = not allowed**, or float additive
SDPA / timm / Hugging Face 4-D masks            broadcastable to ``(B, H, Nq, Nk)``; bool **True = may attend**, or
                                                float additive (``0`` attend, ``-inf`` / ``finfo.min`` masked)
=============================================  ===================================================================

A primaldual layer honours exactly two things: which keys are real (padding) and whether it is causal. A mask that
says anything else (a sliding window, packed sequences, a soft bias) is refused with an error rather than
approximated.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer, QKVAttention
from ..attention.primal import PrimalAttention
from ..attention.registry import attention_class, attention_options, build_attention, list_attentions
from ..functional.qk_norm import QKNorm

__all__ = [
    "MultiheadSelfAttention",
    "accepts_attention_dropout",
    "attention_from_projections",
    "call_is_causal",
    "check_causal_capability",
    "check_contiguous_padding",
    "convert_transformer_decoder",
    "convert_transformer_encoder",
    "key_mask_from_attention_mask",
    "keep_frozen",
    "key_mask_from_padding_mask",
    "resolve_layer_indices",
    "same_tensor",
    "with_original",
]

_RESERVED_OPTIONS = ("causal", "qkv_bias", "head_dim", "device", "dtype", "qk_norm", "qk_norm_eps", "softcap")
_WHENCE = {  # what of the model a reserved option comes from, where the name does not say it
    "qk_norm": " (its q_norm / k_norm, or their absence)",
    "qk_norm_eps": " (its q_norm / k_norm, or their absence)",
    "softcap": " (its logit cap, or none)",
}


def same_tensor(a: object, b: Tensor) -> bool:
    """Whether ``a`` is ``b``, or a view of the same elements in the same layout (``x.transpose(0, 1)`` taken three
    times for query, key and value): self-attention, told apart without reading a value (no host sync). Inside a
    ``torch.compile`` graph only ``a is b`` counts: the data pointer does not trace, and views of one base at other
    offsets (``x[1:]`` beside ``x[:-1]``) must not pass for self-attention."""
    if a is b:
        return True
    if not isinstance(a, Tensor) or torch.compiler.is_compiling():
        return False
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
    )


# --------------------------------------------------------------------------------------------------
# masks

#: an additive float mask's values at or below this mask a key (as -inf does)
HARD_MASK = -1e4


def _allowed_from_dense(mask: Tensor, name: str, *, true_means: str) -> Tensor:
    """A dense bool / additive-float mask as a bool tensor, True = may attend.

    Args:
        true_means: what True means in a bool ``mask``: ``"attend"`` (SDPA, Hugging Face, timm) or ``"masked"``
            (``nn.MultiheadAttention``'s ``attn_mask`` and ``key_padding_mask``).
    """
    if mask.dtype == torch.bool:
        return mask if true_means == "attend" else ~mask
    if not mask.is_floating_point():
        raise TypeError(
            f"{name} must be a bool or an additive float mask, got dtype {mask.dtype}; integer 0/1 masks are "
            "ambiguous here: convert them explicitly (e.g. mask.bool())"
        )
    attend = mask == 0
    # -inf, finfo.min and the common -1e9 / -1e4 alike: softmax gives such a key exactly zero weight beside any
    # attended logit less than 1e4 - 745 above it (exp underflows even in float64)
    masked = mask <= HARD_MASK
    if not bool((attend | masked).all()):
        raise ValueError(
            f"{name} is an additive float mask with values other than 0 (attend) and -inf or <= {HARD_MASK:g} "
            "(masked); primaldual layers honour hard masks only, not soft attention biases"
        )
    return attend


def key_mask_from_padding_mask(
    key_padding_mask: Tensor | None, batch: int, length: int, name: str = "key_padding_mask"
) -> Tensor | None:
    """``nn.MultiheadAttention``'s ``key_padding_mask`` (True / ``-inf`` = **padding**) as primaldual's mask.

    Args:
        key_padding_mask: ``(B, N)`` bool (True = padding) or additive float (``0`` keep, ``-inf`` padding), or None.
        batch, length: the expected ``B`` and ``N``.

    Returns:
        ``(B, N)`` bool, **True = real token**, or None when there is no padding.
    """
    if key_padding_mask is None:
        return None
    if not isinstance(key_padding_mask, Tensor) or tuple(key_padding_mask.shape) != (batch, length):
        shape = tuple(key_padding_mask.shape) if isinstance(key_padding_mask, Tensor) else type(key_padding_mask)
        raise ValueError(f"{name} must be a tensor of shape (B, N) = ({batch}, {length}), got {shape}")
    real = _allowed_from_dense(key_padding_mask, name, true_means="masked")
    return None if bool(real.all()) else real


def _causal_pattern(q_len: int, kv_len: int, device: torch.device, window: int | None = None) -> Tensor:
    """``(Nq, Nk)`` bool, True where query i may see key j: ``j <= i + (Nk - Nq)`` (ends aligned), and with a
    ``window`` also ``j > i + (Nk - Nq) - window`` (the query's last ``window`` keys, its own included)."""
    ones = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    seen = ones.tril(kv_len - q_len)
    return seen if window is None else seen & ~ones.tril(kv_len - q_len - window)


def check_contiguous_padding(keys: Tensor | None, name: str = "attention_mask") -> None:
    """For a sliding-window layer: each row of the key mask ``keys`` ``(B, Nk)`` (True = real) must hold its real
    tokens in one run, padding only before or after them. Transformers counts a sliding window over positions,
    padding included, where primaldual's windowed layers count real tokens; the two agree only then."""
    if keys is None:
        return
    real = keys.to(torch.int32)
    before, after = real.cumsum(1) > 0, real.flip(1).cumsum(1).flip(1) > 0  # (B, Nk): a real key at or before / after
    inside = ~keys & before & after  # (B, Nk): padding between real tokens
    if bool(inside.any()):
        row = int(inside.any(1).nonzero()[0])
        raise ValueError(
            f"{name} has padding between real tokens (row {row}) for a sliding-window layer: transformers counts its "
            "window over positions, padding included, and primaldual's windowed layers over real tokens, so the "
            "two would differ; pad on the left or the right only"
        )


def key_mask_from_attention_mask(
    mask: Tensor | None,
    *,
    batch: int,
    q_len: int,
    kv_len: int,
    causal: bool,
    name: str = "attention_mask",
    true_means: str = "attend",
    window: int | None = None,
) -> Tensor | None:
    """A dense attention mask as primaldual's key mask, after checking it says nothing but padding and causality.

    Args:
        mask: bool or additive float, broadcastable to ``(B, H, Nq, Nk)``: ``(Nq, Nk)``, ``(B, Nq, Nk)`` or
            ``(B, H|1, Nq|1, Nk)``; None.
        batch, q_len, kv_len: ``B``, ``Nq``, ``Nk`` of the call (``Nq < Nk`` while decoding with a cache).
        causal: whether the layer that will receive the key mask is causal. A mask with a query axis must then
            be exactly ``padding & causal`` (ends aligned), otherwise exactly ``padding``; the row of a padded query
            may instead be empty (masks built as ``keep_i & keep_j``), since its output is zero either way.
        true_means: what True means in a bool mask: ``"attend"`` (SDPA, Hugging Face, timm) or ``"masked"``
            (``nn.MultiheadAttention``).
        window: a causal mask's sliding window, the keys each query sees counting its own (a Mistral or Gemma
            layer's ``sliding_window``), or None: a mask with a query axis must then be exactly ``padding & causal &
            window``. What the receiving layer does beyond the window is its own (a primal layer sees the whole
            prefix); a key no query's window reaches reads as padding.

    Returns:
        ``(B, Nk)`` bool, **True = real key**, or None when every key is real.

    Raises:
        ValueError: the mask has another shape, soft values, or structure beyond padding and causality (a
            sliding window, packed sequences, a causal mask for a bidirectional layer, ...).
    """
    if window is not None and (not causal or isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or a positive int for a causal mask, got {window!r} (causal={causal})")
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"{name} must be a tensor (or None), got {type(mask).__name__}; block masks (flex attention) are not "
            "supported: use the 'sdpa' or 'eager' attention implementation"
        )
    allowed = _allowed_from_dense(mask, name, true_means=true_means)
    if allowed.dim() == 2:
        allowed = allowed[None, None]  # (Nq, Nk) -> (1, 1, Nq, Nk)
    elif allowed.dim() == 3:
        allowed = allowed[:, None]  # (B, Nq, Nk) -> (B, 1, Nq, Nk)
    if (
        allowed.dim() != 4
        or allowed.shape[0] not in (1, batch)
        or allowed.shape[2] not in (1, q_len)
        or allowed.shape[3] != kv_len
    ):
        raise ValueError(
            f"{name} must be broadcastable to (B, H, Nq, Nk) = ({batch}, H, {q_len}, {kv_len}), "
            f"got shape {tuple(mask.shape)}"
        )
    keys = allowed.any(2).any(1)  # (B|1, Nk): a key is real iff some query may attend it
    padding = keys[:, None, None, :]  # (B|1, 1, 1, Nk)
    # a broadcast key mask (no query axis) says padding only; causality then comes from the layer
    has_queries = allowed.shape[2] > 1
    causal_padding = padding & _causal_pattern(q_len, kv_len, mask.device, window) if has_queries else padding
    expected = causal_padding if causal else padding  # (B|1, 1, Nq|1, Nk)
    rows_ok = (allowed == expected).all(-1)  # (B|1, H|1, Nq|1)
    if has_queries and q_len <= kv_len:  # a padded query's row may also be empty: its output is zero either way
        padded_query = ~keys[:, None, kv_len - q_len :]  # (B|1, 1, Nq)
        rows_ok = rows_ok | (padded_query & ~allowed.any(-1))
    if not bool(rows_ok.all()):
        if not causal and has_queries and bool((allowed == causal_padding).all(-1).all()):
            raise ValueError(f"{name} is causal, but the primaldual layer receiving it was built non-causal")
        kind = "padding and causality" if causal else "padding"
        if window is not None:
            kind += f" in a sliding window of {window} keys"
        raise ValueError(
            f"{name} carries structure other than {kind} (e.g. "
            + ("a sliding window, " if window is None else "")
            + "packed sequences or a custom mask); a primaldual layer honours only which keys are real and "
            "whether it is causal"
        )
    keys = keys.expand(batch, kv_len)
    if window is not None:
        check_contiguous_padding(keys, name)
    return None if bool(keys.all()) else keys


def call_is_causal(attn_mask: Tensor | None, is_causal: bool, length: int) -> bool:
    """Whether an ``nn.MultiheadAttention``-style self-attention call of ``length`` tokens asks for causal
    attention: ``attn_mask`` (bool True = not allowed, or additive float) must be None, all-allowed or causal."""
    if attn_mask is None:
        return bool(is_causal)
    if attn_mask.dim() != 2 or tuple(attn_mask.shape) != (length, length):
        raise ValueError(
            f"attn_mask must be None or a ({length}, {length}) causal mask for a primaldual self-attention, "
            f"got shape {tuple(attn_mask.shape)}; per-head (B*H, N, N) masks are not supported"
        )
    allowed = _allowed_from_dense(attn_mask, "attn_mask", true_means="masked")
    if bool(allowed.all()):
        return bool(is_causal)
    if bool((allowed == _causal_pattern(length, length, allowed.device)).all()):
        return True
    raise ValueError(
        "attn_mask must be None or causal (e.g. nn.Transformer.generate_square_subsequent_mask); other "
        "patterns cannot be expressed by a primaldual layer"
    )


# --------------------------------------------------------------------------------------------------
# building a registered attention from a model's projections
@functools.cache
def accepts_attention_dropout(name: str) -> bool:
    """Whether mechanism ``name`` takes a non-zero ``attn_drop`` (those without a weight matrix refuse it)."""
    try:
        build_attention(name, 4, 1, attn_drop=0.5, device="meta")
    except ValueError:
        return False
    return True


def _check_reserved(options: dict[str, Any]) -> None:
    for key in _RESERVED_OPTIONS:
        if key in options:
            raise TypeError(
                f"option {key!r} is set from the model being converted{_WHENCE.get(key, '')}; do not pass it"
            )


def with_original(name: str, options: dict[str, Any], **original: Any) -> dict[str, Any]:
    """Keyword arguments for :func:`attention_from_projections`: a converted model's own settings (``attn_drop``,
    ``proj_drop``, ``scale``), each replaced by the user's option of that name where given, plus the other options.
    A user's ``scale`` or non-zero ``attn_drop`` that mechanism ``name`` cannot take is a ``TypeError``: the model's
    own are dropped there (:func:`attention_from_projections`), a user's never silently."""
    _check_reserved(options)
    if "scale" in options and "scale" not in attention_options(name):
        raise TypeError(
            f"option 'scale': attention {name!r} has no logit scale (its options: {sorted(attention_options(name))})"
        )
    if options.get("attn_drop") and not accepts_attention_dropout(name):
        raise TypeError(f"option 'attn_drop': attention {name!r} has no attention weights to drop")
    return {**original, **options}


def check_causal_capability(name: str, causal: bool, where: str) -> None:
    """Raise one clear error when ``name`` cannot run in the mode (``causal`` or not) that ``where`` needs."""
    caps = attention_class(name).capabilities
    if causal and not caps.causal:
        raise ValueError(
            f"attention {name!r} cannot be causal, but {where} is causal (each position may see only earlier "
            f"ones); choose a mechanism with causal support: {', '.join(_names_with(causal=True))}"
        )
    if not causal and not caps.non_causal:
        raise ValueError(f"attention {name!r} is causal-only, but {where} is bidirectional")


def _names_with(*, causal: bool) -> list[str]:
    return [i.name for i in list_attentions() if (i.capabilities.causal if causal else i.capabilities.non_causal)]


def resolve_layer_indices(layers: int | Sequence[int] | str, count: int, name: str = "layers") -> list[int]:
    """``layers`` (an int, a sequence of ints, negative from the end, or ``"all"``) as sorted indices ``0..count-1``.

    Raises:
        IndexError: an index outside ``[-count, count)``.
        ValueError: duplicates (``-1`` and ``count - 1`` name the same layer) or an empty selection.
    """
    if isinstance(layers, str):
        if layers != "all":
            raise ValueError(f"{name} must be an int, a sequence of ints or 'all', got {layers!r}")
        return list(range(count))
    if isinstance(layers, bool) or not isinstance(layers, int | Sequence):
        raise TypeError(f"{name} must be an int, a sequence of ints or 'all', got {layers!r} ({type(layers).__name__})")
    items = [layers] if isinstance(layers, int) else list(layers)
    out = []
    for i in items:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"{name} must contain ints, got {i!r} ({type(i).__name__})")
        if not -count <= i < count:
            raise IndexError(
                f"{name}: layer index {i} is out of range for a model with {count} layers "
                f"(valid: {-count} ... {count - 1})"
            )
        out.append(i % count)
    if not out:
        raise ValueError(f"{name} selects no layer")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} names a layer twice: {items} -> {out}")
    return sorted(out)


def attention_from_projections(
    name: str,
    *,
    num_heads: int,
    q: tuple[Tensor, Tensor | None],
    k: tuple[Tensor, Tensor | None],
    v: tuple[Tensor, Tensor | None],
    out: tuple[Tensor, Tensor | None],
    causal: bool,
    attn_drop: float = 0.0,
    proj_drop: float = 0.0,
    scale: float | None = None,
    qk_norm: QKNorm | None = None,
    softcap: float | None = None,
    **options: Any,
) -> AttentionLayer:
    """Build attention ``name`` and copy a model's projections into it.

    Args:
        q, k, v: ``(weight (inner, C), bias (inner,) or None)`` in ``nn.Linear`` layout (a missing bias beside
            present ones is zeros).
        out: ``(weight (C, inner), bias (C,) or None)``; a missing bias becomes zeros.
        causal: the layer's mode. attn_drop: attention dropout (dropped for mechanisms that have no weight
            matrix, see :func:`accepts_attention_dropout`). proj_drop: dropout after the output projection.
        scale: the model's logit scale, passed to mechanisms with a ``scale`` option unless ``options`` sets it.
        qk_norm: the model's query / key norms, built and copied into the layer (``TypeError`` for a mechanism
            without the ``qk_norm`` option).
        softcap: the model's cap on its logits (Gemma 2), or None (``TypeError`` for a mechanism without the
            ``softcap`` option).
        options: mechanism options (e.g. ``s=20`` for primal, ``window=64`` for sparse).

    Returns:
        The layer on the weights' device and dtype. Primal keeps query, key and output (it has no values).
    """
    _check_reserved(options)
    if any(b is not None for _, b in (q, k, v)):  # some biased, some not (Whisper's key): the others' are zeros
        q, k, v = (
            (w, torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) if b is None else b) for w, b in (q, k, v)
        )
    q_w, q_b = q
    out_w, out_b = out
    dim, inner = out_w.shape[0], q_w.shape[0]
    if inner % num_heads:
        raise ValueError(f"the query projection's {inner} outputs do not split into {num_heads} heads")
    kw: dict[str, Any] = dict(options)
    valid = attention_options(name)
    if scale is not None and "scale" in valid:
        kw.setdefault("scale", float(scale))
    if "attn_drop" not in kw:
        kw["attn_drop"] = float(attn_drop) if accepts_attention_dropout(name) else 0.0
    kw.setdefault("proj_drop", float(proj_drop))
    if qk_norm is not None:
        if "qk_norm" not in valid:
            raise TypeError(f"qk_norm: attention {name!r} takes no query / key norms (it has no qk_norm option)")
        kw.update(qk_norm=qk_norm.kind, qk_norm_eps=float(qk_norm.eps))
    if softcap is not None:
        if "softcap" not in valid:
            raise TypeError(f"softcap: attention {name!r} cannot cap its logits (it has no softcap option)")
        kw["softcap"] = float(softcap)
    layer = build_attention(
        name,
        dim,
        num_heads,
        head_dim=inner // num_heads if inner != dim else None,
        qkv_bias=q_b is not None,
        causal=causal,
        device=q_w.device,
        dtype=q_w.dtype,
        **kw,
    )
    with torch.no_grad():
        if isinstance(layer, QKVAttention):
            parts = (q, k, v)
            in_proj = layer.qkv
        elif isinstance(layer, PrimalAttention):
            parts = (q, k)
            in_proj = layer.qk
        else:
            raise TypeError(
                f"attention {name!r} ({type(layer).__name__}) has neither a fused qkv nor a qk projection; "
                "its weights cannot be copied from a model"
            )
        in_proj.weight.copy_(torch.cat([w for w, _ in parts]))  # (n_parts * inner, C)
        if in_proj.bias is not None:
            in_proj.bias.copy_(torch.cat([b for _, b in parts]))
        if qk_norm is not None:
            for part, gain in (("q", qk_norm.q), ("k", qk_norm.k)):
                target = getattr(layer, f"{part}_norm").weight
                if gain.shape != target.shape:
                    raise ValueError(
                        f"qk_norm.{part}: a {qk_norm.kind!r} norm of this layer has a gain of shape "
                        f"{tuple(target.shape)}, got {tuple(gain.shape)}"
                    )
                target.copy_(gain)
        layer.proj.weight.copy_(out_w)
        if out_b is None:
            layer.proj.bias.zero_()
        else:
            layer.proj.bias.copy_(out_b)
    return layer


def keep_frozen(layer: AttentionLayer, inputs: list[Tensor | None], outputs: list[Tensor | None]) -> AttentionLayer:
    """Freeze the projections ``layer`` copied from a model's ``inputs`` (query / key / value weights and biases) or
    ``outputs`` (the output map) where all of those were frozen (``requires_grad`` False): a model frozen before
    its attention is swapped stays frozen where it was; the layer's own new parameters keep training."""
    in_proj = layer.qk if isinstance(layer, PrimalAttention) else layer.qkv
    for params, sources in ((list(in_proj.parameters()), inputs), (list(layer.proj.parameters()), outputs)):
        if not any(t.requires_grad for t in sources if t is not None):
            for p in params:
                p.requires_grad_(False)
    return layer


# --------------------------------------------------------------------------------------------------
# the nn.MultiheadAttention stand-in
class MultiheadSelfAttention(nn.Module):
    """A primaldual attention with ``nn.MultiheadAttention``'s call signature, for self-attention.

    Use it as the ``self_attn`` of ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` (the decoder's
    cross-attention stays an ``nn.MultiheadAttention``), or build it from an existing one with :meth:`from_torch`.

    Args:
        embed_dim: model width C. num_heads: heads H.
        attention: registered mechanism name (``primaldual.list_attentions()``).
        dropout: attention-weight dropout (``nn.MultiheadAttention``'s ``dropout``); mechanisms without a weight
            matrix (primal, linear) ignore it.
        bias: biases in the input projections.
        batch_first: ``(B, N, C)`` inputs when True, ``(N, B, C)`` when False (``nn.MultiheadAttention``'s
            default, kept so that the stand-in is a drop-in).
        causal: the layer's mode, fixed at construction (primal's parameters depend on it). A call must agree:
            a causal layer needs ``is_causal=True`` or a causal ``attn_mask``; a non-causal one neither.
        device, dtype: factory arguments. options: mechanism options (``s=``, ``window=``, ...).
        layer: an already built primaldual attention to wrap instead (what :meth:`from_torch` passes).

    Attributes read by ``nn.TransformerEncoderLayer``: ``batch_first``, ``num_heads``, ``_qkv_same_embed_dim``
    (True) and ``in_proj_bias`` (None, which turns the fused fast path off; ``in_proj_weight`` is None too); also
    ``embed_dim``, ``kdim``, ``vdim``, ``dropout``, ``bias_k`` / ``bias_v`` (None), ``add_zero_attn`` (False) and
    ``out_proj`` (the layer's output projection), as ``nn.MultiheadAttention`` has them.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        attention: str = "softmax",
        *,
        dropout: float = 0.0,
        bias: bool = True,
        batch_first: bool = False,
        causal: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        layer: AttentionLayer | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        check_causal_capability(attention, causal, "this layer")
        if layer is None:
            if "attn_drop" not in options:
                options["attn_drop"] = float(dropout) if accepts_attention_dropout(attention) else 0.0
            layer = build_attention(
                attention, embed_dim, num_heads, qkv_bias=bias, causal=causal, device=device, dtype=dtype, **options
            )
        elif (layer.dim, layer.num_heads, layer.causal) != (embed_dim, num_heads, causal):
            raise ValueError(
                f"layer has dim={layer.dim}, num_heads={layer.num_heads}, causal={layer.causal}; expected "
                f"{embed_dim}, {num_heads}, {causal}"
            )
        self.attn = layer
        self.attention = attention
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = layer.head_dim
        self.batch_first = bool(batch_first)
        self.causal = bool(causal)
        self._qkv_same_embed_dim = True
        self.in_proj_weight = None
        self.in_proj_bias = None
        # the rest of nn.MultiheadAttention's public attributes, as code around one reads them
        self.kdim = self.vdim = embed_dim
        self.dropout = float(layer.attn_drop)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False

    @property
    def out_proj(self) -> nn.Linear:
        """The output projection (``nn.MultiheadAttention``'s name for it): the layer's ``proj``."""
        return self.attn.proj

    @classmethod
    def from_torch(
        cls,
        mha: nn.MultiheadAttention,
        attention: str = "softmax",
        *,
        causal: bool = False,
        where: str = "",
        **options: Any,
    ) -> MultiheadSelfAttention:
        """A stand-in for ``mha`` with its weights copied (primal: query, key and output; it has no values).
        ``where`` names the layer in errors (``"layer 2 (encoder.layers.2.self_attn)"``)."""
        at = f" ({where})" if where else ""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected an nn.MultiheadAttention{at}, got {type(mha).__name__}")
        if not mha._qkv_same_embed_dim:
            raise ValueError(
                f"nn.MultiheadAttention{at} with kdim / vdim different from embed_dim is not self-attention"
            )
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(
                f"nn.MultiheadAttention{at} with add_bias_kv or add_zero_attn has no primaldual equivalent"
            )
        check_causal_capability(attention, causal, where or "this layer")
        C = mha.embed_dim
        w, b = mha.in_proj_weight, mha.in_proj_bias  # (3C, C), (3C,) or None
        layer = attention_from_projections(
            attention,
            num_heads=mha.num_heads,
            q=(w[:C], None if b is None else b[:C]),
            k=(w[C : 2 * C], None if b is None else b[C : 2 * C]),
            v=(w[2 * C :], None if b is None else b[2 * C :]),
            out=(mha.out_proj.weight, mha.out_proj.bias),
            causal=causal,
            **with_original(attention, options, attn_drop=mha.dropout),
        )
        keep_frozen(layer, [w, b], [mha.out_proj.weight, mha.out_proj.bias])
        return cls(C, mha.num_heads, attention, batch_first=mha.batch_first, causal=causal, layer=layer)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``nn.MultiheadAttention.forward`` for self-attention (``key`` and ``value`` must be ``query``).

        Args:
            query: ``(B, N, C)`` if ``batch_first`` else ``(N, B, C)``; or unbatched ``(N, C)``.
            key_padding_mask: ``(B, N)``, **True / -inf = padding** (``nn.MultiheadAttention``'s convention),
                converted to primaldual's True = real.
            need_weights: also return the weights, ``(B, N, N)`` averaged over heads or ``(B, H, N, N)``
                (None for a mechanism without attention weights, ``primal`` among them: its kernel matrix is no
                distribution over the keys, and forming it would cost O(N^2)).
            attn_mask: None or a causal ``(N, N)`` mask (bool True = not allowed, or additive float).
            is_causal: causal hint, as in PyTorch.

        Returns:
            ``(out, weights or None)`` with ``out`` in the input's layout. Unlike ``nn.MultiheadAttention``,
            outputs at padded positions are exactly zero.
        """
        if not same_tensor(key, query) or not same_tensor(value, query):
            raise ValueError(
                "MultiheadSelfAttention is self-attention: key and value must be the query tensor itself, or (not "
                "under torch.compile) the same view of it (keep nn.MultiheadAttention for cross-attention)"
            )
        unbatched = query.dim() == 2
        x = query[None] if unbatched else (query if self.batch_first else query.transpose(0, 1))  # (B, N, C)
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"query must be (B, N, {self.embed_dim}) / (N, B, {self.embed_dim}), got {tuple(query.shape)}"
            )
        B, N, _ = x.shape
        if unbatched and key_padding_mask is not None:
            key_padding_mask = key_padding_mask[None]  # (N,) -> (1, N)
        mask = key_mask_from_padding_mask(key_padding_mask, B, N)
        causal = call_is_causal(attn_mask, is_causal, N)
        if causal != self.causal:
            raise ValueError(
                f"this MultiheadSelfAttention was built with causal={self.causal}, but the call asks for "
                f"{'causal' if causal else 'bidirectional'} attention (attn_mask / is_causal); build it with "
                f"causal={causal}"
            )
        caps = type(self.attn).capabilities
        want = need_weights and caps.weights and caps.stochastic_weights  # primal's kernel is no attention weights
        if want:
            out, weights = self.attn(x, mask, need_weights=True)
            if weights is not None and average_attn_weights:
                weights = weights.mean(1)  # (B, H, N, N) -> (B, N, N)
        else:
            out, weights = self.attn(x, mask), None
        if unbatched:
            out = out[0]  # (1, N, C) -> (N, C)
            weights = None if weights is None else weights[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)  # (B, N, C) -> (N, B, C)
        return out, weights

    def extra_repr(self) -> str:
        return f"attention={self.attention!r}, batch_first={self.batch_first}, causal={self.causal}"


def _transformer_layers(module: nn.Module, kinds: tuple[type, ...], stack: type, what: str) -> nn.ModuleList | list:
    if isinstance(module, stack):
        return module.layers
    if isinstance(module, kinds):
        return [module]
    raise TypeError(f"expected an nn.{stack.__name__} or one of its layers, got {type(module).__name__} ({what})")


def _convert_self_attention(
    layers: Sequence[nn.Module], attention: str, indices: int | Sequence[int] | str, causal: bool, options: dict
) -> list[int]:
    chosen = resolve_layer_indices(indices, len(layers))
    check_causal_capability(attention, causal, "the converted layers" if causal else "this encoder")
    for i in chosen:
        if isinstance(layers[i].self_attn, MultiheadSelfAttention):
            raise ValueError(f"layers: layer {i} is already converted ({layers[i].self_attn.attention!r})")
    new = [
        MultiheadSelfAttention.from_torch(layers[i].self_attn, attention, causal=causal, where=f"layer {i}", **options)
        for i in chosen
    ]
    for i, stand_in in zip(chosen, new):
        layers[i].self_attn = stand_in
    return chosen


def convert_transformer_encoder(
    encoder: nn.TransformerEncoder | nn.TransformerEncoderLayer,
    attention: str = "softmax",
    layers: int | Sequence[int] | str = (-1,),
    *,
    causal: bool = False,
    **options: Any,
) -> nn.Module:
    """Replace the self-attention of the chosen layers by :class:`MultiheadSelfAttention` (in place).

    Args:
        encoder: an ``nn.TransformerEncoder`` (or a single ``nn.TransformerEncoderLayer``).
        attention: registered mechanism name. layers: indices (negative from the end) or ``"all"``.
        causal: build causal layers (then call the encoder with ``is_causal=True`` / a causal mask).
        options: mechanism options.

    Returns:
        ``encoder`` (converted in place). Its nested-tensor fast path is turned off (it would bypass the stand-ins).

    Raises:
        IndexError: a layer index out of range. ValueError: a mechanism that cannot run in the requested mode,
        or a layer converted twice.
    """
    mods = _transformer_layers(encoder, (nn.TransformerEncoderLayer,), nn.TransformerEncoder, "encoder")
    _convert_self_attention(mods, attention, layers, causal, options)
    if isinstance(encoder, nn.TransformerEncoder):
        encoder.use_nested_tensor = False
    return encoder


def convert_transformer_decoder(
    decoder: nn.TransformerDecoder | nn.TransformerDecoderLayer,
    attention: str = "softmax",
    layers: int | Sequence[int] | str = (-1,),
    *,
    causal: bool = True,
    **options: Any,
) -> nn.Module:
    """As :func:`convert_transformer_encoder`, for the self-attention of ``nn.TransformerDecoder`` layers.

    The cross-attention (``multihead_attn``) is left as it is. ``causal`` defaults to True (call the decoder with
    ``tgt_is_causal=True`` or a causal ``tgt_mask``).
    """
    mods = _transformer_layers(decoder, (nn.TransformerDecoderLayer,), nn.TransformerDecoder, "decoder")
    _convert_self_attention(mods, attention, layers, causal, options)
    return decoder
