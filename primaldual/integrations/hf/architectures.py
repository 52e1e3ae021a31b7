"""Where each supported Hugging Face architecture keeps its self-attention, and how to read its weights.

One entry per model type: the paths to its list of blocks, and a reader that takes a block and returns a
:class:`Site`: the attribute holding the module to replace, its projections in ``nn.Linear`` layout, and the
settings a faithful replacement needs (heads, causality, logit scale, dropouts, cache index, post-norm).

=========================  ======================  ===========================  ==================================
model type                 blocks                  replaced module              projections
=========================  ======================  ===========================  ==================================
``gpt2``                   ``transformer.h``       ``block.attn``               fused ``c_attn`` / ``c_proj``
                                                                                (``Conv1D``: weights transposed)
``decision_transformer``   ``encoder.h``           ``block.attn``               as GPT-2
``bert``, ``roberta``,     ``<base>.encoder.layer`` ``layer.attention`` (self +  ``self.query/key/value``,
``xlm-roberta``,                                   output block; its residual   ``output.dense``
``camembert``, ``electra``                         ``LayerNorm`` is kept)
``distilbert``             ``transformer.layer``   ``layer.attention``          ``q_lin/k_lin/v_lin/out_lin``
``vit``, ``deit``,         ``<base>.layers``       ``layer.attention``          ``q_proj/k_proj/v_proj/o_proj``
``dinov2``                 (DINOv2:
                           ``encoder.layer``)
``clip_vision_model``,     ``<tower>.encoder       ``layer.self_attn``          ``q_proj/k_proj/v_proj/out_proj``
``siglip_vision_model``,   .layers``                                            (CLIP's text tower: causal, never
``clip_text_model``                                                             cached)
``opt``                    ``model.decoder.layers`` ``layer.self_attn``         ``q_proj/k_proj/v_proj/out_proj``
``llama``                  ``model.layers``        ``layer.self_attn``          ``q_proj/k_proj/v_proj/o_proj``;
                                                                                grouped K / V heads repeated to
                                                                                the query heads; RoPE (below)
``mistral``, ``qwen2``,    ``model.layers``        ``layer.self_attn``          as Llama (Phi-3: one fused
``gemma``, ``granite``,                                                         ``qkv_proj``); what a converted
``olmo``, ``smollm3``,                                                          layer cannot reproduce is refused
``phi3``                                                                        (:func:`_rotary_layout`)
``qwen3``, ``qwen3_moe``,  ``model.layers``        ``layer.self_attn``          as Llama, plus the RMS norms on q
``olmo2``, ``olmo3``,                                                           and k (:func:`_qk_norm`): per head
``gemma3_text``                                                                 (Qwen3, Gemma 3) or over all heads
                                                                                (OLMo 2 and 3)
``stablelm``, ``phi``      ``model.layers``        ``layer.self_attn``          as Llama, partial rotary (Phi-2:
                                                                                ``dense`` out)
``gemma2``                 ``model.layers``        ``layer.self_attn``          as Llama, soft-capped logits
``gpt_neox``               ``gpt_neox.layers``     ``layer.attention``          fused ``query_key_value``, rows
                                                                                ``[q; k; v]`` per head; ``dense``
=========================  ======================  ===========================  ==================================

A sliding-window layer (Mistral, Phi-3, Gemma 2 and 3, OLMo 3, Qwen2 and SmolLM3 with ``use_sliding_window``) is
read like the others, with its window in :attr:`Site.window` (:func:`_sliding_window`).

Llama's attention (and that of each type of its layout) receives its rotary tables from the decoder layer
(``position_embeddings``); a Site with ``rope=True`` tells the replacement to hand them to mechanisms that take them
(``capabilities.rope``: softmax, sparse, and hybrid's window branch) and to warn, once at conversion, where the
mechanism does not (primal: its positions come from its causal prefix means).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...functional.qk_norm import QKNorm
from .compat import model_type_of, positional_arg_names

__all__ = ["SUPPORTED_MODEL_TYPES", "Site", "find_blocks", "read_site"]

Projection = tuple[Tensor, Tensor | None]


@dataclass
class Site:
    """A block's self-attention, as :func:`~primaldual.integrations.hf.convert` needs it.

    Attributes:
        attr: the block attribute that holds the module to replace.
        module: that module.
        q, k, v, out: ``(weight, bias or None)`` in ``nn.Linear`` layout (``(out_features, in_features)``).
        num_heads, causal, scale, attn_drop, proj_drop: the original's settings.
        layer_idx: its index in the model's cache (None for encoders).
        norm: the residual ``LayerNorm`` inside the replaced module (post-norm BERT), or None.
        out_module: with ``norm``, the output projection whose result the residual is added to: the attention's
            output that a conversion reads (taking the residual back out of the norm's input loses half-precision
            digits).
        rope: the module receives rotary tables (``position_embeddings``) and applies them to q and k (Llama).
        qk_norm: the module's RMS norms on q and k, applied before the rotary tables (Qwen3, OLMo 2, Gemma 3).
        softcap: the cap on its logits, ``s -> softcap * tanh(s / softcap)`` (Gemma 2), or None.
        decodes: a causal module that generation calls with a cache (False: a causal encoder, CLIP's text tower).
        window: the keys a sliding-window layer sees, its own included (Mistral, Gemma 2 and 3, ...), or None for
            full attention.
    """

    attr: str
    module: nn.Module
    q: Projection
    k: Projection
    v: Projection
    out: Projection
    num_heads: int
    causal: bool
    scale: float | None
    attn_drop: float
    proj_drop: float
    layer_idx: int | None
    norm: nn.Module | None = None
    rope: bool = False
    qk_norm: QKNorm | None = None
    softcap: float | None = None
    decodes: bool = True
    out_module: nn.Module | None = None
    window: int | None = None

    @property
    def arg_names(self) -> tuple[str, ...]:
        """The replaced forward's parameters after ``hidden_states`` that can be passed positionally."""
        return positional_arg_names(self.module)


class LayoutError(ValueError):
    """A block does not have the layout its model type promises (e.g. a transformers version with other names)."""


def _linear(m: nn.Module) -> Projection:
    return m.weight, m.bias


def _gpt2(block: nn.Module) -> Site:
    attn = getattr(block, "attn", None)
    if attn is None or not hasattr(attn, "c_attn") or not hasattr(attn, "c_proj"):
        raise LayoutError("expected a GPT-2 block with attn.c_attn and attn.c_proj")
    if getattr(attn, "is_cross_attention", False):
        raise LayoutError("block.attn is a cross-attention")
    C = attn.embed_dim
    w = attn.c_attn.weight.t()  # Conv1D stores (in, out): (C, 3C) -> (3C, C)
    b = attn.c_attn.bias  # (3C,)
    return Site(
        attr="attn",
        module=attn,
        q=(w[:C], b[:C]),
        k=(w[C : 2 * C], b[C : 2 * C]),
        v=(w[2 * C :], b[2 * C :]),
        out=(attn.c_proj.weight.t(), attn.c_proj.bias),  # (C, C) Conv1D -> Linear layout
        num_heads=attn.num_heads,
        causal=bool(getattr(attn, "is_causal", True)),
        scale=float(attn.scaling),
        attn_drop=float(attn.attn_dropout.p),
        proj_drop=float(attn.resid_dropout.p),
        layer_idx=attn.layer_idx,
    )


def _bert(block: nn.Module) -> Site:
    att = getattr(block, "attention", None)
    sa = getattr(att, "self", None)
    so = getattr(att, "output", None)
    if sa is None or so is None or not all(hasattr(sa, n) for n in ("query", "key", "value")):
        raise LayoutError("expected a BERT layer with attention.self.query/key/value and attention.output.dense")
    if getattr(att, "is_cross_attention", False):
        raise LayoutError("layer.attention is a cross-attention")
    if getattr(sa, "position_embedding_type", "absolute") not in (None, "absolute"):
        raise LayoutError(f"relative position attention ({sa.position_embedding_type!r}) has no primaldual equivalent")
    heads = sa.num_attention_heads
    return Site(
        attr="attention",
        module=att,
        q=_linear(sa.query),
        k=_linear(sa.key),
        v=_linear(sa.value),
        out=_linear(so.dense),
        num_heads=heads,
        causal=bool(getattr(sa, "is_causal", False)),
        scale=float(getattr(sa, "scaling", sa.attention_head_size**-0.5)),
        attn_drop=float(sa.dropout.p),
        proj_drop=float(so.dropout.p),
        layer_idx=getattr(sa, "layer_idx", None),
        norm=so.LayerNorm,
        out_module=so.dense,
    )


def _vit(block: nn.Module) -> Site:
    att = getattr(block, "attention", None)
    if att is not None and all(hasattr(att, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return Site(
            attr="attention",
            module=att,
            q=_linear(att.q_proj),
            k=_linear(att.k_proj),
            v=_linear(att.v_proj),
            out=_linear(att.o_proj),
            num_heads=att.num_attention_heads,
            causal=False,
            scale=float(att.scaling),
            attn_drop=float(att.attention_dropout),
            proj_drop=0.0,
            layer_idx=None,
        )
    sa, so = getattr(att, "attention", None), getattr(att, "output", None)
    if sa is None or so is None or not all(hasattr(sa, n) for n in ("query", "key", "value")):
        raise LayoutError("expected a ViT layer with attention.q_proj/k_proj/v_proj/o_proj")
    return Site(  # the transformers 4 layout: attention.attention.query ..., attention.output.dense
        attr="attention",
        module=att,
        q=_linear(sa.query),
        k=_linear(sa.key),
        v=_linear(sa.value),
        out=_linear(so.dense),
        num_heads=sa.num_attention_heads,
        causal=False,
        scale=float(getattr(sa, "scaling", sa.attention_head_size**-0.5)),
        attn_drop=float(getattr(sa, "dropout_prob", 0.0)),
        proj_drop=float(so.dropout.p),
        layer_idx=None,
    )


def _distilbert(block: nn.Module) -> Site:
    """DistilBERT: ``attention`` with ``q_lin/k_lin/v_lin/out_lin``; the residual norm (``sa_layer_norm``) is the
    block's, outside the replaced module."""
    att = getattr(block, "attention", None)
    if att is None or not all(hasattr(att, n) for n in ("q_lin", "k_lin", "v_lin", "out_lin")):
        raise LayoutError("expected a DistilBERT block with attention.q_lin/k_lin/v_lin/out_lin")
    return Site(
        attr="attention",
        module=att,
        q=_linear(att.q_lin),
        k=_linear(att.k_lin),
        v=_linear(att.v_lin),
        out=_linear(att.out_lin),
        num_heads=att.n_heads,
        causal=False,
        scale=float(att.scaling),
        attn_drop=float(att.dropout.p),
        proj_drop=0.0,
        layer_idx=None,
    )


def _dinov2(block: nn.Module) -> Site:
    """DINOv2: ViT's ``q_proj/k_proj/v_proj/o_proj`` layout (transformers 5.18 on; before, DINOv2 kept the older
    ``attention.attention.query`` layout with a module that returns a tensor, not ``(out, weights)``)."""
    att = getattr(block, "attention", None)
    if att is None or not all(hasattr(att, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        raise LayoutError(
            "expected a DINOv2 layer with attention.q_proj/k_proj/v_proj/o_proj, the layout of transformers 5.18 "
            "and later (pip install 'transformers>=5.18')"
        )
    return _vit(block)


def _clip(block: nn.Module, causal: bool = False) -> Site:
    """CLIP's and SigLIP's vision towers and CLIP's text tower: ``self_attn`` with ``q_proj/k_proj/v_proj/out_proj``;
    bidirectional, or (CLIP's text tower) causal through the mask the tower builds, with no cache. SigLIP's text
    tower is not a supported type: it pools its last position, which is padding in a padded batch, where a converted
    layer outputs zero."""
    attn = getattr(block, "self_attn", None)
    if attn is None or not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj")):
        raise LayoutError("expected an encoder layer with self_attn.q_proj/k_proj/v_proj/out_proj")
    return Site(
        attr="self_attn",
        module=attn,
        q=_linear(attn.q_proj),
        k=_linear(attn.k_proj),
        v=_linear(attn.v_proj),
        out=_linear(attn.out_proj),
        num_heads=attn.num_heads,
        causal=causal,
        scale=float(attn.scale),
        attn_drop=float(attn.dropout),
        proj_drop=0.0,
        layer_idx=None,
        decodes=False,
    )


def _clip_text(block: nn.Module) -> Site:
    """CLIP's text tower: causal (its tower passes a causal mask), pooled at its end-of-text token, never cached."""
    return _clip(block, causal=True)


def _repeat_heads(proj: Projection, kv_heads: int, heads: int, head_dim: int, name: str) -> Projection:
    """A grouped key / value projection ``(Hkv * D, C)`` as ``(H * D, C)``: each of the ``Hkv`` heads repeated for
    the ``H / Hkv`` consecutive query heads it serves (transformers' ``repeat_kv`` order)."""
    w, b = proj
    if w.shape[0] != kv_heads * head_dim:
        raise LayoutError(f"{name} has {w.shape[0]} outputs, expected {kv_heads} heads x {head_dim}")
    if heads % kv_heads:
        raise LayoutError(f"{kv_heads} key / value heads do not divide the {heads} query heads")
    g = heads // kv_heads
    w = w.view(kv_heads, head_dim, -1).repeat_interleave(g, 0).reshape(heads * head_dim, -1)  # (H*D, C)
    if b is not None:
        b = b.view(kv_heads, head_dim).repeat_interleave(g, 0).reshape(heads * head_dim)  # (H*D,)
    return w, b


def _rotary_layout(attn: nn.Module) -> str | None:
    """Why a Llama-layout attention cannot be reproduced by a converted layer, or None: projections clamped,
    LayerNorms on queries and keys, or a bidirectional decoder."""
    cfg = attn.config
    if not getattr(attn, "is_causal", True):
        return "a bidirectional decoder (is_causal False: use_bidirectional_attention) is not supported"
    if getattr(cfg, "clip_qkv", None) is not None:
        return f"clamped projections (clip_qkv={cfg.clip_qkv}) are not supported"
    if any(getattr(attn, n, None) is not None for n in ("q_layernorm", "k_layernorm")):
        return "LayerNorms on queries / keys (qk_layernorm) are not supported (RMS norms, q_norm / k_norm, are)"
    return None


def _sliding_window(attn: nn.Module) -> int | None:
    """The keys a Llama-layout attention sees, counting its own (query ``i`` attends to ``i - window < j <= i``), or
    None for full attention: the layer's own ``sliding_window`` where it keeps one (Qwen2, Gemma 2 and 3, OLMo 3,
    SmolLM3: None on full-attention layers), else the model's (Mistral, Phi-3). A layer type other than full or
    sliding attention (chunked, ...) is a :class:`LayoutError`."""
    cfg = attn.config
    window = attn.sliding_window if hasattr(attn, "sliding_window") else getattr(cfg, "sliding_window", None)
    types, i = getattr(cfg, "layer_types", None) or [], attn.layer_idx
    kind = types[i] if i is not None and i < len(types) else None
    if kind not in (None, "full_attention", "sliding_attention"):
        raise LayoutError(f"attention of layer type {kind!r} is not supported (full and sliding-window attention are)")
    if window is None:
        if kind == "sliding_attention":
            raise LayoutError("a sliding-attention layer without a window (sliding_window None) is not supported")
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise LayoutError(f"sliding_window must be a positive int, got {window!r}")
    return window


def _rms_gain(norm: nn.Module, width: int, name: str) -> tuple[Tensor, float]:
    """The gain an RMS norm ``norm`` applies and its epsilon. Two parametrisations exist (``x_hat * w``: Llama,
    Qwen3, OLMo 2; ``x_hat * (1 + w)``: Gemma); which one is read from a copy of the module run on a probe with a
    known weight, in float32 on the CPU whatever the default dtype and device are, so a model transformers builds
    on the meta device or in bf16 while loading is read as a loaded one. A norm that is neither (a LayerNorm, an
    extra parameter) is a :class:`LayoutError`."""
    params = dict(norm.named_parameters())
    weight = params.get("weight")
    if set(params) != {"weight"} or tuple(weight.shape) != (width,):
        raise LayoutError(f"self_attn.{name} is not an RMS norm of {width} features with one gain")
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if not isinstance(eps, float):
        raise LayoutError(
            f"self_attn.{name} has no float epsilon (variance_epsilon or eps; got {eps!r}); torch's RMSNorm needs "
            "an explicit eps"
        )
    fk = {"device": torch.device("cpu"), "dtype": torch.float32}
    probe = copy.deepcopy(norm).to_empty(device="cpu").float()
    g = torch.Generator().manual_seed(0)
    w = torch.rand(width, generator=g, **fk) + 0.5
    # the second row's mean square is about eps: it tells the epsilon apart
    x = torch.randn(3, width, generator=g, **fk) * torch.tensor([[1.0], [1e-3], [10.0]], **fk)
    with torch.no_grad():
        probe.weight.copy_(w)
        y = probe(x)
    x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if torch.allclose(y, x_hat * w, rtol=1e-4, atol=1e-6):
        return weight.detach(), eps
    if torch.allclose(y, x_hat * (1 + w), rtol=1e-4, atol=1e-6):
        return weight.detach().float() + 1, eps  # the 1 added in float32, as Gemma's forward adds it
    raise LayoutError(f"self_attn.{name} is not an RMS norm (x * rsqrt(mean(x^2) + eps) times a gain)")


def _qk_norm(attn: nn.Module, heads: int, kv_heads: int, head_dim: int) -> QKNorm | None:
    """The attention's RMS norms on queries and keys (None without): per head (Qwen3, Gemma 3: a gain of
    ``head_dim``) or over all heads (OLMo 2: the query width, and the key width of the grouped heads, repeated here
    to the query heads)."""
    q_norm, k_norm = (getattr(attn, n, None) for n in ("q_norm", "k_norm"))
    q_norm, k_norm = (None if isinstance(m, nn.Identity) else m for m in (q_norm, k_norm))  # Identity: built without
    if q_norm is None and k_norm is None:
        return None
    if q_norm is None or k_norm is None:
        raise LayoutError("a norm on the queries or on the keys alone (self_attn.q_norm / k_norm) is not supported")
    weight = getattr(q_norm, "weight", None)
    kinds = {head_dim: "head", heads * head_dim: "all_heads"}
    if not isinstance(weight, Tensor) or weight.dim() != 1 or weight.shape[0] not in kinds:
        raise LayoutError(
            f"self_attn.q_norm is not an RMS norm over one head's {head_dim} features or all heads' "
            f"{heads * head_dim} (its weight: {None if weight is None else tuple(weight.shape)})"
        )
    kind = kinds[weight.shape[0]]
    q, eps = _rms_gain(q_norm, head_dim if kind == "head" else heads * head_dim, "q_norm")
    k, k_eps = _rms_gain(k_norm, head_dim if kind == "head" else kv_heads * head_dim, "k_norm")
    if k_eps != eps:
        raise LayoutError(f"q_norm and k_norm have different epsilons ({eps} and {k_eps})")
    if kind == "all_heads":
        k = k.view(kv_heads, head_dim).repeat_interleave(heads // kv_heads, 0).reshape(heads * head_dim)  # (H*D,)
    return QKNorm(kind, eps, q, k)


def _rotary(block: nn.Module) -> Site:
    """The Llama layout: ``self_attn`` with ``q_proj/k_proj/v_proj/o_proj`` (Phi-3: one fused ``qkv_proj``, rows
    ``[q; k; v]``; Phi-2: ``dense`` for ``o_proj``), grouped K / V heads, rotary tables from the decoder layer (of the
    rotated width only, for partial rotary), the logit scale ``attn.scaling`` (Granite's is its own)."""
    attn = getattr(block, "self_attn", None)
    out = "dense" if hasattr(attn, "dense") and not hasattr(attn, "o_proj") else "o_proj"  # Phi-2: dense
    names = ("qkv_proj", out) if hasattr(attn, "qkv_proj") else ("q_proj", "k_proj", "v_proj", out)
    if attn is None or not all(hasattr(attn, n) for n in names):
        raise LayoutError(f"expected a decoder layer with self_attn.{'/'.join(names)}")
    if (reason := _rotary_layout(attn)) is not None:
        raise LayoutError(reason)
    cfg = attn.config
    heads, kv_heads, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim
    if hasattr(attn, "qkv_proj"):
        w, b = _linear(attn.qkv_proj)
        cut = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        if w.shape[0] != sum(cut):
            raise LayoutError(
                f"qkv_proj has {w.shape[0]} outputs, expected {heads} + 2 x {kv_heads} heads x {head_dim}"
            )
        q, k, v = zip(w.split(cut), b.split(cut) if b is not None else (None,) * 3)  # (rows, C) each
    else:
        q, k, v = _linear(attn.q_proj), _linear(attn.k_proj), _linear(attn.v_proj)
    return Site(
        attr="self_attn",
        module=attn,
        q=q,
        k=_repeat_heads(k, kv_heads, heads, head_dim, "k_proj"),
        v=_repeat_heads(v, kv_heads, heads, head_dim, "v_proj"),
        out=_linear(getattr(attn, out)),
        num_heads=heads,
        causal=True,
        scale=float(attn.scaling),
        attn_drop=float(attn.attention_dropout),
        proj_drop=0.0,
        layer_idx=attn.layer_idx,
        rope=bool(getattr(attn, "use_rope", True)),  # SmolLM3's NoPE layers take no tables
        qk_norm=_qk_norm(attn, heads, kv_heads, head_dim),
        softcap=None if (cap := getattr(cfg, "attn_logit_softcapping", None)) is None else float(cap),
        window=_sliding_window(attn),
    )


def _gpt_neox(block: nn.Module) -> Site:
    """GPT-NeoX (Pythia): ``attention`` with one fused ``query_key_value`` whose rows are per head ``[q; k; v]``
    (``(H, 3, D)``), ``dense`` out, partial rotary tables from the model, the cache as ``layer_past``."""
    attn = getattr(block, "attention", None)
    if attn is None or not all(hasattr(attn, n) for n in ("query_key_value", "dense")):
        raise LayoutError("expected a GPT-NeoX layer with attention.query_key_value and attention.dense")
    heads, head_dim = attn.config.num_attention_heads, attn.head_size
    w, b = _linear(attn.query_key_value)  # (3C, C): rows per head [q; k; v]
    if w.shape[0] != 3 * heads * head_dim:
        raise LayoutError(f"query_key_value has {w.shape[0]} outputs, expected 3 x {heads} heads x {head_dim}")
    ws = w.view(heads, 3, head_dim, -1).unbind(1)  # 3 x (H, D, C)
    bs = b.view(heads, 3, head_dim).unbind(1) if b is not None else (None,) * 3  # 3 x (H, D)
    q, k, v = ((wi.reshape(heads * head_dim, -1), None if bi is None else bi.reshape(-1)) for wi, bi in zip(ws, bs))
    return Site(
        attr="attention",
        module=attn,
        q=q,
        k=k,
        v=v,
        out=_linear(attn.dense),
        num_heads=heads,
        causal=True,
        scale=float(attn.scaling),
        attn_drop=float(attn.attention_dropout),
        proj_drop=0.0,  # the layer drops after the module
        layer_idx=attn.layer_idx,
        rope=attn.rotary_ndims > 0,  # rotary_pct 0: the model rotates nothing (tables of width 0)
    )


def _opt(block: nn.Module) -> Site:
    """OPT: ``self_attn`` with ``q_proj/k_proj/v_proj/out_proj`` (biases), learned positions (added to the
    embeddings, so the attention takes none), causal."""
    attn = getattr(block, "self_attn", None)
    if attn is None or not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj")):
        raise LayoutError("expected an OPT decoder layer with self_attn.q_proj/k_proj/v_proj/out_proj")
    return Site(
        attr="self_attn",
        module=attn,
        q=_linear(attn.q_proj),
        k=_linear(attn.k_proj),
        v=_linear(attn.v_proj),
        out=_linear(attn.out_proj),
        num_heads=attn.num_heads,
        causal=True,
        scale=float(attn.scaling),  # OPT scales q before the product: the same logits
        attn_drop=float(attn.dropout),
        proj_drop=0.0,  # the decoder layer drops after the module
        layer_idx=attn.layer_idx,
    )


#: the model types with the Llama layout (:func:`_rotary`)
ROTARY_MODEL_TYPES = (
    *("llama", "mistral", "qwen2", "gemma", "granite", "olmo", "smollm3", "phi3"),
    *("qwen3", "qwen3_moe", "olmo2", "olmo3", "gemma3_text"),  # with query / key norms
    *("stablelm", "phi"),  # partial rotary
    "gemma2",  # soft-capped logits
)
_FAMILIES: dict[str, tuple[tuple[str, ...], Callable[[nn.Module], Site]]] = {
    "gpt2": (("transformer.h", "h"), _gpt2),
    "decision_transformer": (("encoder.h", "h"), _gpt2),
    "bert": (("bert.encoder.layer", "encoder.layer"), _bert),
    "roberta": (("roberta.encoder.layer", "encoder.layer"), _bert),
    "xlm-roberta": (("roberta.encoder.layer", "encoder.layer"), _bert),
    "camembert": (("roberta.encoder.layer", "encoder.layer"), _bert),
    "electra": (("electra.encoder.layer", "encoder.layer"), _bert),
    "distilbert": (("distilbert.transformer.layer", "transformer.layer"), _distilbert),
    "vit": (("vit.layers", "layers", "vit.encoder.layer", "encoder.layer"), _vit),
    "deit": (("deit.layers", "layers", "deit.encoder.layer", "encoder.layer"), _vit),
    "dinov2": (("dinov2.encoder.layer", "encoder.layer"), _dinov2),
    "clip_vision_model": (("vision_model.encoder.layers", "encoder.layers"), _clip),
    "siglip_vision_model": (("vision_model.encoder.layers", "encoder.layers"), _clip),
    "clip_text_model": (("text_model.encoder.layers", "encoder.layers"), _clip_text),
    "opt": (("model.decoder.layers", "decoder.layers"), _opt),
    "gpt_neox": (("gpt_neox.layers", "layers"), _gpt_neox),
    **{t: (("model.layers", "layers"), _rotary) for t in ROTARY_MODEL_TYPES},
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


#: why some well-known model types are not supported (said in the error)
_NOT_SUPPORTED = {
    "bloom": "ALiBi position biases have no primaldual equivalent",
    "mpt": "ALiBi position biases have no primaldual equivalent",
    "t5": "relative position biases have no primaldual equivalent",
    "deberta": "disentangled relative-position attention has no primaldual equivalent",
    "deberta-v2": "disentangled relative-position attention has no primaldual equivalent",
    "siglip_text_model": "it pools its last position, padding in a padded batch, where a converted layer outputs 0",
}


def _model_type(model: nn.Module) -> str:
    model_type = model_type_of(model)
    if model_type not in _FAMILIES:
        why = f": {_NOT_SUPPORTED[model_type]}" if model_type in _NOT_SUPPORTED else ""
        raise ValueError(
            f"unsupported architecture: model type {model_type!r} ({type(model).__name__}){why}; "
            f"primaldual.integrations.hf.convert supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return model_type


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """``(path, blocks)``: the model's list of transformer blocks (e.g. ``"transformer.h"`` for GPT-2)."""
    model_type = _model_type(model)
    paths, _ = _FAMILIES[model_type]
    for path in paths:
        node: object = model
        for part in path.split("."):
            node = getattr(node, part, None)
        if isinstance(node, nn.ModuleList) and len(node) > 0:
            return path, node
    raise ValueError(
        f"unsupported layout of model type {model_type!r} ({type(model).__name__}): no block list at "
        f"{' or '.join(paths)}"
    )


def read_site(model: nn.Module, block: nn.Module, index: int) -> Site:
    """The :class:`Site` of ``block`` (the model's block ``index``); errors name the model type and the layer."""
    model_type = _model_type(model)
    try:
        return _FAMILIES[model_type][1](block)
    except LayoutError as err:
        raise ValueError(f"unsupported layout of model type {model_type!r}, layer {index}: {err}") from None
