"""Counter-based dropout: the int32 hash against a plain uint32 reference, eager = compiled bit for bit, the keep
fraction and scale, independence of neighbours and of calls, gradients, and argument errors."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from primaldual.functional.dropout import counter_dropout, counter_hash, dropout_keys

U32 = 0xFFFFFFFF


def _lowbias32(x: int) -> int:
    """The reference finaliser on Python ints modulo 2^32."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & U32
    x ^= x >> 15
    x = (x * 0x846CA68B) & U32
    return x ^ (x >> 16)


def _ref_hash(i: int, k0: int, k1: int) -> int:
    return _lowbias32(_lowbias32(i ^ (k0 & U32)) ^ (k1 & U32))


def test_the_int32_hash_equals_the_uint32_reference():
    keys = torch.tensor([-123456789, 2024061517], dtype=torch.int32)
    idx = torch.tensor([0, 1, 2, 7, 65535, 65536, 1 << 30, (1 << 31) - 1], dtype=torch.int32)
    got = [v & U32 for v in counter_hash(idx, keys).tolist()]
    want = [_ref_hash(i, *keys.tolist()) for i in idx.tolist()]
    assert got == want


def test_keep_fraction_and_scale():
    torch.manual_seed(0)
    n, p = 1 << 20, 0.1
    y = counter_dropout(torch.ones(n), p)
    kept = y != 0
    frac = kept.double().mean().item()
    assert abs(frac - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    p_drawn = round(p * (1 << 24)) / (1 << 24)
    assert torch.all(y[kept] == torch.tensor(1.0 / (1.0 - p_drawn)))


def test_neighbours_calls_and_hash_bits_are_uncorrelated():
    torch.manual_seed(1)
    n, p = 1 << 20, 0.5
    a = (counter_dropout(torch.ones(n), p) != 0).double()
    b = (counter_dropout(torch.ones(n), p) != 0).double()

    def corr(u: torch.Tensor, v: torch.Tensor) -> float:
        return torch.corrcoef(torch.stack((u, v)))[0, 1].item()

    bound = 5 / math.sqrt(n)
    for lag in (1, 2, 64, 1024):  # neighbours along the flattened rows
        assert abs(corr(a[:-lag], a[lag:])) < bound, lag
    assert abs(corr(a, b)) < bound  # two calls
    for lag in (1, 7, 4096):  # nor is one call a shifted copy of the other
        assert abs(corr(a[:-lag], b[lag:])) < bound, lag
    h = counter_hash(torch.arange(n, dtype=torch.int32), dropout_keys())
    ones = torch.stack([((h >> k) & 1).double().mean() for k in range(24)])  # each decision bit is fair
    assert torch.all((ones - 0.5).abs() < 5 * 0.5 / math.sqrt(n))


def test_the_keys_fix_the_mask_and_come_from_torch_generator():
    x = torch.randn(3, 5, 7)
    keys = torch.tensor([5, -9], dtype=torch.int32)
    assert torch.equal(counter_dropout(x, 0.3, keys), counter_dropout(x, 0.3, keys))
    torch.manual_seed(3)
    first = counter_dropout(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(counter_dropout(x, 0.3), first)
    assert not torch.equal(counter_dropout(x, 0.3), first)  # the next call has another key
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    assert torch.equal(dropout_keys(generator=g), dropout_keys())


def test_gradient_is_the_mask_times_the_scale():
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)
    keys = torch.tensor([11, 12], dtype=torch.int32)
    y = counter_dropout(x, 0.25, keys)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g, (y.detach() != 0).double() * (1.0 / (1.0 - 0.25)))  # 0.25 is exact at 2^-24


def test_p_zero_returns_the_input_and_low_precision_keeps_its_dtype():
    x = torch.randn(10)
    assert counter_dropout(x, 0.0) is x
    assert counter_dropout(x, 1e-9) is x  # rounds to 0 at the 2^-24 resolution
    assert counter_dropout(torch.randn(4, 4, dtype=torch.bfloat16), 0.5).dtype == torch.bfloat16


@pytest.mark.parametrize("p", [1.0, -0.1, 1.5, True, "0.1", float("nan")])
def test_bad_p_is_refused(p):
    with pytest.raises(ValueError, match="p must be a number in"):
        counter_dropout(torch.randn(3), p)


def test_bad_tensors_are_refused():
    with pytest.raises(ValueError, match="floating tensor"):
        counter_dropout(torch.ones(3, dtype=torch.long), 0.1)
    with pytest.raises(ValueError, match="int32 index"):
        counter_hash(torch.arange(3), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\(2,\) int32 keys"):
        counter_hash(torch.arange(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32))


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler for Inductor")
def test_compiled_masks_equal_eager_masks_bit_for_bit():
    x = torch.randn(37, 129)
    keys = torch.tensor([-77, 1 << 30], dtype=torch.int32)
    compiled = torch.compile(counter_dropout, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x, 0.1, keys), counter_dropout(x, 0.1, keys))
