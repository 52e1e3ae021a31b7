"""Where converted causal layers keep their decoding state: in the model's own ``Cache`` object.

Hugging Face generation passes one ``Cache`` (a ``DynamicCache`` for GPT-2) through every forward of a
``generate()`` call, with one entry per layer, and reorders / selects / resets its entries for beam search,
contrastive search and batch selection. A converted layer therefore stores its state in its own entry
(``cache.layers[layer_idx]``), so the state lives exactly as long as the cache and follows every operation on it:

* a mechanism with an incremental path (``capabilities.decoding`` ``"constant"``, ``"window_cache"`` or
  ``"kv_cache"``: primal, linear, hybrid, sparse, softmax) replaces its (still empty) entry by a
  :class:`StateCacheLayer` that holds the layer's own decoding state (a primal layer's running sums, a hybrid's
  window cache and sums, a softmax layer's keys and values) and the number of tokens seen; new tokens go through the
  layer's ``step``. A new cache (a new ``generate()`` call, or a plain forward) starts a new state.
* the others (the SVR family, ``decoding == "recompute"``) keep the layer's **inputs** ``(B, 1, T, C)`` and their
  padding ``(B, 1, T, 1)`` as the keys and values of an ordinary ``DynamicLayer`` and recompute the causal output
  over them (exact; O(T^2) per token).

**Sliding-window layers** (Mistral, Gemma 2 and 3, ...): a ``DynamicCache`` built from such a model's config holds a
``DynamicSlidingWindowLayer`` for each, which keeps only the last ``window - 1`` keys, and transformers builds the
mask of every sliding layer to the sizes the first sliding entry reports. A converted sliding layer's entry
(:class:`SlidingStateCacheLayer`, :class:`SlidingInputsCacheLayer`) therefore keeps what the converted layer needs
(its state, or every input) but reports the sizes and ``is_sliding`` of the entry it replaced, so the masks of the
layers left unconverted stay right.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .compat import (
    Cache,
    DynamicLayer,
    cache_entry,
    is_plain_dynamic_layer,
    is_plain_sliding_layer,
    self_attention_cache,
    set_cache_entry,
)

__all__ = [
    "PrimalCacheLayer",
    "SlidingInputsCacheLayer",
    "SlidingStateCacheLayer",
    "StateCacheLayer",
    "inputs_cache_layer",
    "primal_cache_layer",
    "self_attention_cache",
    "state_cache_layer",
]


def _map_state(state: Any, fn: Any) -> Any:
    """``state`` (a NamedTuple of tensors, nested NamedTuples and counters) with ``fn`` applied to every tensor (all
    of them batch-major); counters are kept."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(_map_state(v, fn) for v in state))
    return state


def _first_tensor(state: Any) -> Tensor | None:
    if isinstance(state, Tensor):
        return state
    if isinstance(state, tuple):
        for v in state:
            if (t := _first_tensor(v)) is not None:
                return t
    return None


class StateCacheLayer(DynamicLayer):
    """A cache entry holding a converted causal layer's own decoding state instead of Hugging Face keys and values.

    It reports the number of tokens seen as its sequence length (so position ids and masks built from the cache
    are right even when every layer is primal), and implements the per-entry operations generation uses:
    ``reorder_cache`` (beam search), ``batch_repeat_interleave`` / ``batch_select_indices``, ``reset``,
    ``offload`` / ``prefetch``. ``crop`` (assisted generation, rolling back tokens) cannot undo a running sum and
    raises.

    Attributes:
        state: the layer's state after the tokens seen (its ``step``'s), or None before the first forward.
        seen: number of tokens (real and padding) fed through this cache entry.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state: Any = None
        self.seen = 0

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        raise RuntimeError(
            "this cache entry belongs to a converted primaldual layer and holds its decoding state, not keys and values"
        )

    def store(self, state: Any, new_tokens: int) -> None:
        """Record the state after ``new_tokens`` more tokens."""
        self.state = state
        self.seen += int(new_tokens)
        self.is_initialized = True
        first = _first_tensor(state)
        if first is not None:
            self.device = first.device

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.state = None
        self.seen = 0
        self.is_initialized = False

    def _map(self, fn: Any) -> None:
        if self.state is not None:
            self.state = _map_state(self.state, fn)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: Tensor) -> None:
        self._map(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError(
                "a converted layer's decoding state (running sums, a pruned window) cannot be cropped (assisted "
                "generation / rolling back tokens is not supported with converted layers)"
            )

    def offload(self) -> None:
        self._map(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        first = _first_tensor(self.state)
        if first is not None and first.device != self.device:
            device = self.device
            self._map(lambda t: t.to(device, non_blocking=True))


#: the earlier name (it held primal states only)
PrimalCacheLayer = StateCacheLayer


class _SlidingSizes:
    """The mask sizes and ``is_sliding`` of transformers' ``DynamicSlidingWindowLayer`` after the same tokens, for an
    entry that replaces one (see the module docstring)."""

    is_sliding = True
    sliding_window: int

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: the last ``window - 1`` tokens seen and the new ones."""
        seen, window = self.get_seq_length(), self.sliding_window
        return min(seen, window - 1) + query_length, max(seen - window + 1, 0)


class SlidingStateCacheLayer(_SlidingSizes, StateCacheLayer):
    """A :class:`StateCacheLayer` in place of a sliding-window entry (its ``sliding_window`` keys, its own included)."""

    def __init__(self, sliding_window: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sliding_window = int(sliding_window)


class SlidingInputsCacheLayer(_SlidingSizes, DynamicLayer):
    """A plain ``DynamicLayer`` (it keeps every input of a recomputing layer) in place of a sliding-window entry."""

    def __init__(self, sliding_window: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sliding_window = int(sliding_window)


def _fresh_entry(cache: Cache, layer_idx: int) -> tuple[Any, int | None]:
    """The still empty entry ``layer_idx`` and its sliding window (None for a plain ``DynamicLayer``); another kind
    of entry, or one that already holds keys and values, is an error."""
    entry = cache_entry(cache, layer_idx)
    plain, sliding = is_plain_dynamic_layer(entry), is_plain_sliding_layer(entry)
    if not (plain or sliding) or entry.get_seq_length() > 0:
        raise TypeError(
            f"cache entry {layer_idx} is a {type(entry).__name__}"
            + (" that already holds keys and values" if plain or sliding else "")
            + "; a converted layer needs a fresh DynamicCache (static, quantized and offloaded caches are not "
            "supported)"
        )
    return entry, entry.sliding_window if sliding else None


def state_cache_layer(cache: Cache, layer_idx: int) -> StateCacheLayer:
    """The :class:`StateCacheLayer` at ``layer_idx``, installed in place of a still empty ``DynamicLayer`` (a
    :class:`SlidingStateCacheLayer` in place of an empty ``DynamicSlidingWindowLayer``)."""
    entry = cache_entry(cache, layer_idx)
    if isinstance(entry, StateCacheLayer):
        return entry
    _, window = _fresh_entry(cache, layer_idx)
    entry = StateCacheLayer() if window is None else SlidingStateCacheLayer(window)
    set_cache_entry(cache, layer_idx, entry)
    return entry


def inputs_cache_layer(cache: Cache, layer_idx: int) -> DynamicLayer:
    """The ``DynamicLayer`` at ``layer_idx`` that keeps a recomputing layer's every input: the entry itself, or a
    :class:`SlidingInputsCacheLayer` installed in place of an empty ``DynamicSlidingWindowLayer`` (which would keep
    only the last ``window - 1``)."""
    entry = cache_entry(cache, layer_idx)
    if isinstance(entry, SlidingInputsCacheLayer) or (is_plain_dynamic_layer(entry) and entry.get_seq_length()):
        return entry
    entry, window = _fresh_entry(cache, layer_idx)
    if window is not None:
        entry = SlidingInputsCacheLayer(window)
        set_cache_entry(cache, layer_idx, entry)
    return entry


primal_cache_layer = state_cache_layer
