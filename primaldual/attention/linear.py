"""Multi-head linear attention layer (elu + 1 features, Katharopoulos et al. 2020)."""

from __future__ import annotations

from torch import Tensor

from ..functional.linear import linear_attention
from ..options import check_int, check_number
from .base import QKVAttention
from .capabilities import Capabilities
from .registry import register_attention

__all__ = ["LinearAttention"]


@register_attention(
    "linear",
    Capabilities(time="O(N D^2)", memory="O(N D + D^2)", weights_meaning="normalised kernel matrix (materialised)"),
)
class LinearAttention(QKVAttention):
    """Linear attention: phi(q)^T sum_j phi(k_j) v_j^T over a normaliser, padded keys excluded from both.

    Args:
        eps: added to the normaliser.
        chunk_size: chunk length of the causal scan.
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer`. ``attn_drop`` is unused
        (there is no weight matrix to drop on the fast path) and must be 0.
    """

    def __init__(self, dim: int, num_heads: int, *, eps: float = 1e-6, chunk_size: int = 64, **kw) -> None:
        if kw.get("attn_drop", 0.0):
            raise ValueError("attn_drop must be 0 for linear attention (no attention matrix is formed)")
        super().__init__(dim, num_heads, **kw)
        self.eps = check_number("eps", eps, low=0.0, low_open=True)
        self.chunk_size = check_int("chunk_size", chunk_size, low=1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask, need_weights: bool):
        return linear_attention(
            q,
            k,
            v,
            key_mask=key_mask,
            causal=self.causal,
            eps=self.eps,
            need_weights=need_weights,
            chunk_size=self.chunk_size,
        )
