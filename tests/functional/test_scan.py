"""The chunked prefix sum (the causal primal layer's scan on a GPU) against ``torch.cumsum``, values and gradients."""

from __future__ import annotations

import pytest
import torch

from primaldual.functional.primal import causal_prefix_mean
from primaldual.functional.scan import prefix_sum
from tests.conftest import rel_err


@pytest.mark.parametrize("n", [1, 3, 4, 5, 15, 16, 17, 63, 64, 65, 200])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_chunked_equals_cumsum_with_gradients(n, shape):
    """Chunk 4: N = 200 takes three levels; lengths on, below and above chunk boundaries; any trailing dims."""
    torch.manual_seed(0)
    x = torch.randn(2, n, *shape, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, n, *shape, dtype=torch.float64)
    ref = x.cumsum(1)
    (gref,) = torch.autograd.grad(ref, x, g)
    out = prefix_sum(x, chunked=True, chunk=4)
    (gout,) = torch.autograd.grad(out, x, g)
    assert out.shape == ref.shape
    assert rel_err(out, ref) < 1e-13
    assert rel_err(gout, gref) < 1e-13


def test_default_chunking_follows_the_device():
    x = torch.randn(2, 300, 5, dtype=torch.float64)
    assert torch.equal(prefix_sum(x), x.cumsum(1))  # CPU: one plain scan
    assert rel_err(prefix_sum(x, chunked=True), x.cumsum(1)) < 1e-13


def test_half_inputs_are_summed_in_float32():
    """A 4096-token running sum of ones: bfloat16 stalls at 256 (its spacing there is 2), float32 is exact."""
    x = torch.ones(1, 4096, 2, dtype=torch.bfloat16)
    for chunked in (False, True):
        out = prefix_sum(x, chunked=chunked)
        assert out.dtype == torch.float32
        assert torch.equal(out[0, :, 0], torch.arange(1, 4097, dtype=torch.float32))
    mean = causal_prefix_mean(x + torch.linspace(0, 1, 4096, dtype=torch.bfloat16)[None, :, None])
    ref = causal_prefix_mean(x.double() + torch.linspace(0, 1, 4096, dtype=torch.bfloat16)[None, :, None].double())
    assert mean.dtype == torch.bfloat16
    assert rel_err(mean.double(), ref) < 1e-2  # bfloat16 rounding of the result only


def test_masked_prefix_mean_unchanged_by_chunking(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(3, 70, 2, 4, dtype=torch.float64)
    mask = torch.rand(3, 70) > 0.3
    mask[2] = False
    plain = causal_prefix_mean(x, mask)
    import primaldual.functional.primal as fp

    monkeypatch.setattr(fp, "prefix_sum", lambda t: prefix_sum(t, chunked=True, chunk=8))
    chunked = causal_prefix_mean(x, mask)
    assert rel_err(chunked, plain) < 1e-13
    assert not chunked[2].any()


@pytest.mark.parametrize(
    "kwargs,match",
    [({"x": torch.ones(4)}, "x: expected"), ({"x": torch.ones(2, 3), "chunk": 1}, "chunk: expected")],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        prefix_sum(**kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_chunked_scan_matches_cpu_cumsum():
    torch.manual_seed(0)
    x = torch.randn(1, 65536 + 7, 12, dtype=torch.float64)
    ref = x.cumsum(1)
    out = prefix_sum(x.to("cuda", torch.float32)).cpu()
    assert rel_err(out.double(), ref) < 1e-5
