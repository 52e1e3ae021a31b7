"""Attention layers ``(B, N, C) -> (B, N, C)`` and their registry.

Importing this package registers every built-in mechanism.
"""

from . import hybrid, linear, primal, softmax, sparse, svr  # noqa: F401  (registration side effects)
from .base import AttentionLayer, QKVAttention
from .capabilities import Capabilities
from .registry import (
    AttentionInfo,
    attention_class,
    attention_options,
    attention_table,
    build_attention,
    list_attentions,
    register_attention,
)

__all__ = [
    "AttentionInfo",
    "AttentionLayer",
    "Capabilities",
    "QKVAttention",
    "attention_class",
    "attention_options",
    "attention_table",
    "build_attention",
    "list_attentions",
    "register_attention",
]
