"""Hugging Face ``transformers`` integration (the ``hf`` extra: ``pip install "primaldual[hf]"``).

Two ways in, as transformers separates "what a layer computes" from "how attention is executed":

* :func:`convert` (a **module swap**): the self-attention of chosen layers of a GPT-2, BERT, RoBERTa, ViT or
  Decision Transformer model becomes a primaldual layer with the original weights copied. Needed for mechanisms
  with parameters of their own (Primal-Attention); works for every registered mechanism. ``generate()`` works on
  converted causal models (the primal layer keeps its constant-size state in the model's cache), the KSVD term is
  returned by ``collect_aux_loss(model)``, :class:`PrimalDualTrainer` adds it to the ``Trainer``'s loss, and
  :func:`from_pretrained` reloads a converted model saved with ``save_pretrained``.
* :func:`register_hf_attentions` (an **attention function**): the parameter-free mechanisms (softmax_bn,
  softmax_sh, softmax_bn_sh, linear, linear_bn, sparse) as ``model.set_attn_implementation("primaldual_<name>")``.

Tested with the transformers releases in :data:`TRANSFORMERS_RANGE` (the ``hf`` extra's range): an older one fails
at import with an ``ImportError``, a newer one gives an :class:`UntestedTransformersWarning`. Every contact with
transformers internals is in :mod:`primaldual.integrations.hf.compat`.

``import primaldual`` never imports transformers itself; import this module explicitly (``import primaldual`` imports
it once transformers is imported, so that exported models load with the Auto classes, see
:mod:`primaldual.integrations.hf.export`). See ``docs/integrations.md``.
"""

from __future__ import annotations

from .architectures import SUPPORTED_MODEL_TYPES
from .cache import PrimalCacheLayer, SlidingInputsCacheLayer, SlidingStateCacheLayer, StateCacheLayer
from .compat import (
    CACHE_KEYWORDS,
    TRANSFORMERS_RANGE,
    CacheKeywordError,
    UntestedTransformersWarning,
    resolve_cache_keyword,
)
from .convert import CONVERSIONS_KEY, convert, converted_layers, from_pretrained
from .export import PrimalDualForCausalLM, PrimalDualLMCache, PrimalDualLMConfig, register_auto_classes, save_hf
from .kernels import HF_KERNELS, register_hf_attentions
from .masks import key_mask_from_hf
from .modules import HFSelfAttention, primal_prefill_state
from .trainer import PrimalDualTrainer, add_aux_loss

register_auto_classes()  # AutoModelForCausalLM.from_pretrained of a `primaldual export` directory

__all__ = [
    "CACHE_KEYWORDS",
    "CONVERSIONS_KEY",
    "HF_KERNELS",
    "SUPPORTED_MODEL_TYPES",
    "TRANSFORMERS_RANGE",
    "CacheKeywordError",
    "HFSelfAttention",
    "PrimalCacheLayer",
    "SlidingInputsCacheLayer",
    "SlidingStateCacheLayer",
    "StateCacheLayer",
    "PrimalDualForCausalLM",
    "PrimalDualLMCache",
    "PrimalDualLMConfig",
    "PrimalDualTrainer",
    "UntestedTransformersWarning",
    "add_aux_loss",
    "convert",
    "converted_layers",
    "from_pretrained",
    "key_mask_from_hf",
    "primal_prefill_state",
    "register_auto_classes",
    "save_hf",
    "register_hf_attentions",
    "resolve_cache_keyword",
]
