"""What a registered attention supports: the metadata the registry lists and the registry-wide tests enforce."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Capabilities"]


@dataclass(frozen=True)
class Capabilities:
    """What a mechanism supports. Every flag is checked for every mechanism by ``tests/attention``.

    Every mechanism honours the ``(B, N)`` padding mask (True = real token) and is self-attention (keys and
    values have the queries' length); those are requirements of the layer API, not capabilities.

    Attributes:
        causal: can run with ``causal=True`` (no position sees a later one); ``False``: refused with an error.
        non_causal: can run with ``causal=False``; ``False``: refused with an error.
        weights: ``need_weights=True`` returns a ``(B, H, N, N)`` matrix; ``False``: refused with an error.
        aux_loss: contributes an auxiliary loss (see :mod:`primaldual.aux_loss`) in training forwards.
        time: asymptotic time per layer call (N tokens, D width), for the registry table.
        memory: asymptotic activation memory, for the registry table.
        weights_meaning: what the returned weights are, for mechanisms without a softmax matrix.
        stochastic_weights: the returned weights are a distribution over each query's real keys (non-negative,
            summing to 1; zero for a query with no key to see, as a causal pooled head's first tokens), as attention
            weights are where a model reads them (``nn.MultiheadAttention``'s);
            ``False``: another matrix (``weights_meaning`` says which), which stand-ins for such modules do not return.
        decoding: how a causal layer decodes one token at a time (:meth:`AttentionLayer.step`):
            ``"kv_cache"`` (keys and values of the prefix, O(T) memory), ``"window_cache"`` (the last keys of a
            local window, O(window) when the pattern has no stride), ``"constant"`` (a state whose size does
            not grow with the context), ``"recompute"`` (no incremental path: the layer's input prefix is
            kept and the causal forward rerun on it, exact but O(T^2) per token), or ``"none"`` (not causal).
        rope: ``forward``, ``prefill`` and ``step`` take ``rope=(cos, sin)``, rotary position embeddings applied
            to the (softmax) queries and keys (:mod:`primaldual.functional.rotary`); ``False``: refused with an
            error (the primal layer's causal prefix means have no use for a per-position rotation).
    """

    causal: bool = True
    non_causal: bool = True
    weights: bool = True
    aux_loss: bool = False
    time: str = "O(N^2 D)"
    memory: str = "O(N^2)"
    weights_meaning: str = "row-stochastic attention matrix"
    stochastic_weights: bool = True
    decoding: str = "recompute"
    rope: bool = False
