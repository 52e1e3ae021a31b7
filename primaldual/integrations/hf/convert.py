"""Swap the self-attention of chosen layers of a Hugging Face model for a primaldual mechanism.

``convert(model, "primal", layers=(-1,), s=20)`` replaces, in place, the self-attention module of each chosen layer
by an :class:`~primaldual.integrations.hf.modules.HFSelfAttention` wrapping ``build_attention("primal", ...)``,
with the original query / key / value / output weights copied (primal keeps query, key and output: it has no
values). The model then trains, evaluates, generates and saves as before; ``collect_aux_loss(model)`` returns the
primal layers' KSVD term after a forward with gradients.

Saving and loading: ``model.save_pretrained(path)`` writes the converted weights and records the conversion in
``config.json`` (``primaldual_conversions``). ``AutoModel.from_pretrained(path)`` alone would rebuild the original
architecture, so load with :func:`from_pretrained`, which builds the model with the recorded conversions applied
before transformers loads the weights into it.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from collections.abc import Sequence
from typing import Any

from torch import nn

from ...attention.registry import attention_options
from ...attention.sparse import SparseAttention
from ..torch_nn import (
    attention_from_projections,
    check_causal_capability,
    keep_frozen,
    resolve_layer_indices,
    with_original,
)
from .architectures import find_blocks, read_site
from .compat import (
    concrete_model_class,
    config_value,
    is_pretrained_model,
    model_type_of,
    resolve_cache_keyword,
    set_config_value,
)
from .modules import HFSelfAttention

__all__ = ["CONVERSIONS_KEY", "convert", "converted_layers", "from_pretrained", "sees_beyond"]

CONVERSIONS_KEY = "primaldual_conversions"


def _check_options(options: dict[str, Any]) -> None:
    try:
        json.dumps(options)
    except TypeError as err:
        raise TypeError(
            f"options must be JSON-serialisable (they are recorded in the model's config so that "
            f"from_pretrained can re-apply the conversion): {err}"
        ) from None


def convert(
    model: nn.Module,
    attention: str = "primal",
    layers: int | Sequence[int] | str = (-1,),
    **options: Any,
) -> nn.Module:
    """Replace the self-attention of ``layers`` of ``model`` by primaldual ``attention`` (in place).

    Args:
        model: a transformers model of a type in :data:`~primaldual.integrations.hf.SUPPORTED_MODEL_TYPES` (gpt2,
            opt, gpt_neox, the BERT-like and ViT-like encoders, CLIP's towers, SigLIP's vision tower,
            decision_transformer, llama and the types of its layout; any head).
        attention: a registered mechanism (``primaldual.list_attentions()``).
        layers: block indices (negative from the end) or ``"all"``.
        options: mechanism options (``s=``, ``n=``, ``eta=`` for primal, ``window=`` for sparse, ...). By default
            the logit scale, the attention dropout (where the mechanism has weights to drop) and the output
            dropout are the original's. A sliding-window layer (Mistral, Gemma 2 and 3, ...) keeps its window only
            under ``sparse`` with ``window=sliding_window - 1`` or a branchless, sinkless ``hybrid`` with
            ``window=sliding_window`` (for left or right padding: a mask with padding between real tokens is refused
            for such a layer); a mechanism that sees further back is converted with a ``UserWarning`` naming the
            layers.

    Returns:
        ``model``.

    Raises:
        TypeError: ``model`` is not a transformers ``PreTrainedModel``; an option is not JSON-serialisable.
        ValueError: an unsupported architecture; a mechanism that cannot be causal in a causal model (or the
            reverse); a layer converted twice.
        CacheKeywordError: (a ``ValueError``) the replaced module's forward takes a cache-like parameter that is
            not a known cache keyword, or a causal one takes none (see
            :func:`~primaldual.integrations.hf.compat.resolve_cache_keyword`).
        IndexError: a layer index out of range.
        KeyError: an unknown mechanism.
    """
    if not is_pretrained_model(model):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    _check_options(options)
    path, blocks = find_blocks(model)
    chosen = resolve_layer_indices(layers, len(blocks))
    sites, cache_keywords = [], []
    for i in chosen:  # validate everything before touching the model
        current = getattr(blocks[i], "attn", None) or getattr(blocks[i], "attention", None)
        if isinstance(current, HFSelfAttention):
            raise ValueError(f"layers: layer {i} ({path}.{i}) is already converted")
        try:
            site = read_site(model, blocks[i], i)
        except ValueError as err:
            raise ValueError(f"{err}{_convertible_hint(model, blocks)}") from None
        check_causal_capability(attention, site.causal, f"layer {i} of this {model_type_of(model)} model")
        cache_keywords.append(resolve_cache_keyword(site.module, causal=site.causal and site.decodes))
        sites.append(site)
    new = []
    takes_norms, takes_cap = (n in attention_options(attention) for n in ("qk_norm", "softcap"))
    for site, cache_keyword in zip(sites, cache_keywords):
        own = with_original(attention, options, attn_drop=site.attn_drop, proj_drop=site.proj_drop, scale=site.scale)
        layer = attention_from_projections(
            attention,
            num_heads=site.num_heads,
            q=site.q,
            k=site.k,
            v=site.v,
            out=site.out,
            causal=site.causal,
            qk_norm=site.qk_norm if takes_norms else None,
            softcap=site.softcap if takes_cap else None,
            **own,
        )
        frozen = list(site.module.parameters())  # a module frozen whole leaves the copied projections frozen
        keep_frozen(layer, frozen, frozen)
        layer.train(site.module.training)
        new.append(
            HFSelfAttention(
                layer,
                arg_names=site.arg_names,
                cache_keyword=cache_keyword,
                layer_idx=site.layer_idx,
                norm=site.norm,
                source=type(site.module).__name__,
                rope=site.rope,
                decodes=site.decodes,
                window=site.window,
            ).train(site.module.training)  # the mode of the module it replaces
        )
    # what of the model the mechanism goes without, layer by layer: said once each, never dropped silently
    dropped = {
        "rotary position embeddings, so the converted layers do without the model's RoPE (a primal layer's positions "
        "come from its causal prefix means)": [i for i, s, m in zip(chosen, sites, new) if s.rope and not m.uses_rope],
        "query / key norms (qk_norm), so the converted layers do without the model's q_norm / k_norm (a primal layer "
        "normalises its own features)": [i for i, s in zip(chosen, sites) if s.qk_norm is not None and not takes_norms],
        "logit cap (softcap), so the converted layers do without the model's attn_logit_softcapping (softmax, "
        "sparse and hybrid take it)": [i for i, s in zip(chosen, sites) if s.softcap is not None and not takes_cap],
    }
    beyond = [
        (i, s.window) for i, s, m in zip(chosen, sites, new) if s.window is not None and sees_beyond(m.attn, s.window)
    ]
    if beyond:
        windows = sorted({w for _, w in beyond})
        warnings.warn(
            f"layers {[i for i, _ in beyond]}: the model's sliding window ({' / '.join(map(str, windows))} keys) is not "
            f"kept: attention {attention!r} also sees keys before it (sparse with window=sliding_window - 1, or "
            "hybrid with primal_branch=False, sinks=0 and window=sliding_window, keep it exactly)",
            UserWarning,
            stacklevel=2,
        )
    for what, layers in dropped.items():
        if layers:
            warnings.warn(f"layers {layers}: attention {attention!r} takes no {what}", UserWarning, stacklevel=2)
    for i, site, module in zip(chosen, sites, new):
        setattr(blocks[i], site.attr, module)
    record = list(config_value(model, CONVERSIONS_KEY) or [])
    record.append({"attention": attention, "layers": chosen, "options": dict(options)})
    _own_config(model)
    set_config_value(model, CONVERSIONS_KEY, record)
    return model


def sees_beyond(layer: nn.Module, window: int) -> bool:
    """Whether the converted causal ``layer`` can attend to a key outside a sliding window of ``window`` keys (its own
    included): every mechanism but a sparse one (hybrid's window branch included) with a radius under ``window``, no
    stride, no global tokens (sinks) and no primal branch."""
    if not isinstance(layer, SparseAttention):
        return True
    return layer.window >= window or layer.stride > 0 or layer.num_global > 0 or getattr(layer, "has_branch", False)


def _convertible_hint(model: nn.Module, blocks: nn.ModuleList) -> str:
    """``"; layers that convert: [...]"`` when some of the model's layers can be converted (a model some of whose
    layers are refused), else ``""``."""
    ok = []
    for j, block in enumerate(blocks):
        try:
            read_site(model, block, j)
        except ValueError:
            continue
        ok.append(j)
    return f"; the layers of this model that convert: {ok}" if ok else ""


def _own_config(model: nn.Module) -> None:
    """Give ``model`` (and each of its modules that shares it) a config object of its own: models built from one
    config share it, and the conversion record must not make the others save as converted."""
    shared = model.config
    own = copy.deepcopy(shared)
    for m in model.modules():
        if getattr(m, "config", None) is shared:
            m.config = own


def converted_layers(model: nn.Module) -> dict[str, HFSelfAttention]:
    """``{module name: module}`` of every converted attention in ``model``."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HFSelfAttention)}


def _reapply_conversions(model: nn.Module) -> None:
    """Apply the conversions recorded in ``model.config`` (as :func:`convert` records them) to a fresh model."""
    conversions = list(config_value(model, CONVERSIONS_KEY) or [])
    set_config_value(model, CONVERSIONS_KEY, [])  # convert records each one again
    for spec in conversions:
        convert(model, spec["attention"], layers=spec["layers"], **spec["options"])


def from_pretrained(model_class: type, path: str | os.PathLike, *args: Any, **kwargs: Any) -> nn.Module:
    """Load a model saved after :func:`convert`: the recorded conversions are re-applied before the weights load.

    ``model_class.from_pretrained(path)`` alone would build the original architecture, leave the converted layers'
    weights unused and initialise their original attention randomly. This builds the model through a transient
    subclass of ``model_class`` whose constructor re-applies the conversions recorded in
    ``config.primaldual_conversions``, so transformers' own loading (key renaming, sharding, ``dtype``,
    ``device_map``, hub downloads) fills every weight, the converted ones included, and reports nothing missing.
    The returned model's class is ``model_class`` again.

    Args:
        model_class: the concrete model class (``GPT2LMHeadModel``, ``BertForSequenceClassification``, ...); an
            ``AutoModel...`` class is resolved from the saved config.
        path: what ``model_class.from_pretrained`` accepts (a ``save_pretrained`` directory, a hub id).
        args, kwargs: passed to ``from_pretrained``.
    """
    model_class = concrete_model_class(model_class, path, kwargs)

    def __init__(self: nn.Module, config: Any, *a: Any, **kw: Any) -> None:
        model_class.__init__(self, config, *a, **kw)
        _reapply_conversions(self)

    names = {"__init__": __init__, "__module__": model_class.__module__, "__qualname__": model_class.__qualname__}
    loader = type(model_class.__name__, (model_class,), names)
    model = loader.from_pretrained(path, *args, **kwargs)
    model.__class__ = model_class
    return model
