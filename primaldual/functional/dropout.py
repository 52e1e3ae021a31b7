"""Counter-based dropout: masks from a keyed integer hash of each element's index (for compiled CPU graphs).

``torch.nn.functional.dropout`` draws its mask from ATen's CPU Bernoulli sampler, which runs on one thread
(about 6 ms per million elements) and cannot be fused into the surrounding loops; Inductor's own CPU random numbers
set up one Philox engine per element and are slower still. Here the keep/drop decision of element ``i`` is a pure
function of ``i`` and a 64-bit key drawn once per call from torch's generator: ``h = mix(mix(i ^ k0) ^ k1)`` with
``mix`` the two-multiply 32-bit finaliser "lowbias32" (C. Wellons, hash-prospector), and the element is kept when
the low 24 bits of ``h`` are at or above ``round(p 2^24)``. Under ``torch.compile`` the hash becomes a few integer
operations inside the fused element-wise loop, parallel over the threads: on a 2-core CPU the masked ReLU of a
``(8192, 128)`` activation costs 0.4-0.7 ms above the matmul against 7.9-8.2 ms with ATen's sampler
(``benchmarks/dropout_sampler.py``, docs/benchmarks.md section 2).

Properties (tested in ``tests/functional/test_dropout.py``): the same key gives the same mask eagerly and compiled,
bit for bit; the keep fraction is ``1 - p`` to within binomial error at the 2^-24 resolution of ``p``; neighbouring
elements and successive calls are uncorrelated; the keys come from torch's default (or the given) generator, so
``torch.manual_seed`` and a checkpoint's restored RNG state reproduce the masks. The hash is statistically good
for masks, not a certified generator (no TestU01 claim) and not cryptographic. It draws other masks than
``F.dropout`` for the same seed: same distribution, other stream.

Hand-written: no library offers a fusable counter-based sampler for Inductor's CPU backend.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["counter_dropout", "counter_hash", "dropout_keys"]

# lowbias32's multipliers as int32 bit patterns (torch has no arithmetic on uint32)
_M1 = 0x7FEB352D
_M2 = 0x846CA68B - (1 << 32)
_BITS = 24  # decision resolution: p is rounded to a multiple of 2^-24, the resolution of float32 uniforms
_MAX_NUMEL = (1 << 31) - 1  # the element index is an int32


def _mix(x: Tensor) -> Tensor:
    """lowbias32 on int32 bit patterns; ``(x >> k) & (2^(32-k) - 1)`` is the logical shift of the uint32 original."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _M1  # wraps modulo 2^32, as the uint32 product would
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * _M2
    return x ^ ((x >> 16) & 0xFFFF)


def counter_hash(index: Tensor, keys: Tensor) -> Tensor:
    """The keyed hash ``mix(mix(index ^ k0) ^ k1)`` of int32 indices.

    Args:
        index: int32 tensor of element indices (any shape).
        keys: ``(2,)`` int32 key ``(k0, k1)``.

    Returns:
        int32 tensor of the shape of ``index``: 32 hashed bits per element.
    """
    if index.dtype != torch.int32 or keys.dtype != torch.int32 or keys.shape != (2,):
        raise ValueError(
            f"counter_hash: expected int32 index and (2,) int32 keys, got {index.dtype} and "
            f"{tuple(keys.shape)} {keys.dtype}"
        )
    return _mix(_mix(index ^ keys[0]) ^ keys[1])


def dropout_keys(device: torch.device | str = "cpu", generator: torch.Generator | None = None) -> Tensor:
    """A fresh ``(2,)`` int32 key from torch's generator (the default one unless ``generator`` is given)."""
    return torch.randint(-(1 << 31), (1 << 31) - 1, (2,), dtype=torch.int32, device=device, generator=generator)


def counter_dropout(x: Tensor, p: float, keys: Tensor | None = None) -> Tensor:
    """Dropout with counter-based masks: element ``i`` of ``x`` (row-major) is zeroed when its hash falls under p.

    Kept elements are scaled by ``1 / (1 - p')`` with ``p' = round(p 2^24) / 2^24`` the probability the test
    actually draws, so the expectation of the output is ``x`` exactly.

    Args:
        x: floating tensor, at most ``2^31 - 1`` elements.
        p: drop probability in ``[0, 1)``.
        keys: ``(2,)`` int32 key (:func:`dropout_keys`); None draws one from torch's default generator.

    Returns:
        Tensor of the shape and dtype of ``x``.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"counter_dropout: p must be a number in [0, 1), got {p!r}")
    if not x.is_floating_point():
        raise ValueError(f"counter_dropout: x must be a floating tensor, got {x.dtype}")
    if x.numel() > _MAX_NUMEL:
        raise ValueError(f"counter_dropout: x has {x.numel()} elements; the int32 counter allows {_MAX_NUMEL}")
    threshold = round(p * (1 << _BITS))
    if threshold == 0:
        return x
    if keys is None:
        keys = dropout_keys(x.device)
    index = torch.arange(x.numel(), dtype=torch.int32, device=x.device).view(x.shape)  # row-major element index
    keep = (counter_hash(index, keys) & ((1 << _BITS) - 1)) >= threshold
    scale = 1.0 / (1.0 - threshold / (1 << _BITS))
    return x * keep * scale
