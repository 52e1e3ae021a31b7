"""Functional attention kernels on ``(B, H, N, D)`` tensors; masks are ``(B, N)`` bool, True = real."""

from .linear import elu_feature_map, linear_attention
from .softmax import softmax_attention
from .sparse import sparse_attention, sparse_pattern

__all__ = ["elu_feature_map", "linear_attention", "softmax_attention", "sparse_attention", "sparse_pattern"]
