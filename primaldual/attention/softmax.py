"""Multi-head softmax attention layer (the Transformer baseline)."""

from __future__ import annotations

from torch import Tensor

from ..functional.softmax import softmax_attention
from ..options import check_choice, check_number
from .base import QKVAttention
from .capabilities import Capabilities
from .registry import register_attention

__all__ = ["SoftmaxAttention"]


@register_attention(
    "softmax",
    Capabilities(time="O(N^2 D)", memory="O(N) fused (SDPA) / O(N^2) eager"),
)
class SoftmaxAttention(QKVAttention):
    """Multi-head scaled dot-product attention (SDPA fast path; eager path when weights are needed).

    Args:
        backend: ``"auto"`` (SDPA unless weights are requested), ``"sdpa"`` or ``"eager"``.
        scale: logit scale (default ``1 / sqrt(head_dim)``).
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer`.
    """

    def __init__(self, dim: int, num_heads: int, *, backend: str = "auto", scale: float | None = None, **kw) -> None:
        super().__init__(dim, num_heads, **kw)
        self.backend = check_choice("backend", backend, ("auto", "sdpa", "eager"))
        self.scale = check_number("scale", scale, allow_none=True)

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
        )
