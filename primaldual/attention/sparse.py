"""Multi-head sparse attention layer: sliding window plus optional strided and global tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.softmax import softmax_attention
from ..functional.sparse import check_pattern, sparse_attention
from ..options import check_int, check_number
from .base import KVCache, QKVAttention, RopeTables
from .capabilities import Capabilities
from .registry import register_attention

__all__ = ["SparseAttention"]


@register_attention(
    "sparse",
    Capabilities(
        time="O(N (w + g + N/s) D)",
        memory="O(N (w + g + N/s))",
        weights_meaning="softmax weights on the sparse pattern (dense matrix, zeros off-pattern)",
        decoding="window_cache",
        rope=True,
    ),
)
class SparseAttention(QKVAttention):
    """Softmax attention restricted to a sparse pattern (local window w, stride s, g global tokens).

    Args:
        window: local radius, keys with ``|i - j| <= window`` (default 32).
        stride: also attend keys with ``(i - j) % stride == 0``; 0 disables (default).
        num_global: the first ``num_global`` real tokens of each sequence attend to and are attended by all
            (default 0). With a mask, the window and the stride count real tokens too, so the output at a real
            token does not depend on the padding around it.
        scale: logit scale (default ``1 / sqrt(head_dim)``).
        softcap: None, or a cap ``c > 0`` on the scaled logits, ``s -> c * tanh(s / c)`` (Gemma 2's sliding-window
            layers).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        window: int = 32,
        stride: int = 0,
        num_global: int = 0,
        scale: float | None = None,
        softcap: float | None = None,
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        for name, v in (("window", window), ("stride", stride), ("num_global", num_global)):
            check_int(name, v, low=0)
        check_pattern(window, stride, num_global)
        self.window, self.stride, self.num_global = window, stride, num_global
        self.scale = check_number("scale", scale, allow_none=True)
        self.softcap = check_number("softcap", softcap, low=0, low_open=True, allow_none=True)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", softcap={self.softcap}" if self.softcap is not None else "")

    def init_state(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> KVCache:
        """An empty cache for ``batch`` sequences (causal layers only). Without a stride it keeps only what later
        queries can see, each sequence's global tokens and its last ``window`` real tokens (constant size for
        sequences decoded side by side); with a stride it keeps every key."""
        return self._empty_cache(batch, device, dtype)

    def _prefill(self, x: Tensor, mask: Tensor | None, rope: RopeTables | None = None) -> tuple[Tensor, KVCache]:
        """The forward and the window cache of the prompt (see :meth:`AttentionLayer.prefill`): the KV cache of
        every token, cut at once to what later queries can see."""
        out, cache = self._kv_prefill(x, mask, rope)
        return out, self._prune(cache) if self.stride == 0 else cache

    def _prune(self, cache: KVCache) -> KVCache:
        """Without a stride, the next query of a sequence (rank ``count``) sees its keys of rank >=
        ``count - window`` and its global ones: keep the slots some sequence still needs."""
        rank = cache.rank  # (B, T)
        need = cache.mask & ((rank >= cache.count[:, None] - self.window) | (rank < self.num_global))  # (B, T)
        return cache.keep(need.any(0))

    def step(
        self, x_t: Tensor, state: KVCache, mask_t: Tensor | None = None, *, rope: RopeTables | None = None
    ) -> tuple[Tensor, KVCache]:
        """Decode one token on the sparse pattern, counted over each sequence's real tokens (see
        :meth:`AttentionLayer.step`)."""
        self._check_decoding()
        x_t, mask_t = self._check_step(x_t, mask_t, state)
        q, k, v = self._qkv_step(x_t, self._check_step_rope(rope, x_t))  # (B, H, 1, D) each
        out, cache = self._window_step(q, k, v, state, mask_t)
        return self._out_step(out, mask_t), cache

    def _window_step(self, q: Tensor, k: Tensor, v: Tensor, state: KVCache, mask_t: Tensor) -> tuple[Tensor, KVCache]:
        """One token's attention on the pattern from its projections ``(B, H, 1, D)`` and the cache: the heads'
        output ``(B, H, 1, D)`` (before the output projection) and the cache with the token added."""
        cache = state.append(k, v, mask_t)
        # this token's rank among its sequence's real tokens; every kept key has a rank <= it (causal by itself)
        rq = state.count[:, None]  # (B, 1)
        dist = rq - cache.rank  # (B, T) rank distance to each kept key
        allowed = dist <= self.window
        if self.stride > 0:
            allowed |= dist % self.stride == 0
        if self.num_global > 0:
            allowed |= (cache.rank < self.num_global) | (rq < self.num_global)
        out, _ = softmax_attention(
            q,
            cache.k,
            cache.v,
            key_mask=cache.mask,
            attn_mask=allowed[:, None, None, :],
            scale=self.scale,
            softcap=self.softcap,
        )  # (B, H, 1, D)
        # without a stride, drop what no later query sees once the cache holds twice what one sequence needs
        # (amortised O(1); the pattern mask keeps results exact meanwhile). Sequences decoded side by side share
        # their window slots, so the kept set is about window + B * num_global.
        if self.stride == 0 and cache.length > 2 * (self.window + self.num_global) + 16:
            cache = self._prune(cache)
        return out, cache

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask, need_weights: bool):
        return sparse_attention(
            q,
            k,
            v,
            window=self.window,
            stride=self.stride,
            num_global=self.num_global,
            key_mask=key_mask,
            causal=self.causal,
            scale=self.scale,
            dropout_p=self.attn_drop if self.training else 0.0,
            need_weights=need_weights,
            softcap=self.softcap,
        )
