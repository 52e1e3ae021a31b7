"""Weight initialisations a model may choose (``model.init``): each module's own (``"pytorch"``) or GPT-2's.

GPT-2's (Radford et al. 2019; Hugging Face's ``GPT2PreTrainedModel._init_weights``): every linear and embedding
weight N(0, 0.02), biases 0, LayerNorms (1, 0), and the two projections of each block that write into the residual
stream (attention output, second FFN layer) N(0, 0.02 / sqrt(2 * depth)), so that the residual stream's variance
stays about 0.02^2 after ``depth`` blocks. Parameters that are not ``nn.Linear`` / ``nn.Embedding`` /
``nn.LayerNorm`` weights (the primal layer's ``W_e``, ``W_r``, learned position tables) keep their own
initialisation.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["INITS", "gpt2_init_"]

INITS = ("pytorch", "gpt2")  # the ``init`` choices
_STD = 0.02


@torch.no_grad()
def gpt2_init_(model: nn.Module, blocks: Iterable[nn.Module], depth: int) -> None:
    """GPT-2's initialisation of ``model`` in place; ``blocks`` are its :class:`~primaldual.EncoderBlock` s."""
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            module.weight.normal_(0.0, _STD)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, nn.LayerNorm) and module.weight is not None:
            module.weight.fill_(1.0)
            if module.bias is not None:
                module.bias.zero_()
    for block in blocks:
        for w in (getattr(block.attn, "proj", None), block.ffn.net[3]):
            if isinstance(w, nn.Linear):
                w.weight.normal_(0.0, _STD / (2 * depth) ** 0.5)
