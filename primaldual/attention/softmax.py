"""Multi-head softmax attention layer (the Transformer baseline)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.softmax import softmax_attention
from ..options import check_choice, check_number
from .base import KVCache, QKVAttention, RopeTables
from .capabilities import Capabilities
from .registry import register_attention

__all__ = ["SoftmaxAttention"]


@register_attention(
    "softmax",
    Capabilities(time="O(N^2 D)", memory="O(N) fused (SDPA) / O(N^2) eager", decoding="kv_cache", rope=True),
)
class SoftmaxAttention(QKVAttention):
    """Multi-head scaled dot-product attention (SDPA fast path; eager path when weights are needed).

    Args:
        backend: ``"auto"`` (SDPA unless weights are requested), ``"sdpa"`` or ``"eager"``.
        scale: logit scale (default ``1 / sqrt(head_dim)``).
        softcap: None, or a cap ``c > 0`` on the scaled logits, ``s -> c * tanh(s / c)`` (Gemma 2); a capped layer
            computes the explicit matrix (SDPA has no cap), so ``backend`` must be ``"auto"`` or ``"eager"``.
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        backend: str = "auto",
        scale: float | None = None,
        softcap: float | None = None,
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        self.backend = check_choice("backend", backend, ("auto", "sdpa", "eager"))
        self.scale = check_number("scale", scale, allow_none=True)
        self.softcap = check_number("softcap", softcap, low=0, low_open=True, allow_none=True)
        if softcap is not None and backend == "sdpa":
            raise ValueError("softcap: SDPA cannot cap the logits; use backend 'auto' or 'eager' with it")

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", softcap={self.softcap}" if self.softcap is not None else "")

    def init_state(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> KVCache:
        """An empty KV cache for ``batch`` sequences (causal layers only)."""
        return self._empty_cache(batch, device, dtype)

    def step(
        self, x_t: Tensor, state: KVCache, mask_t: Tensor | None = None, *, rope: RopeTables | None = None
    ) -> tuple[Tensor, KVCache]:
        """Decode one token against the KV cache (see :meth:`AttentionLayer.step`)."""
        self._check_decoding()
        x_t, mask_t = self._check_step(x_t, mask_t, state)
        q, k, v = self._qkv_step(x_t, self._check_step_rope(rope, x_t))  # (B, H, 1, D) each
        cache = state.append(k, v, mask_t)
        out, _ = softmax_attention(
            q, cache.k, cache.v, key_mask=cache.mask, scale=self.scale, softcap=self.softcap
        )  # (B, H, 1, D)
        return self._out_step(out, mask_t), cache

    def _prefill(self, x: Tensor, mask: Tensor | None, rope: RopeTables | None = None) -> tuple[Tensor, KVCache]:
        """The forward and the KV cache of the prompt, from one projection (see :meth:`AttentionLayer.prefill`)."""
        return self._kv_prefill(x, mask, rope)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask, need_weights: bool):
        return softmax_attention(
            q,
            k,
            v,
            key_mask=key_mask,
            causal=self.causal,
            scale=self.scale,
            dropout_p=self.attn_drop if self.training else 0.0,
            need_weights=need_weights,
            backend="auto" if need_weights else self.backend,
            softcap=self.softcap,
        )
