"""The module :func:`~primaldual.integrations.hf.convert` puts in place of a Hugging Face self-attention.

:class:`HFSelfAttention` wraps a primaldual layer (``(B, N, C) -> (B, N, C)``, query / key / value / output weights
copied from the original) and accepts the forward signature of the module it replaced: its positional parameter
names are recorded at conversion, so ``GPT2Attention(hidden_states, cache, attention_mask, ...)``,
``BertAttention(hidden_states, attention_mask, encoder_hidden_states, ...)`` and ``ViTAttention(hidden_states,
attention_mask)`` calls all bind the same way. The keyword that carries the cache (``cache`` from transformers 5.24,
``past_key_values`` before, ``layer_past`` for GPT-NeoX) is resolved from that signature at conversion too
(:func:`~primaldual.integrations.hf.compat.resolve_cache_keyword`) and is the only one read; another known cache
keyword in a call is an error, never ignored. It returns ``(hidden_states, attention_weights or None)``, as those
modules do in transformers 5.

* **Masks**: the model's mask, in whatever form its attention implementation produces, is converted by
  :func:`~primaldual.integrations.hf.masks.key_mask_from_hf` (True = real token) and checked to hold nothing but
  padding and causality (and, for a sliding-window layer, its window: Mistral, Gemma 2 and 3, ...).
* **Cache** (causal layers): see :mod:`primaldual.integrations.hf.cache`. A layer with an incremental path
  (primal, linear, hybrid, sparse, softmax) decodes with its ``step`` from the state in its cache entry; the SVR
  family recomputes over the cached layer inputs.
* **Post-norm models** (BERT, RoBERTa): the replaced module included the residual ``LayerNorm`` of its output
  block; it is kept as ``norm`` and applied as ``norm(attention(x) + x)``.
* **Attention weights** (``output_attentions``): returned for full forwards; None for cached decoding steps of a
  primal layer (its state keeps no keys).
* **Rotary embeddings** (Llama): the replaced module received ``position_embeddings = (cos, sin)`` from its decoder
  layer. A mechanism with ``capabilities.rope`` gets them (softmax, sparse; hybrid's window branch); the others
  (primal) do without: :func:`~primaldual.integrations.hf.convert` warns so when it converts. Decoding hands each
  new token's tables to ``step``; the keys kept in a state are stored rotated.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...attention.base import AttentionLayer
from ...attention.primal import PrimalAttention, PrimalState
from .cache import inputs_cache_layer, state_cache_layer
from .compat import CACHE_KEYWORDS, self_attention_cache
from .masks import attentions_requested, key_mask_from_hf, record_attentions

__all__ = ["HFSelfAttention", "primal_prefill_state"]


def primal_prefill_state(layer: PrimalAttention, x: Tensor, mask: Tensor | None) -> PrimalState:
    """The decoding state after the tokens ``x`` ``(B, N, C)`` (:meth:`PrimalAttention.prefill_state`)."""
    return layer.prefill_state(x, mask)


class HFSelfAttention(nn.Module):
    """A primaldual attention in the place, and with the call signature, of a Hugging Face self-attention module.

    Args:
        layer: the primaldual attention (weights already copied).
        arg_names: the replaced module's forward parameters after ``hidden_states``, in order (how positional
            arguments are bound).
        cache_keyword: the replaced forward's cache parameter (``"cache"``, ``"past_key_values"``), or None when it
            takes no cache (bidirectional modules only).
        layer_idx: the layer's index in the model's cache (causal models).
        norm: the residual ``LayerNorm`` of a post-norm output block (BERT), or None.
        source: the replaced module's class name (for ``repr`` and errors).
        rope: the replaced module applied the rotary tables it is called with (``position_embeddings``).
        decodes: a causal module that generation calls with a cache (False: a causal encoder such as CLIP's text
            tower, which is never cached, so it has no cache keyword).
        window: the replaced module's sliding window (the keys a query saw, its own included; Mistral, Gemma 2 and
            3), or None: the masks the model builds for it carry that window, which is checked and read for its
            padding. What the converted layer sees is its own mechanism's (a primal layer: the whole prefix).
    """

    def __init__(
        self,
        layer: AttentionLayer,
        *,
        arg_names: tuple[str, ...],
        cache_keyword: str | None,
        layer_idx: int | None,
        norm: nn.Module | None = None,
        source: str = "",
        rope: bool = False,
        decodes: bool = True,
        window: int | None = None,
    ) -> None:
        super().__init__()
        self.attn = layer
        self.norm = norm
        self.arg_names = tuple(arg_names)
        if cache_keyword is None and layer.causal and decodes:
            raise ValueError("cache_keyword: a causal layer needs the keyword its cache arrives under, got None")
        if cache_keyword is not None and cache_keyword not in CACHE_KEYWORDS:
            raise ValueError(f"cache_keyword must be one of {list(CACHE_KEYWORDS)} or None, got {cache_keyword!r}")
        self.cache_keyword = cache_keyword
        self.layer_idx = layer_idx
        self.source = source
        self.is_causal = bool(layer.causal)
        self.rope = bool(rope)
        self.uses_rope = self.rope and type(layer).capabilities.rope
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be None or a positive int, got {window!r}")
        if window is not None and not layer.causal:
            raise ValueError("window: a sliding window belongs to a causal layer; this layer is bidirectional")
        self.window = window

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > len(self.arg_names):
            raise TypeError(
                f"{self.source or 'attention'} takes at most {len(self.arg_names) + 1} positional arguments"
            )
        bound = dict(zip(self.arg_names, args))
        for key in bound:
            if key in kwargs:
                raise TypeError(f"{self.source or 'attention'} got multiple values for argument {key!r}")
        bound.update(kwargs)
        return bound

    def forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        """Args as the replaced module's forward; ``hidden_states`` ``(B, N, C)``.

        Returns:
            ``(out (B, N, C), weights (B, H, N, N) or None)``.
        """
        bound = self._bind(args, kwargs)
        if bound.get("encoder_hidden_states") is not None:
            raise ValueError(
                f"{self.source or 'this module'} was converted as self-attention; cross-attention "
                "(encoder_hidden_states) is not supported"
            )
        mask = bound.get("attention_mask")
        cache = self._cache(bound)
        need_weights = attentions_requested(bound) and type(self.attn).capabilities.weights
        x = hidden_states
        B, N, _ = x.shape
        rope = self._rope(bound, B, N)
        if cache is not None and self.is_causal:
            out, weights = self._cached(x, mask, self_attention_cache(cache), need_weights, rope)
        else:
            if cache is not None and self_attention_cache(cache).get_seq_length(self.layer_idx or 0) > 0:
                raise ValueError("a bidirectional converted layer cannot continue from a filled cache")
            key_mask = key_mask_from_hf(mask, batch=B, q_len=N, kv_len=N, causal=self.is_causal, window=self.window)
            out, weights = self._run(x, key_mask, need_weights, rope)
        if self.norm is not None:
            out = self.norm(out + hidden_states)
        record_attentions(weights)
        return out, weights

    def _cache(self, bound: dict[str, Any]) -> Any:
        """The cache passed under the resolved keyword; a cache under another known keyword is an error."""
        stray = [k for k in CACHE_KEYWORDS if k != self.cache_keyword and bound.get(k) is not None]
        if stray:
            raise TypeError(
                f"{self.source or 'this module'} was converted with cache keyword {self.cache_keyword!r} (from its "
                f"forward signature), but got a cache as {stray}"
            )
        return None if self.cache_keyword is None else bound.get(self.cache_keyword)

    def _rope(self, bound: dict[str, Any], batch: int, n: int) -> tuple[Tensor, Tensor] | None:
        """The rotary tables of this call, ``(cos, sin)`` each ``(B, N, D)``, for a layer that uses them."""
        if not self.rope:
            return None
        tables = bound.get("position_embeddings")
        if tables is None:
            raise ValueError(
                f"{self.source or 'this module'} applies rotary embeddings: it must be called with "
                "position_embeddings=(cos, sin), as its decoder layer does"
            )
        if not self.uses_rope:
            return None
        cos, sin = tables
        return cos.expand(batch, n, -1), sin.expand(batch, n, -1)  # (B, N, D) each

    def _run(
        self, x: Tensor, key_mask: Tensor | None, need_weights: bool, rope: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor | None]:
        kw = {} if rope is None else {"rope": rope}
        if need_weights:
            return self.attn(x, key_mask, need_weights=True, **kw)
        return self.attn(x, key_mask, **kw), None

    def _cached(
        self, x: Tensor, mask: Any, cache: Any, need_weights: bool, rope: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Causal forward that continues the sequence held in ``cache`` and extends it by ``x`` ``(B, N, C)``."""
        if self.layer_idx is None:
            raise ValueError("a converted causal layer needs its layer_idx to use a cache")
        B, N, _ = x.shape
        if type(self.attn).capabilities.decoding != "recompute":
            return self._stepped(x, mask, cache, need_weights, rope)
        # the SVR family (no rotary embeddings, no incremental path): every input so far and its padding (the mask
        # of a sliding layer reaches back only as far as its window), the output recomputed
        entry = inputs_cache_layer(cache, self.layer_idx)
        T = entry.get_seq_length() + N
        new_mask = self._new_keys(mask, B, N, T)  # (B, N) or None
        real = x.new_ones(B, 1, N, 1) if new_mask is None else new_mask[:, None, :, None].to(x.dtype)  # (B, 1, N, 1)
        xs, reals = cache.update(x[:, None], real, self.layer_idx)  # (B, 1, T, C), (B, 1, T, 1): all so far
        x_all, key_mask = xs[:, 0], reals[:, 0, :, 0] != 0  # (B, T, C), (B, T)
        out, weights = self._run(x_all, None if bool(key_mask.all()) else key_mask, need_weights)
        return out[:, T - N :], None if weights is None else weights[:, :, T - N :]

    def _new_keys(self, mask: Any, batch: int, n: int, total: int) -> Tensor | None:
        """This call's ``n`` tokens' key mask ``(B, N)`` (None: all real) from the model's mask, after ``total - n``
        cached ones; checked against padding, causality and the layer's window."""
        key_mask = key_mask_from_hf(mask, batch=batch, q_len=n, kv_len=total, causal=True, window=self.window)
        return None if key_mask is None else key_mask[:, -n:]

    def _stepped(
        self, x: Tensor, mask: Any, cache: Any, need_weights: bool, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor | None]:
        """Cached forward through the layer's own decoding state (:class:`~.cache.StateCacheLayer`): the prompt by
        the full causal forward and ``prefill``, each later token by ``step``."""
        B, N, _ = x.shape
        entry = state_cache_layer(cache, self.layer_idx)
        new_mask = self._new_keys(mask, B, N, entry.seen + N)  # (B, N) or None
        kw = {} if rope is None else {"rope": rope}
        if entry.state is None:  # the prompt
            if isinstance(self.attn, PrimalAttention):  # the full forward records the KSVD term when training
                out, weights = self._run(x, new_mask, need_weights)
                entry.store(primal_prefill_state(self.attn, x, new_mask), N)
                return out, weights
            out, state = self.attn.prefill(x, new_mask, **kw)
            weights = self._run(x, new_mask, True, rope)[1] if need_weights else None
            entry.store(state, N)
            return out, weights
        state, ys = entry.state, []
        for t in range(N):  # one token at a time, from the state
            kw_t = {} if rope is None else {"rope": (rope[0][:, t], rope[1][:, t])}
            y_t, state = self.attn.step(x[:, t], state, None if new_mask is None else new_mask[:, t], **kw_t)
            ys.append(y_t)
        entry.store(state, N)
        return torch.stack(ys, 1), None  # (B, N, C)

    def extra_repr(self) -> str:
        window = "" if self.window is None else f", window={self.window}"
        return f"source={self.source!r}, layer_idx={self.layer_idx}, cache_keyword={self.cache_keyword!r}{window}"
