"""A primaldual language model as a Hugging Face model: ``AutoModelForCausalLM.from_pretrained``, ``generate``,
``pipeline``, ``save_pretrained``.

:class:`PrimalDualLMConfig` (``model_type: primaldual_lm``) and :class:`PrimalDualForCausalLM` wrap
:class:`~primaldual.models.CausalLM` (its weights under ``model.``), registered with transformers' Auto classes when
this package is imported (and by ``import primaldual`` once transformers is imported, see
:func:`register_auto_classes`), as fla does for its models. Decoding in ``generate`` goes through the model's own
incremental path: the first forward is :meth:`CausalLM.prefill`, each later one :meth:`CausalLM.step`, with the
decoding state in a :class:`PrimalDualLMCache` (constant-size for primal and linear layers, a KV cache for softmax).

:func:`save_hf` writes such a directory from a model: the weights, ``config.json`` and, given a ``tokenizers`` file,
the tokenizer as a ``PreTrainedTokenizerFast`` (``primaldual export RUN --format hf`` calls it on a trained run,
:func:`primaldual.tasks.lm.export.export_run`). Written by hand: the
wrapper is the contract between our model and transformers' generation loop, which no library provides.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ...models.lm import CausalLM, LMState, sinusoidal_table
from .compat import CACHE_KEYWORDS

__all__ = [
    "EXPORT_MARK",
    "MODEL_TYPE",
    "PrimalDualForCausalLM",
    "PrimalDualLMCache",
    "PrimalDualLMConfig",
    "save_hf",
    "register_auto_classes",
]

MODEL_TYPE = "primaldual_lm"
EXPORT_MARK = ".primaldual-export"  # what save_hf writes into its directory: only such a directory is replaced

# the output field generation reads the cache from: ``cache`` (transformers >= 5.24) or ``past_key_values``
_OUTPUT_CACHE = next(k for k in CACHE_KEYWORDS if k in CausalLMOutputWithPast.__dataclass_fields__)
# generate's own arguments that carry nothing for this model (its positions follow attention_mask)
_GENERATION_ONLY = frozenset({"cache_position", "position_ids", "output_attentions", "output_hidden_states"})


class PrimalDualLMConfig(PretrainedConfig):
    """The arguments of :class:`~primaldual.models.CausalLM`, with the usual transformers aliases
    (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``,
    ``max_position_embeddings``)."""

    model_type = MODEL_TYPE
    attribute_map = {
        "hidden_size": "dim",
        "num_hidden_layers": "depth",
        "num_attention_heads": "num_heads",
        "intermediate_size": "ffn_dim",
        "max_position_embeddings": "max_len",
    }

    def __init__(
        self,
        vocab_size: int = 50257,
        max_len: int = 1024,
        dim: int = 512,
        depth: int = 6,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        dropout: float = 0.0,
        attention: str | list[str] = "softmax",
        attention_options: dict[str, Any] | list[dict[str, Any] | None] | None = None,
        positions: str = "learned",
        tie_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        self.vocab_size, self.max_len, self.dim, self.depth = vocab_size, max_len, dim, depth
        self.num_heads, self.ffn_dim, self.dropout = num_heads, ffn_dim, dropout
        self.attention, self.attention_options = attention, attention_options
        self.positions, self.tie_embeddings = positions, tie_embeddings
        kwargs.setdefault("tie_word_embeddings", False)  # the tie is inside CausalLM (one weight, no lm_head)
        super().__init__(**kwargs)

    def model_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~primaldual.models.CausalLM`."""
        return {
            "dim": self.dim,
            "depth": self.depth,
            "num_heads": self.num_heads,
            "ffn_dim": self.ffn_dim,
            "dropout": self.dropout,
            "attention": self.attention,
            "attention_options": self.attention_options,
            "positions": self.positions,
            "tie_embeddings": self.tie_embeddings,
        }


def _map_batch(tree: Any, fn: Any) -> Any:
    """``fn`` applied to every tensor of a decoding state (tuples, named tuples, lists, dicts of tensors), whose
    first dimension is the batch; other leaves unchanged."""
    if isinstance(tree, Tensor):
        return fn(tree) if tree.dim() else tree
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_map_batch(t, fn) for t in tree))
    if isinstance(tree, list | tuple):
        return type(tree)(_map_batch(t, fn) for t in tree)
    if isinstance(tree, dict):
        return {k: _map_batch(v, fn) for k, v in tree.items()}
    return tree


class PrimalDualLMCache:
    """The decoding state of a :class:`PrimalDualForCausalLM` between the forwards of one ``generate`` call.

    Attributes:
        state: :class:`~primaldual.models.lm.LMState` after the tokens seen (None before the first forward).
        seen: tokens (real and padding) fed so far, what ``get_seq_length`` reports.

    The batch operations of beam search and batch selection act on every tensor of the state; ``crop`` (assisted
    generation) cannot undo a running sum and raises.
    """

    is_compileable = False

    def __init__(self) -> None:
        self.state: LMState | None = None
        self.seen = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def reset(self) -> None:
        self.state, self.seen = None, 0

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self.state = _map_batch(self.state, lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.state = _map_batch(self.state, lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: Tensor) -> None:
        self.state = _map_batch(self.state, lambda t: t[indices])

    def crop(self, max_length: int) -> None:
        if max_length < 0 or max_length < self.seen:
            raise NotImplementedError(
                "a primaldual LM's decoding state cannot be rolled back (assisted generation is not supported)"
            )


class PrimalDualForCausalLM(PreTrainedModel, GenerationMixin):
    """:class:`~primaldual.models.CausalLM` as a transformers causal LM (weights under ``model.``).

    ``forward(input_ids, attention_mask=None, labels=None, use_cache=None, cache=None)``: logits ``(B, N, V)``;
    with ``labels`` the next-token cross-entropy (``-100`` ignored, as transformers does). With ``use_cache`` the
    output carries a :class:`PrimalDualLMCache`; given one back, ``input_ids`` are the tokens after it and are
    decoded one step at a time from its state. Positions count the real tokens of ``attention_mask``, so left-padded
    prompts decode as they would alone.
    """

    config_class = PrimalDualLMConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules: list[str] = []

    def __init__(self, config: PrimalDualLMConfig) -> None:
        super().__init__(config)
        self.model = CausalLM(config.vocab_size, config.max_len, **config.model_kwargs())
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the decoding state is ours: the model creates it (generation's route for such models)

    def _init_weights(self, module: torch.nn.Module) -> None:
        # CausalLM initialises itself; what loading must rebuild is the one computed, unsaved buffer
        if isinstance(module, CausalLM) and module.positions == "sinusoidal":
            module.pos = sinusoidal_table(module.max_len, module.dim).to(module.embed.weight.device)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.embed = value

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        cache = next((kwargs.pop(k) for k in CACHE_KEYWORDS if kwargs.get(k) is not None), None)
        for k in CACHE_KEYWORDS:
            kwargs.pop(k, None)
        if unknown := sorted(set(kwargs) - _GENERATION_ONLY):
            raise TypeError(f"PrimalDualForCausalLM.forward: unexpected arguments {unknown}")
        if kwargs.get("output_attentions") or kwargs.get("output_hidden_states"):
            raise ValueError("output_attentions / output_hidden_states: not provided by primaldual models")
        if return_dict is False:
            raise ValueError("return_dict=False: primaldual models return a CausalLMOutputWithPast")
        if cache is not None and not isinstance(cache, PrimalDualLMCache):
            raise TypeError(f"cache: expected a PrimalDualLMCache (or None), got {type(cache).__name__}")
        mask = None if attention_mask is None else attention_mask.bool()
        N = input_ids.shape[1]
        if cache is not None and cache.state is not None:
            steps = []
            state = cache.state
            for t in range(N):  # tokens after the cached ones, one step each
                real = None if mask is None else mask[:, mask.shape[1] - N + t]
                logits_t, state = self.model.step(input_ids[:, t], state, real)
                steps.append(logits_t)
            logits = torch.stack(steps, 1)  # (B, N, V)
            cache.state, cache.seen = state, cache.seen + N
        elif use_cache or cache is not None:
            if mask is not None and mask.shape != input_ids.shape:
                raise ValueError(
                    f"attention_mask: expected shape {tuple(input_ids.shape)} on the first forward, got "
                    f"{tuple(mask.shape)}"
                )
            logits, state = self.model.prefill(input_ids, mask)
            cache = cache if cache is not None else PrimalDualLMCache()
            cache.state, cache.seen = state, N
        else:
            logits = self.model(input_ids, mask)
        loss = None
        if labels is not None:
            shift = labels[:, 1:]
            if mask is not None and mask.shape == labels.shape:
                shift = shift.masked_fill(~mask[:, 1:], -100)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), shift.flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_OUTPUT_CACHE: cache})

    def prepare_inputs_for_generation(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, use_cache: bool = True, **kwargs: Any
    ) -> dict[str, Any]:
        """The tokens after the cached ones (all of them on the first call), the full attention mask, the cache."""
        cache = next((kwargs[k] for k in CACHE_KEYWORDS if kwargs.get(k) is not None), None)
        seen = cache.seen if isinstance(cache, PrimalDualLMCache) else 0
        return {
            "input_ids": input_ids[:, seen:],
            "attention_mask": attention_mask,
            "use_cache": use_cache,
            _OUTPUT_CACHE: cache,
        }


def register_auto_classes() -> None:
    """Register :class:`PrimalDualLMConfig` / :class:`PrimalDualForCausalLM` with ``AutoConfig`` and
    ``AutoModelForCausalLM`` (``model_type: primaldual_lm``); idempotent."""
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(MODEL_TYPE, PrimalDualLMConfig, exist_ok=True)
    AutoModelForCausalLM.register(PrimalDualLMConfig, PrimalDualForCausalLM, exist_ok=True)


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out: {out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / EXPORT_MARK).is_file():
            raise FileExistsError(
                f"--out: {out} holds files primaldual did not write (no {EXPORT_MARK}); nothing in it was touched. "
                "Pass a new or empty directory"
            )
        if not force:
            raise FileExistsError(f"--out: {out} holds an earlier export; pass --force to replace it")


def save_hf(
    lm: CausalLM,
    out: str | os.PathLike,
    model_kwargs: dict[str, Any],
    *,
    tokenizer_file: str | os.PathLike | None = None,
    record: dict[str, Any] | None = None,
    force: bool = False,
) -> Path:
    """Write ``lm`` as a transformers model directory at ``out``.

    The directory loads with ``AutoModelForCausalLM.from_pretrained(out)`` after ``import primaldual`` (with
    transformers imported) or ``import primaldual.integrations.hf``; with ``tokenizer_file`` (a ``tokenizers`` JSON),
    its tokenizer loads with ``AutoTokenizer.from_pretrained(out)``. It is built in a temporary sibling and renamed
    into place; an existing ``out`` is replaced only when an earlier export wrote it (and ``force``).

    Args:
        lm: the model. model_kwargs: its constructor's keywords besides ``vocab_size`` / ``max_len`` (sizes, the
            attention plan, ``positions``, ``tie_embeddings``), which ``config.json`` records.
        record: what the export mark file records (e.g. the run and checkpoint it came from).

    Raises:
        FileExistsError: ``out`` holds files of someone else's, or an earlier export without ``force``.
    """
    from ...utils.io import atomic_dir

    out = Path(out)
    _check_out_dir(out, force)
    config = PrimalDualLMConfig(vocab_size=lm.vocab_size, max_len=lm.max_len, **model_kwargs)
    model = PrimalDualForCausalLM(config)
    model.model.load_state_dict(lm.state_dict())
    model.eval()
    with atomic_dir(out, overwrite=True, mark=EXPORT_MARK) as tmp:
        model.save_pretrained(tmp)
        if tokenizer_file is not None:
            from transformers import PreTrainedTokenizerFast

            PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file)).save_pretrained(tmp)
        (tmp / EXPORT_MARK).write_text(json.dumps({**(record or {}), "time": time.time()}) + "\n")
    return out
