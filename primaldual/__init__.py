"""primaldual: primal-dual attention for PyTorch.

* Primal-Attention (Chen et al., NeurIPS 2023): self-attention as asymmetric kernel SVD.
* The SVR framework (Nguyen et al., ICLR 2023): attention as a support vector expansion;
  Attention-BN and Attention-SH.

Quick use::

    import torch, primaldual as pd
    attn = pd.build_attention("softmax", dim=64, num_heads=4)
    y = attn(torch.randn(2, 100, 64), mask=torch.ones(2, 100, dtype=torch.bool))
"""

from ._version import __version__ as __version__
from .attention import (
    AttentionLayer,
    Capabilities,
    attention_options,
    attention_table,
    build_attention,
    list_attentions,
    register_attention,
)
from .attention.primal import PrimalAttention, PrimalState
from .aux_loss import AuxLossMixin, clear_aux_loss, collect_aux_loss
from .checks import set_input_checks
from .dropout import CounterDropout, use_counter_dropout
from .encoder import Encoder, EncoderBlock, LearnedPositionalEncoding, SinusoidalPositionalEncoding
from .integrations import auto_register as _auto_register  # noqa: E402
from .models.plans import primal_plus, primalformer

_auto_register.install()  # `primaldual export` directories load with AutoModelForCausalLM once transformers is in

__all__ = [
    "AttentionLayer",
    "AuxLossMixin",
    "Capabilities",
    "CounterDropout",
    "Encoder",
    "EncoderBlock",
    "LearnedPositionalEncoding",
    "PrimalAttention",
    "PrimalState",
    "SinusoidalPositionalEncoding",
    "attention_options",
    "attention_table",
    "build_attention",
    "clear_aux_loss",
    "collect_aux_loss",
    "list_attentions",
    "primal_plus",
    "primalformer",
    "register_attention",
    "set_input_checks",
    "use_counter_dropout",
]
