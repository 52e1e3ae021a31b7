"""ViT-style image classifier: patch embedding, CLS token, learned positions, pre-LN encoder, linear head."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..encoder import Encoder, LearnedPositionalEncoding

__all__ = ["VisionClassifier"]


class VisionClassifier(nn.Module):
    """Image ``(B, C, H, W)`` -> non-overlapping ``patch x patch`` patches -> tokens -> CLS state -> logits.

    Args:
        image_size: H = W. patch_size: side of a patch (must divide image_size). in_channels: C.
        num_classes: classes. dim, depth, num_heads, ffn_dim, dropout, drop_path: encoder sizes.
        attention, attention_options: per-layer registry names / options (``[..., "primal"]`` = Primal.+DeiT).
    """

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        num_classes: int,
        *,
        in_channels: int = 3,
        dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        ffn_dim: int | None = None,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        attention: str | Sequence[str] = "softmax",
        attention_options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size ({patch_size}) must divide image_size ({image_size})")
        self.image_size, self.in_channels = image_size, in_channels
        num_patches = (image_size // patch_size) ** 2
        self.patch = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.cls, std=0.02)
        self.pos = LearnedPositionalEncoding(num_patches + 1, dim)
        self.drop = nn.Dropout(dropout)
        self.encoder = Encoder(
            dim,
            depth,
            num_heads,
            attention,
            attention_options,
            ffn_dim=ffn_dim,
            dropout=dropout,
            drop_path=drop_path,
            norm_first=True,
        )
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: Tensor) -> Tensor:
        """images ``(B, C, H, W)``. Returns logits ``(B, num_classes)``."""
        if images.dim() != 4 or images.shape[1:] != (self.in_channels, self.image_size, self.image_size):
            raise ValueError(
                f"images: expected (B, {self.in_channels}, {self.image_size}, {self.image_size}), "
                f"got {tuple(images.shape)}"
            )
        h = self.patch(images).flatten(2).transpose(1, 2)  # (B, D, H/p, W/p) -> (B, P, D)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)  # (B, 1 + P, D)
        h = self.encoder(self.drop(self.pos(h)))  # (B, 1 + P, D)
        return self.head(h[:, 0])  # (B, classes)
