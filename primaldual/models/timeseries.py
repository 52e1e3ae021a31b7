"""Time-series classifier of the UEA reference protocol (Flowformer / Time-Series-Library lineage).

``(B, N, C)`` series -> Linear(C -> D) + learnable positions -> dropout -> post-LN :class:`~primaldual.Encoder`
(final LayerNorm, as the reference) -> GELU -> dropout -> padded steps zeroed -> flatten ``(B, N * D)`` ->
Linear -> class logits. Because the head flattens, every batch must be padded to the same ``max_len``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_mask
from ..encoder import Encoder, LearnedPositionalEncoding

__all__ = ["TimeSeriesClassifier"]


class TimeSeriesClassifier(nn.Module):
    """Flatten-head transformer classifier for padded multivariate series.

    Args:
        in_channels: C, channels per time step.
        num_classes: number of classes.
        max_len: N, the padded length every input must have.
        dim: model width D. depth: encoder blocks. num_heads: heads. ffn_dim: FFN width.
        dropout: dropout in embedding, blocks and head.
        attention: registry name for every layer, or one name per layer (``["softmax", "primal"]`` is Primal.+).
        attention_options: one dict, or one dict (or None) per layer.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        max_len: int,
        *,
        dim: int = 512,
        depth: int = 2,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        dropout: float = 0.1,
        attention: str | Sequence[str] = "softmax",
        attention_options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Linear(in_channels, dim)
        self.pos = LearnedPositionalEncoding(max_len, dim)
        self.drop = nn.Dropout(dropout)
        self.encoder = Encoder(
            dim,
            depth,
            num_heads,
            attention,
            attention_options,
            ffn_dim=ffn_dim,
            dropout=dropout,
            norm_first=False,
            final_norm=True,
        )
        self.head = nn.Linear(max_len * dim, num_classes)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x ``(B, N, C)`` with N = max_len; mask ``(B, N)`` bool, True = real step. Returns ``(B, num_classes)``."""
        if x.dim() != 3 or x.shape[1] != self.max_len:
            raise ValueError(f"x: expected (B, {self.max_len}, C) padded to max_len, got {tuple(x.shape)}")
        mask = check_mask(mask, x.shape[0], x.shape[1], x.device, "mask")
        h = self.drop(self.pos(self.embed(x)))  # (B, N, D)
        h = self.encoder(h, mask)  # (B, N, D)
        h = self.drop(F.gelu(h))
        if mask is not None:
            h = h * mask.unsqueeze(-1).to(h.dtype)  # padded steps contribute nothing to the head
        return self.head(h.flatten(1))  # (B, N, D) -> (B, N * D) -> (B, classes)
