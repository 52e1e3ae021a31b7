"""Token-sequence classifier for Long-Range Arena (Nystromformer-style LRA code).

token ids ``(B, N)`` -> embedding + learned positions -> pre-LN :class:`~primaldual.Encoder` (final LayerNorm) ->
mean over real tokens, or the state of a prepended CLS token -> MLP head (Linear -> GELU -> Linear).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..checks import check_mask
from ..encoder import Encoder, LearnedPositionalEncoding, SinusoidalPositionalEncoding
from .pooling import masked_mean

__all__ = ["SequenceClassifier", "SequenceEncoder"]


class SequenceEncoder(nn.Module):
    """Embed token ids and encode them into one ``(B, D)`` vector per sequence.

    Args:
        vocab_size: number of token ids (id ``padding_idx`` is the pad token).
        max_len: longest sequence (without the CLS token).
        dim, depth, num_heads, ffn_dim, dropout: encoder sizes.
        pooling: ``"mean"`` over real tokens or ``"cls"`` (a learned token prepended to every sequence).
        attention, attention_options: per-layer registry names / options, as :class:`~primaldual.Encoder`.
        padding_idx: embedding row kept at zero for padding.
        norm_first: pre-LN blocks (LRA reference) or post-LN. positions: ``"learned"`` (LRA reference) or
            ``"sinusoidal"``.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 2,
        ffn_dim: int = 128,
        dropout: float = 0.1,
        pooling: Literal["mean", "cls"] = "mean",
        attention: str | Sequence[str] = "softmax",
        attention_options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        padding_idx: int | None = 0,
        norm_first: bool = True,
        positions: Literal["learned", "sinusoidal"] = "learned",
    ) -> None:
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"positions must be 'learned' or 'sinusoidal', got {positions!r}")
        self.pooling = pooling
        self.dim = dim
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=padding_idx)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim)) if pooling == "cls" else None
        n_pos = max_len + (pooling == "cls")
        self.pos = (
            LearnedPositionalEncoding(n_pos, dim) if positions == "learned" else SinusoidalPositionalEncoding(dim)
        )
        self.drop = nn.Dropout(dropout)
        self.encoder = Encoder(
            dim, depth, num_heads, attention, attention_options, ffn_dim=ffn_dim, dropout=dropout, norm_first=norm_first
        )

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens ``(B, N)`` int; mask ``(B, N)`` bool (True = real token). Returns ``(B, D)``."""
        if tokens.dim() != 2 or tokens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"tokens: expected (B, N) integer ids, got {tuple(tokens.shape)} {tokens.dtype}")
        mask = check_mask(mask, tokens.shape[0], tokens.shape[1], tokens.device, "mask")
        h = self.embed(tokens)  # (B, N, D)
        if self.cls is not None:
            h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)  # (B, 1 + N, D)
            if mask is not None:
                mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)  # (B, 1 + N)
        h = self.encoder(self.drop(self.pos(h)), mask)  # (B, N', D)
        return h[:, 0] if self.cls is not None else masked_mean(h, mask)


class SequenceClassifier(nn.Module):
    """:class:`SequenceEncoder` + MLP head (Linear(D, hidden) -> GELU -> Linear(hidden, classes)).

    Args:
        num_classes: classes. mlp_dim: head hidden width (default ``ffn_dim``). Other arguments as
            :class:`SequenceEncoder`.
    """

    def __init__(self, vocab_size: int, num_classes: int, max_len: int, *, mlp_dim: int | None = None, **kwargs: Any):
        super().__init__()
        self.encoder = SequenceEncoder(vocab_size, max_len, **kwargs)
        hidden = mlp_dim or kwargs.get("ffn_dim", 128)
        self.head = nn.Sequential(nn.Linear(self.encoder.dim, hidden), nn.GELU(), nn.Linear(hidden, num_classes))

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens ``(B, N)``; mask ``(B, N)`` bool. Returns logits ``(B, num_classes)``."""
        return self.head(self.encoder(tokens, mask))
