"""Two-tower retrieval model of LRA (document matching): one shared encoder for both documents.

``a = enc(x1)``, ``b = enc(x2)`` (each ``(B, D)``) -> ``[a, b, a * b, a - b]`` ``(B, 4D)`` -> MLP -> logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .sequence import SequenceEncoder

__all__ = ["RetrievalClassifier"]


class RetrievalClassifier(nn.Module):
    """Siamese (shared-weight) :class:`~primaldual.models.sequence.SequenceEncoder` + interaction MLP.

    Args:
        vocab_size, max_len: per document. num_classes: 2 for LRA retrieval. mlp_dim: head hidden width
            (default ``ffn_dim``). Other arguments as :class:`SequenceEncoder`.
    """

    def __init__(
        self, vocab_size: int, max_len: int, num_classes: int = 2, *, mlp_dim: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__()
        self.encoder = SequenceEncoder(vocab_size, max_len, **kwargs)
        d = self.encoder.dim
        hidden = mlp_dim or kwargs.get("ffn_dim", 128)
        self.head = nn.Sequential(nn.Linear(4 * d, hidden), nn.GELU(), nn.Linear(hidden, num_classes))

    def forward(self, tokens1: Tensor, tokens2: Tensor, mask1: Tensor | None = None, mask2: Tensor | None = None):
        """tokens1/tokens2 ``(B, N)``; masks ``(B, N)`` bool. Returns logits ``(B, num_classes)``."""
        a = self.encoder(tokens1, mask1)  # (B, D)
        b = self.encoder(tokens2, mask2)  # (B, D)
        return self.head(torch.cat([a, b, a * b, a - b], dim=-1))  # (B, 4D) -> (B, classes)
