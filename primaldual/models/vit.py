"""ViT / DeiT image classifier: patch embedding, CLS token, learned positions, pre-LN encoder, linear head.

DeiT (Touvron et al., 2021) is a ViT trained with a recipe (:mod:`primaldual.data.augment`,
:mod:`primaldual.tasks.vision.training`), so the sizes below are the only architectural facts: DeiT-Tiny and DeiT-Small
with 16 x 16 patches on 224 x 224 images, and a small patch-4 ViT for 28 x 28 images (Fashion-MNIST / MNIST:
7 x 7 = 49 patches + CLS = 50 tokens). DeiT's optional distillation token (which needs a CNN teacher) is left out.
The attention of every block is a registry name, so DeiT, Primal.+DeiT (``primal_plus(12, ...)``: the last block
primal) and the Attention-BN / SH / BN+SH DeiTs differ only in ``attention`` / ``attention_options``.

Initialisation: PyTorch's defaults for the patch projection, the blocks and the head, truncated normal (std 0.02)
for the CLS token and the positions. timm's ViT initialisation (truncated-normal linear weights) is not used:
in one comparison on Fashion-MNIST (patch-4 ViT, 2 epochs, same seed) it reached 85.1% test accuracy against 86.0%
with the defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..encoder import Encoder, LearnedPositionalEncoding
from ..options import check_int

__all__ = ["VIT_PRESETS", "VisionClassifier", "vit"]

# name -> (image_size, patch_size, dim, depth, num_heads, ffn_dim)
VIT_PRESETS: dict[str, dict[str, int]] = {
    "deit_tiny": {"image_size": 224, "patch_size": 16, "dim": 192, "depth": 12, "num_heads": 3, "ffn_dim": 768},
    "deit_small": {"image_size": 224, "patch_size": 16, "dim": 384, "depth": 12, "num_heads": 6, "ffn_dim": 1536},
    "vit_patch4_28": {"image_size": 28, "patch_size": 4, "dim": 64, "depth": 4, "num_heads": 4, "ffn_dim": 128},
}


class VisionClassifier(nn.Module):
    """Image ``(B, C, H, W)`` -> non-overlapping ``patch x patch`` patches -> tokens -> CLS state -> logits.

    Args:
        image_size: H = W. patch_size: side of a patch (must divide image_size). in_channels: C.
        num_classes: classes. dim, depth, num_heads, ffn_dim, dropout, drop_path: encoder sizes (``drop_path``:
            stochastic depth rising linearly to this value in the last block, as DeiT).
        attention, attention_options: per-layer registry names / options (``[..., "primal"]`` = Primal.+DeiT).
        patch_kernel: side of the patch projection's kernel; None: ``patch_size`` (ViT's non-overlapping patches).
            A larger kernel (``patch_size`` plus an even number) makes each token see its patch and a
            ``(patch_kernel - patch_size) / 2``-pixel border of its neighbours (zero padding at the image edge), an
            overlapping patch embedding as in CvT / PVTv2; the token grid and count are unchanged.
        stem: ``"patch"`` (the patch projection above) or ``"conv"``: the convolutional stem of Xiao et al. (2021,
            "Early convolutions help transformers see better"), ``log2(patch_size)`` stride-2 3 x 3 convolutions
            (BatchNorm, ReLU; channels doubling up to ``dim``) and a 1 x 1 projection to ``dim``. Same token grid
            (``patch_size`` a power of two, ``patch_kernel`` None); each token sees a growing, overlapping window.
        mean, std: per-channel pixel statistics. When given, the model takes raw pixels (``uint8`` 0-255, or
            floats in [0, 1]) and normalises them itself (buffers outside the state dict: the harness rebuilds them
            from the run's data); when None, inputs are used as they are (already normalised floats).
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
        patch_kernel: int | None = None,
        stem: str = "patch",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size ({patch_size}) must divide image_size ({image_size})")
        kernel = patch_size if patch_kernel is None else check_int("patch_kernel", patch_kernel, low=patch_size)
        if (kernel - patch_size) % 2:
            raise ValueError(
                f"patch_kernel: expected patch_size ({patch_size}) plus an even number (a border as wide on each "
                f"side), got {patch_kernel}"
            )
        if stem not in ("patch", "conv"):
            raise ValueError(f"stem: expected 'patch' or 'conv', got {stem!r}")
        if stem == "conv" and (patch_size < 2 or patch_size & (patch_size - 1) or patch_kernel is not None):
            raise ValueError(
                f"stem 'conv': expected patch_size a power of two (got {patch_size}) and patch_kernel None "
                f"(got {patch_kernel})"
            )
        if (mean is None) != (std is None):
            raise ValueError("mean, std: give both (raw pixels in, normalised inside) or neither")
        self.image_size, self.in_channels = image_size, in_channels
        self.normalizes = mean is not None
        if mean is not None and std is not None:
            if len(mean) != in_channels or len(std) != in_channels or min(std) <= 0:
                raise ValueError(f"mean, std: expected {in_channels} values each (std > 0), got mean {mean}, std {std}")
            # not persistent: the statistics come from the config, and checkpoints keep their old keys
            self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
            self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        num_patches = (image_size // patch_size) ** 2
        self.stem = stem
        self.patch: nn.Module
        if stem == "conv":
            self.patch = _conv_stem(in_channels, dim, patch_size)
        else:
            # padding (k - p) / 2 keeps the (H/p, W/p) token grid for any allowed kernel
            self.patch = nn.Conv2d(
                in_channels, dim, kernel_size=kernel, stride=patch_size, padding=(kernel - patch_size) // 2
            )
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
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
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.cls, std=0.02)
        for p in self.pos.parameters():
            nn.init.trunc_normal_(p, std=0.02)

    def prepare(self, images: Tensor) -> Tensor:
        """Raw pixels (uint8 or [0, 1] floats) -> normalised floats, when the model holds ``mean`` / ``std``."""
        if not self.normalizes:
            return images
        x = images.float() / 255.0 if images.dtype == torch.uint8 else images
        x = x.to(self.cls.dtype)  # e.g. bf16-true / 64-true training casts the weights, not the pixels
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def forward(self, images: Tensor) -> Tensor:
        """images ``(B, C, H, W)``. Returns logits ``(B, num_classes)``."""
        if images.dim() != 4 or images.shape[1:] != (self.in_channels, self.image_size, self.image_size):
            raise ValueError(
                f"images: expected (B, {self.in_channels}, {self.image_size}, {self.image_size}), "
                f"got {tuple(images.shape)}"
            )
        if images.dtype == torch.uint8 and not self.normalizes:
            raise ValueError("images: uint8 pixels need a model built with mean / std (it normalises them)")
        h = self.patch(self.prepare(images)).flatten(2).transpose(1, 2)  # (B, D, H/p, W/p) -> (B, P, D)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)  # (B, 1 + P, D)
        h = self.encoder(self.drop(self.pos(h)))  # (B, 1 + P, D)
        return self.head(h[:, 0])  # (B, classes)


def _conv_stem(in_channels: int, dim: int, patch_size: int) -> nn.Sequential:
    """``(B, C, H, W)`` -> ``(B, dim, H/p, W/p)``: ``log2(p)`` stride-2 3 x 3 conv-BN-ReLU stages, channels
    ``dim / 2^(k-1), ..., dim / 2, dim`` (at least 8), then a 1 x 1 projection to ``dim`` (with bias, as ViT's)."""
    stages = patch_size.bit_length() - 1
    layers: list[nn.Module] = []
    c_in = in_channels
    for i in range(stages):
        c_out = max(dim >> (stages - 1 - i), 8)
        # no conv bias: BatchNorm's shift replaces it
        layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
        c_in = c_out
    layers.append(nn.Conv2d(c_in, dim, kernel_size=1))
    return nn.Sequential(*layers)


def vit(preset: str, num_classes: int, **kwargs: Any) -> VisionClassifier:
    """A :class:`VisionClassifier` of a :data:`VIT_PRESETS` size; ``kwargs`` override or add arguments
    (e.g. ``vit("deit_small", 100, attention=primal_plus(12, s=96, eta=0.05)["attention"], ...)``)."""
    if preset not in VIT_PRESETS:
        raise ValueError(f"preset: expected one of {sorted(VIT_PRESETS)}, got {preset!r}")
    args: dict[str, Any] = {**VIT_PRESETS[preset], **kwargs}
    return VisionClassifier(args.pop("image_size"), args.pop("patch_size"), num_classes, **args)
