"""Multi-head sparse attention layer: sliding window plus optional strided and global tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.softmax import softmax_attention
from ..functional.sparse import check_pattern, sparse_attention
from ..options import check_int, check_number
from .base import KVCache, QKVAttention
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
    ),
)
class SparseAttention(QKVAttention):
    """Softmax attention restricted to a sparse pattern (local window w, stride s, g global tokens).

    Args:
        window: local radius, keys with ``|i - j| <= window`` (default 32).
        stride: also attend keys with ``(i - j) % stride == 0``; 0 disables (default).
        num_global: the first ``num_global`` tokens attend to and are attended by all (default 0).
        scale: logit scale (default ``1 / sqrt(head_dim)``).
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
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        for name, v in (("window", window), ("stride", stride), ("num_global", num_global)):
            check_int(name, v, low=0)
        check_pattern(window, stride, num_global)
        self.window, self.stride, self.num_global = window, stride, num_global
        self.scale = check_number("scale", scale, allow_none=True)

    def init_state(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> KVCache:
        """An empty cache for ``batch`` sequences (causal layers only). Without a stride it keeps only the global
        tokens and the last ``window`` keys (constant size); with a stride it keeps every key."""
        return self._empty_cache(batch, device, dtype)

    def step(self, x_t: Tensor, state: KVCache, mask_t: Tensor | None = None) -> tuple[Tensor, KVCache]:
        """Decode one token on the sparse pattern (see :meth:`AttentionLayer.step`)."""
        self._check_decoding()
        x_t, mask_t = self._check_step(x_t, mask_t)
        q, k, v = self._qkv_step(x_t)  # (B, H, 1, D) each
        cache = state.append(k, v, mask_t)
        t, pos = cache.t - 1, cache.pos  # this token's position; (T,) positions of the kept keys
        allowed = (t - pos).abs() <= self.window
        if self.stride > 0:
            allowed |= (t - pos) % self.stride == 0
        if self.num_global > 0:
            allowed |= (pos < self.num_global) | (t < self.num_global)
        out, _ = softmax_attention(
            q, cache.k, cache.v, key_mask=cache.mask, attn_mask=allowed[None, None, None, :], scale=self.scale
        )  # (B, H, 1, D)
        # without a stride the next queries see keys >= t + 1 - window and the global ones: drop the rest once
        # the cache holds twice what it needs (amortised O(1); the pattern mask keeps results exact meanwhile)
        if self.stride == 0 and cache.length > 2 * (self.window + self.num_global) + 16:
            cache = cache.keep((pos >= t + 1 - self.window) | (pos < self.num_global))
        return self._out_step(out, mask_t), cache

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
        )
