"""Multi-head sparse attention layer: sliding window plus optional strided and global tokens."""

from __future__ import annotations

from torch import Tensor

from ..functional.sparse import check_pattern, sparse_attention
from ..options import check_int, check_number
from .base import QKVAttention
from .capabilities import Capabilities
from .registry import register_attention

__all__ = ["SparseAttention"]


@register_attention(
    "sparse",
    Capabilities(
        time="O(N (w + g + N/s) D)",
        memory="O(N (w + g + N/s))",
        weights_meaning="softmax weights on the sparse pattern (dense matrix, zeros off-pattern)",
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
