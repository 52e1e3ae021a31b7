"""Base classes for attention layers: ``(B, N, C) -> (B, N, C)`` with one mask convention.

Every layer takes ``forward(x, mask=None, *, need_weights=False)``:

* ``x``: ``(B, N, dim)`` floating tensor;
* ``mask``: ``(B, N)`` boolean, **True = real token**, False = padding (None: no padding);
* returns ``out`` of shape ``(B, N, dim)``, or ``(out, weights)`` when ``need_weights`` is True, with
  ``weights`` of shape ``(B, H, N, N)`` (None for mechanisms whose capabilities say they have none).

Outputs at padded positions are exactly zero, so padded inputs never receive gradient and appending
padding never changes the outputs at real positions.

:class:`QKVAttention` adds the usual fused Q/K/V projection and output projection around a
functional kernel on ``(B, H, N, D)`` tensors; mechanisms only implement :meth:`QKVAttention.attend`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from ..checks import check_heads, check_mask, check_tokens
from ..options import check_bool, check_number
from .capabilities import Capabilities

__all__ = ["AttentionLayer", "QKVAttention"]


class AttentionLayer(nn.Module):
    """Common constructor arguments, input validation and padding handling.

    Args:
        dim: model width C of the ``(B, N, C)`` input and output.
        num_heads: number of heads H.
        head_dim: per-head width D (default ``dim // num_heads``).
        qkv_bias: bias in the input projections.
        attn_drop: dropout on attention weights (or the mechanism's analogue).
        proj_drop: dropout after the output projection.
        causal: position i attends only to positions <= i.
        device, dtype: factory arguments for every parameter.
    """

    registry_name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        causal: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_heads(dim, num_heads, head_dim)
        self.dim = dim
        self.num_heads = num_heads
        self.inner_dim = num_heads * self.head_dim
        self.qkv_bias = check_bool("qkv_bias", qkv_bias)
        self.attn_drop = check_number("attn_drop", attn_drop, low=0.0, high=1.0, high_open=True)
        check_number("proj_drop", proj_drop, low=0.0, high=1.0, high_open=True)
        self.causal = check_bool("causal", causal)
        caps = type(self).capabilities
        name = type(self).registry_name or type(self).__name__
        if self.causal and not caps.causal:
            raise ValueError(f"attention {name!r} does not support causal=True")
        if not self.causal and not caps.non_causal:
            raise ValueError(f"attention {name!r} supports only causal=True")
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor | None]:
        """Args: x ``(B, N, dim)``; mask ``(B, N)`` bool, True = real token. Returns ``(B, N, dim)``."""
        check_tokens(x, self.dim, "x")
        mask = check_mask(mask, x.shape[0], x.shape[1], x.device, "mask")
        if need_weights and not type(self).capabilities.weights:
            raise ValueError(f"attention {self.registry_name!r} cannot return attention weights")
        out, weights = self._forward(x, mask, need_weights)
        if mask is not None:
            out = out.masked_fill(~mask[..., None], 0.0)
        return (out, weights) if need_weights else out

    def _forward(self, x: Tensor, mask: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, causal={self.causal}"


class QKVAttention(AttentionLayer):
    """An :class:`AttentionLayer` with fused Q/K/V projections and an output projection.

    Subclasses implement :meth:`attend` on ``(B, H, N, D)`` tensors.
    """

    def __init__(self, dim: int, num_heads: int, **kwargs) -> None:
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        super().__init__(dim, num_heads, **kwargs)
        fk = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(dim, 3 * self.inner_dim, bias=self.qkv_bias, **fk)
        self.proj = nn.Linear(self.inner_dim, dim, **fk)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """q, k, v: ``(B, H, N, D)``; key_mask ``(B, N)`` bool or None. Returns ``(B, H, N, D)``."""
        raise NotImplementedError

    def _forward(self, x: Tensor, mask: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, N, D)
        out, weights = self.attend(q, k, v, mask, need_weights)
        out = out.transpose(1, 2).reshape(B, N, self.inner_dim)  # (B, N, H*D)
        return self.proj_drop(self.proj(out)), weights
