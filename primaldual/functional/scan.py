"""Prefix sums along the token axis that keep a GPU busy at any batch size.

``torch.cumsum`` on a CUDA tensor scans a dimension that is not the last one with one thread per (row, column)
pair, each walking the whole scanned dimension in turn. For the causal primal layer's prefix mean of ``(B, N, C)``
that is ``B * C`` threads doing ``N`` dependent steps: at ``B = 1, N = 64K, C = 768`` about 50 ms on an H200, where
the rest of the layer takes 7 ms (docs/benchmarks.md, section 6b). :func:`prefix_sum` splits the axis into chunks of
``chunk`` tokens, scans each chunk (``N / chunk`` times more threads, ``chunk`` steps each), scans the chunk totals
the same way (recursively) and adds them back: ``O(log_chunk N)`` short scans instead of one long one. The sums are
the same up to the order of floating-point additions.

Half-precision inputs are summed in float32: a running sum over thousands of tokens in bfloat16 (8 bits of
mantissa) stops moving once it is a few hundred times the size of one term.

Hand-written: torch has no parallel scan over a non-last dimension, and a Triton scan kernel would be a second
code path to keep exact; this is four plain torch ops per level, differentiable by autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["prefix_sum"]

# tokens per chunk: long enough that the levels are few (64K tokens: 3 levels), short enough that each scan is
# cheap
CHUNK = 64


def prefix_sum(x: Tensor, chunked: bool | None = None, chunk: int = CHUNK) -> Tensor:
    """Inclusive prefix sum along dim 1: ``out[:, i] = sum_{j <= i} x[:, j]``.

    Args:
        x: ``(B, N, ...)`` token-major tensor.
        chunked: scan in chunks (see the module docstring). ``None`` (default) chunks on CUDA tensors and uses one
            ``torch.cumsum`` elsewhere (a CPU scan walks memory in order and gains nothing from chunks).
        chunk: tokens per chunk, >= 2.

    Returns:
        Same shape as ``x``; float16 / bfloat16 inputs are summed in float32 and returned in float32 (the callers
        divide by counts before casting back).
    """
    if x.dim() < 2:
        raise ValueError(f"x: expected (B, N, ...) with a token axis at dim 1, got shape {tuple(x.shape)}")
    if chunk < 2:
        raise ValueError(f"chunk: expected an int >= 2, got {chunk!r}")
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    if chunked is None:
        chunked = x.is_cuda
    if not chunked:
        return x.cumsum(1)
    B, N = x.shape[:2]
    flat = x.reshape(B, N, -1)  # (B, N, ...) -> (B, N, F)
    return _chunked(flat, chunk).view(x.shape)  # (B, N, F) -> (B, N, ...)


def _chunked(x: Tensor, chunk: int) -> Tensor:
    """``x`` ``(B, N, F)`` -> its inclusive prefix sum along dim 1, by chunks of ``chunk`` tokens."""
    B, N, F = x.shape
    if chunk >= N:
        return x.cumsum(1)
    M = -(-N // chunk)  # chunks, the last one zero-padded
    if M * chunk != N:
        x = torch.cat([x, x.new_zeros(B, M * chunk - N, F)], 1)  # (B, M * chunk, F)
    within = x.view(B, M, chunk, F).cumsum(2)  # (B, N', F) -> (B, M, chunk, F): each chunk scanned on its own
    totals = within[:, :, -1]  # (B, M, F)
    before = _chunked(totals, chunk) - totals  # (B, M, F): sum of all earlier chunks (exclusive scan)
    out = (within + before[:, :, None]).view(B, M * chunk, F)  # (B, M, chunk, F) -> (B, N', F)
    return out[:, :N]
