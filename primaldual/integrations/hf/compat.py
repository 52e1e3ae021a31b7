"""Every contact of :mod:`primaldual.integrations.hf` with transformers, in one module.

The other modules of the package import what they need from here; none of them imports transformers. Each contact,
and why it is needed:

* **Version** (``transformers.__version__``): checked at import against :data:`TRANSFORMERS_RANGE`, the releases
  the integration is tested with (the same range as the ``hf`` and ``test`` extras in ``pyproject.toml``). Below
  the minimum: ``ImportError``; at or above the first untested release: :class:`UntestedTransformersWarning`.
* **Attention forward signatures** (``inspect.signature`` of the replaced module's ``forward``): the replacement
  accepts the same call, so its positional parameter names are recorded (:func:`positional_arg_names`), and the
  keyword that carries the cache is resolved once, at ``convert()`` time (:func:`resolve_cache_keyword`).
  transformers 5.9-5.23 call it ``past_key_values``, 5.24 ``cache``, GPT-NeoX ``layer_past``
  (:data:`CACHE_KEYWORDS`); a cache-like parameter with another name, or a causal module with none, is refused
  with :class:`CacheKeywordError`.
* **Cache objects** (``transformers.cache_utils``: ``Cache``, ``DynamicLayer``, ``EncoderDecoderCache``; a
  cache's ``layers`` list and ``layer_class_to_replicate``): a converted causal layer keeps its state in its own
  entry of the model's cache (:func:`self_attention_cache`, :func:`cache_entry`, :func:`set_cache_entry`).
  :class:`~primaldual.integrations.hf.cache.PrimalCacheLayer` implements the ``DynamicLayer`` interface.
* **Output collector** (private ``transformers.utils.output_capturing._active_collector``): models that collect
  attention weights with forward hooks (GPT-2 from transformers 5.x with output capturing) do not pass
  ``output_attentions`` down; the replacement reads the collector to know whether weights were asked for, and
  hands its weights to it (:func:`active_output_collector`). A collector that cannot be read raises; it is never
  taken as "not requested".
* **Attention-interface registries** (``transformers.AttentionInterface``,
  ``transformers.masking_utils.AttentionMaskInterface``, ``causal_mask_function``,
  ``bidirectional_mask_function``) and the attention module's ``is_causal`` attribute: how
  ``register_hf_attentions`` adds its functions, and which mask patterns they accept.
* **Models and configs** (``transformers.PreTrainedModel``, ``AutoConfig``, the private ``_model_mapping`` of
  ``AutoModel*`` classes, ``config.model_type``, extra config attributes, which ``save_pretrained`` writes to
  ``config.json``): what ``convert`` accepts, which layout reader applies, and where the conversion record lives.
* **Peer models** (``GPT2Config`` / ``GPT2LMHeadModel``, ``DecisionTransformerConfig`` /
  ``DecisionTransformerModel``; their config fields, the forward keywords ``input_ids`` / ``attention_mask`` /
  ``position_ids`` / ``use_cache`` and ``states`` / ``actions`` / ``returns_to_go`` / ``timesteps`` /
  ``attention_mask``, and the outputs ``logits`` / ``action_preds``): the Hugging Face models trained by the
  harness beside ours (:mod:`primaldual.integrations.hf.peers`).
* **Trainer** (``transformers.Trainer``; its ``loss_is_scaled_for_ga``, ``model_accepts_loss_kwargs``,
  ``compute_loss_func`` and ``current_gradient_accumulation_steps`` attributes): ``PrimalDualTrainer`` divides the
  auxiliary loss by the accumulation steps exactly when the ``Trainer`` does not divide the task loss.

Not here: the per-architecture weight layouts (``architectures.py``), which read each model's public submodules
(``attn.c_attn``, ``attention.self.query`` ...) and report a mismatch as an unsupported layout.
"""

from __future__ import annotations

import inspect
import re
import warnings
from types import ModuleType
from typing import Any

from torch import nn

TRANSFORMERS_MIN: tuple[int, int] = (5, 9)  # the oldest supported release (5.0 to 5.8 fail the tests)
TRANSFORMERS_BELOW: tuple[int, int] = (5, 25)  # the first release not tested (the tested one is 5.24)
TRANSFORMERS_RANGE = f">={TRANSFORMERS_MIN[0]}.{TRANSFORMERS_MIN[1]},<{TRANSFORMERS_BELOW[0]}.{TRANSFORMERS_BELOW[1]}"

try:
    import transformers
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f'primaldual.integrations.hf needs transformers{TRANSFORMERS_RANGE}: pip install "primaldual[hf]"'
    ) from err

__all__ = [
    "CACHE_KEYWORDS",
    "NOT_CACHE_PARAMETERS",
    "TRANSFORMERS_BELOW",
    "TRANSFORMERS_MIN",
    "TRANSFORMERS_RANGE",
    "Cache",
    "CacheKeywordError",
    "DecisionTransformerConfig",
    "DecisionTransformerModel",
    "DynamicLayer",
    "GPT2Config",
    "GPT2LMHeadModel",
    "Trainer",
    "UntestedTransformersWarning",
    "active_output_collector",
    "cache_entry",
    "check_transformers_version",
    "concrete_model_class",
    "config_value",
    "installed_transformers_version",
    "is_plain_dynamic_layer",
    "is_plain_sliding_layer",
    "is_plain_mask_function",
    "is_pretrained_model",
    "model_type_of",
    "module_is_causal",
    "positional_arg_names",
    "register_attention_implementation",
    "resolve_cache_keyword",
    "self_attention_cache",
    "set_cache_entry",
    "set_config_value",
    "trainer_accumulation_steps",
    "trainer_loss_is_normalised",
]


class UntestedTransformersWarning(UserWarning):
    """The installed transformers is newer than the releases primaldual.integrations.hf is tested with."""


class CacheKeywordError(ValueError):
    """A replaced attention module's forward carries its cache under a keyword this integration does not know."""


def installed_transformers_version() -> str:
    """``transformers.__version__``, read at each call."""
    return str(transformers.__version__)


def _release(version: str) -> tuple[int, ...]:
    """``"5.24.0.dev0"`` -> ``(5, 24, 0)``: the numeric release, pre- and dev-releases counted as their release."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if match is None:
        raise ImportError(f"cannot read the installed transformers version {version!r}; expected e.g. '5.24.0'")
    return tuple(int(part) for part in match.group(1).split("."))


def check_transformers_version(version: str | None = None) -> None:
    """Refuse a transformers below :data:`TRANSFORMERS_RANGE`; warn about one above it.

    Args:
        version: the version to check (default: the installed one).

    Raises:
        ImportError: ``version`` is older than the oldest supported release.

    Warns:
        UntestedTransformersWarning: ``version`` is the first untested release or newer.
    """
    version = installed_transformers_version() if version is None else version
    release = _release(version)
    if release < TRANSFORMERS_MIN:
        raise ImportError(
            f"primaldual.integrations.hf needs transformers{TRANSFORMERS_RANGE}, but transformers {version} is "
            f'installed: pip install "primaldual[hf]" (or "transformers{TRANSFORMERS_RANGE}")'
        )
    if release[:2] >= TRANSFORMERS_BELOW:
        warnings.warn(
            f"transformers {version} is newer than the releases primaldual.integrations.hf is tested with "
            f"(transformers{TRANSFORMERS_RANGE}); a changed transformers internal raises an error naming it",
            UntestedTransformersWarning,
            stacklevel=2,
        )


check_transformers_version()  # before the imports below, which an older release may not have

# the version check comes first, so that an old release fails with its message rather than a missing name
from transformers import (  # noqa: E402
    AttentionInterface,
    AutoConfig,
    DecisionTransformerConfig,
    DecisionTransformerModel,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
    Trainer,
)
from transformers.cache_utils import (  # noqa: E402
    Cache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    EncoderDecoderCache,
)
from transformers.masking_utils import (  # noqa: E402
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
)

# ------------------------------------------------------------------------------------------ forward signatures
CACHE_KEYWORDS: tuple[str, ...] = ("cache", "past_key_values", "layer_past")  # >= 5.24; 5.9-5.23; GPT-NeoX
NOT_CACHE_PARAMETERS = frozenset({"cache_position", "use_cache"})  # cache-sounding names that carry no cache
_CACHE_LIKE = re.compile(r"(^|_)(cache|past|kv)(_|$)")


def _forward_parameters(module: nn.Module) -> list[inspect.Parameter]:
    """The parameters of ``type(module).forward`` after ``self`` and ``hidden_states``.

    ``inspect.signature`` follows ``functools.wraps`` (transformers' ``deprecate_kwarg``), so these are the
    names of the decorated function.
    """
    return list(inspect.signature(type(module).forward).parameters.values())[2:]


def positional_arg_names(module: nn.Module) -> tuple[str, ...]:
    """``module``'s forward parameters after ``hidden_states`` that can be passed positionally, in order."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in _forward_parameters(module) if p.kind in kinds)


def _cache_like(parameter: inspect.Parameter) -> bool:
    if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        return False
    if parameter.name in NOT_CACHE_PARAMETERS:
        return False
    annotation = parameter.annotation
    annotated = annotation is not inspect.Parameter.empty and "Cache" in str(
        getattr(annotation, "__name__", annotation)
    )
    return annotated or _CACHE_LIKE.search(parameter.name) is not None


def resolve_cache_keyword(module: nn.Module, *, causal: bool) -> str | None:
    """The keyword under which ``module``'s forward receives the model's cache, from its signature.

    Args:
        module: the Hugging Face attention module to be replaced.
        causal: whether it is causal (a causal module must have a cache keyword: generation passes its cache).

    Returns:
        One of :data:`CACHE_KEYWORDS`, or None for a bidirectional module whose forward takes no cache.

    Raises:
        CacheKeywordError: the forward takes a cache-like parameter that is not a known keyword, several known
            ones, or (causal modules) none.
    """
    params = _forward_parameters(module)
    names = [p.name for p in params if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    known = [n for n in names if n in CACHE_KEYWORDS]
    unknown = [p.name for p in params if p.name not in CACHE_KEYWORDS and _cache_like(p)]
    where = (
        f"{type(module).__name__}.forward (parameters after hidden_states: {names}; known cache keywords: "
        f"{list(CACHE_KEYWORDS)}, transformers{TRANSFORMERS_RANGE}; installed: {installed_transformers_version()})"
    )
    if unknown:
        raise CacheKeywordError(
            f"{where} takes the cache-like parameter(s) {unknown}, which primaldual.integrations.hf does not know; "
            "a converted layer would not see the cache"
        )
    if len(known) > 1:
        raise CacheKeywordError(f"{where} takes several cache keywords {known}; expected one")
    if known:
        return known[0]
    if causal:
        raise CacheKeywordError(
            f"{where} is causal but takes none of the known cache keywords; a converted layer would not see the "
            "cache that generation passes"
        )
    return None


# ------------------------------------------------------------------------------------------ caches
def self_attention_cache(cache: Any) -> Cache:
    """The self-attention part of a cache (an ``EncoderDecoderCache`` holds two caches)."""
    if isinstance(cache, EncoderDecoderCache):
        return cache.self_attention_cache
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be a transformers Cache (e.g. DynamicCache), got {type(cache).__name__}")
    return cache


def cache_entry(cache: Cache, layer_idx: int) -> Any:
    """``cache.layers[layer_idx]``, after creating the entries up to it in a lazily grown cache."""
    if cache.layer_class_to_replicate is not None:
        while len(cache.layers) <= layer_idx:
            cache.layers.append(cache.layer_class_to_replicate())
    if layer_idx >= len(cache.layers):
        raise ValueError(f"the cache has {len(cache.layers)} layers; a converted layer needs entry {layer_idx}")
    return cache.layers[layer_idx]


def set_cache_entry(cache: Cache, layer_idx: int, entry: Any) -> None:
    """Put ``entry`` in place of ``cache.layers[layer_idx]``."""
    cache.layers[layer_idx] = entry


def is_plain_dynamic_layer(entry: Any) -> bool:
    """Whether ``entry`` is a ``DynamicLayer`` itself (not a sliding-window, quantized, ... subclass)."""
    return type(entry) is DynamicLayer


def is_plain_sliding_layer(entry: Any) -> bool:
    """Whether ``entry`` is a ``DynamicSlidingWindowLayer`` itself (what a ``DynamicCache`` built from a model's
    config holds for its sliding-window layers: Mistral, Gemma 2 and 3, ...); its window is ``entry.sliding_window``."""
    return type(entry) is DynamicSlidingWindowLayer


# ------------------------------------------------------------------------------------------ output collector
_OUTPUT_COLLECTOR_FROM: tuple[int, int] = (5, 24)  # tested releases that collect attentions with hooks


def _load_output_capturing() -> ModuleType | None:
    """``transformers.utils.output_capturing``; None for older releases, which pass ``output_attentions`` down."""
    try:
        from transformers.utils import output_capturing
    except ImportError as err:
        if _release(installed_transformers_version())[:2] >= _OUTPUT_COLLECTOR_FROM:
            raise ImportError(
                f"transformers {installed_transformers_version()} has no transformers.utils.output_capturing, "
                f"which primaldual.integrations.hf reads (tested: transformers{TRANSFORMERS_RANGE})"
            ) from err
        return None
    return output_capturing


_OUTPUT_CAPTURING = _load_output_capturing()


def active_output_collector() -> dict | None:
    """transformers' active output collector (``{"attentions": [...], ...}`` while outputs are collected), or None.

    Raises:
        RuntimeError: the private collector is missing or cannot be read (transformers changed it).
        TypeError: it holds something other than None or a dict.
    """
    if _OUTPUT_CAPTURING is None:
        return None
    try:
        collected = _OUTPUT_CAPTURING._active_collector.get()
    except Exception as err:
        raise RuntimeError(
            f"cannot read transformers' output collector (transformers.utils.output_capturing._active_collector) "
            f"in transformers {installed_transformers_version()}: {err!r}; primaldual.integrations.hf is tested "
            f"with transformers{TRANSFORMERS_RANGE}"
        ) from err
    if collected is not None and not isinstance(collected, dict):
        raise TypeError(
            f"transformers' output collector holds a {type(collected).__name__}; expected None or a dict "
            f"(transformers {installed_transformers_version()}, tested: transformers{TRANSFORMERS_RANGE})"
        )
    return collected


# ------------------------------------------------------------------------------------------ attention interface
def is_plain_mask_function(mask_function: Any) -> bool:
    """Whether a mask function asks for nothing but causal or bidirectional attention (None counts as plain)."""
    return mask_function in (None, causal_mask_function, bidirectional_mask_function)


def register_attention_implementation(name: str, attention: Any, mask: Any) -> None:
    """Register ``attention`` (``AttentionInterface``) and ``mask`` (``AttentionMaskInterface``) under ``name``."""
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask)


def module_is_causal(module: nn.Module) -> bool:
    """The ``is_causal`` attribute transformers' attention modules carry (False when absent)."""
    return bool(getattr(module, "is_causal", False))


# ------------------------------------------------------------------------------------------ models and configs
def is_pretrained_model(model: Any) -> bool:
    return isinstance(model, PreTrainedModel)


def model_type_of(model: nn.Module) -> str | None:
    """``model.config.model_type``, or None without a config."""
    return getattr(getattr(model, "config", None), "model_type", None)


def config_value(model: nn.Module, key: str) -> Any:
    """An extra attribute of ``model.config`` (None when unset)."""
    return getattr(model.config, key, None)


def set_config_value(model: nn.Module, key: str, value: Any) -> None:
    """Set an extra attribute of ``model.config``; ``save_pretrained`` writes it to ``config.json``."""
    setattr(model.config, key, value)


def concrete_model_class(model_class: Any, path: Any, kwargs: dict[str, Any]) -> type:
    """``model_class``, or the class an ``AutoModel*`` class maps the saved config at ``path`` to."""
    if isinstance(model_class, type) and issubclass(model_class, PreTrainedModel):
        return model_class
    mapping = getattr(model_class, "_model_mapping", None)  # AutoModel* classes
    if mapping is None:
        raise TypeError(f"model_class must be a transformers model class, got {model_class!r}")
    config = kwargs.get("config") or AutoConfig.from_pretrained(path)
    return mapping[type(config)]


# ------------------------------------------------------------------------------------------ Trainer
def trainer_loss_is_normalised(trainer: Trainer, num_items_in_batch: Any) -> bool:
    """Whether the ``Trainer`` will *not* divide this step's loss by the accumulation steps (mirrors its rule)."""
    flag = getattr(trainer, "loss_is_scaled_for_ga", None)
    if flag is not None:
        return bool(flag)
    accepts = bool(getattr(trainer, "model_accepts_loss_kwargs", False))
    return (accepts and num_items_in_batch is not None) or getattr(trainer, "compute_loss_func", None) is not None


def trainer_accumulation_steps(trainer: Trainer) -> int:
    """The gradient-accumulation steps of the current step (1 outside training)."""
    return int(getattr(trainer, "current_gradient_accumulation_steps", 1))
