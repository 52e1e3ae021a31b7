"""RMS norms on per-head queries and keys ("QK-norm"), as trained models apply them before attention.

Two layouts exist among trained models, and a converted layer must reproduce the one its model used:

* ``"head"``: each head's ``D`` features are normalised on their own, with one gain of ``D`` shared by the heads
  (Qwen3, Gemma 3, ViT-22B style);
* ``"all_heads"``: all ``H * D`` features of a token's queries (keys) are normalised together, with a gain of
  ``H * D`` (OLMo 2).

The norm and the gain run in float32 (float64 for float64 inputs), with one rounding back to the input's dtype, as
OLMo 2's and Gemma 3's norms do; Qwen3's rounds the normalised value before the gain as well, so in bf16 a converted
Qwen3 layer can differ from the original by one unit in the last place (float32 is exact). Grouped key heads
repeated to the query heads keep the ``"all_heads"`` mean square: each key head appears the same number of times.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["QK_NORMS", "QK_NORM_EPS", "QKNorm", "qk_rms_norm"]

#: the ``qk_norm`` layouts (see the module docstring)
QK_NORMS = ("head", "all_heads")
#: the layers' default epsilon (Qwen3's, OLMo 2's and Gemma 3's)
QK_NORM_EPS = 1e-6


@dataclass(frozen=True)
class QKNorm:
    """A model's query / key norms, to copy into a layer built with ``qk_norm=kind``.

    Attributes:
        kind: ``"head"`` or ``"all_heads"``.
        eps: the norms' epsilon.
        q, k: the gains actually applied, ``(D,)`` for ``"head"``, ``(H * D,)`` for ``"all_heads"`` (grouped key
            heads already repeated to the query heads).
    """

    kind: str
    eps: float
    q: Tensor
    k: Tensor


def qk_rms_norm(t: Tensor, weight: Tensor, eps: float, kind: str) -> Tensor:
    """``t`` ``(B, H, N, D)`` RMS-normalised per head (``"head"``, ``weight`` ``(D,)``) or over all heads of a token
    (``"all_heads"``, ``weight`` ``(H * D,)``), times ``weight``; computed in at least float32, returned in ``t``'s
    dtype."""
    if kind not in QK_NORMS:
        raise ValueError(f"kind must be one of {QK_NORMS}, got {kind!r}")
    B, H, N, D = t.shape
    wide = torch.promote_types(t.dtype, torch.float32)  # float64 stays float64
    if kind == "head":
        return F.rms_norm(t.to(wide), (D,), weight.to(wide), eps).to(t.dtype)
    flat = t.transpose(1, 2).reshape(B, N, H * D)  # (B, N, H*D)
    out = F.rms_norm(flat.to(wide), (H * D,), weight.to(wide), eps).to(t.dtype)
    return out.view(B, N, H, D).transpose(1, 2)  # (B, H, N, D)
