"""Multi-head linear attention layer (elu + 1 features, Katharopoulos et al. 2020)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..functional.linear import elu_feature_map, linear_attention
from ..options import check_int, check_number
from .base import QKVAttention, accumulation_dtype
from .capabilities import Capabilities
from .registry import register_attention

__all__ = ["LinearAttention", "LinearState"]


class LinearState(NamedTuple):
    """Decoding state of causal linear attention (constant size).

    Attributes:
        kv: ``(B, H, D, Dv)`` running ``sum_j phi(k_j) v_j^T`` over real tokens.
        z: ``(B, H, D)`` running ``sum_j phi(k_j)``.
    """

    kv: Tensor
    z: Tensor


@register_attention(
    "linear",
    Capabilities(
        time="O(N D^2)",
        memory="O(N D + D^2)",
        weights_meaning="normalised kernel matrix (materialised)",
        decoding="constant",
    ),
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
        if chunk_size != 64 and not self.causal:
            raise ValueError("chunk_size: only the causal scan reads it; this layer (causal=False) would ignore it")

    def init_state(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> LinearState:
        """A zero state for ``batch`` sequences (causal layers only): its size does not grow with the context. Its sums
        are kept in ``dtype`` (default: float32 for a float16 / bfloat16 layer, as the forward sums)."""
        self._check_decoding()
        ref = self.qkv.weight
        fk = {"device": device or ref.device, "dtype": dtype or accumulation_dtype(ref.dtype)}
        H, D = self.num_heads, self.head_dim
        return LinearState(torch.zeros(batch, H, D, D, **fk), torch.zeros(batch, H, D, **fk))

    def _prefill(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, LinearState]:
        """The forward and the running sums of the prompt, from one projection (see :meth:`AttentionLayer.prefill`)."""
        q, k, v = self._qkv(x)  # (B, H, N, D) each
        out, _ = self.attend(q, k, v, mask, False)
        acc = accumulation_dtype(k.dtype)
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):  # the sums in acc, autocast or not
            fk = elu_feature_map(k.to(acc))  # (B, H, N, D)
            if mask is not None:
                fk = fk * mask[:, None, :, None].to(fk.dtype)  # padded keys add nothing, as in step
            kv = torch.einsum("bhnd,bhne->bhde", fk, v.to(acc))  # (B, H, D, Dv)
        return self._out(out), LinearState(kv, fk.sum(2))

    def step(
        self, x_t: Tensor, state: LinearState, mask_t: Tensor | None = None, *, rope: None = None
    ) -> tuple[Tensor, LinearState]:
        """Decode one token from the running sums (see :meth:`AttentionLayer.step`)."""
        self._check_decoding()
        x_t, mask_t = self._check_step(x_t, mask_t, state)
        self._check_step_rope(rope, x_t)  # takes none: refused by name
        q, k, v = (t[:, :, 0].to(state.kv.dtype) for t in self._qkv_step(x_t))  # (B, H, D) each, as the sums
        fq, fk = elu_feature_map(q), elu_feature_map(k)  # (B, H, D)
        fk = fk * mask_t[:, None, None].to(fk.dtype)  # a padded key adds nothing
        kv = state.kv + fk[..., :, None] * v[:, :, None, :]  # (B, H, D, Dv)
        z = state.z + fk  # (B, H, D)
        num = torch.einsum("bhd,bhde->bhe", fq, kv)  # (B, H, Dv)
        den = (fq * z).sum(-1, keepdim=True)  # (B, H, 1)
        out = (num / (den + self.eps))[:, :, None].to(x_t.dtype)  # (B, H, 1, Dv)
        return self._out_step(out, mask_t), LinearState(kv, z)

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
