"""Half-precision softmax attention: the explicit-matrix path computes q k^T in float32 (float16 overflows at inputs
of a few hundred), so outputs stay finite at |x| = 1e3 for every length and match float32 at ordinary inputs."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.functional import softmax_attention


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_large_inputs_stay_finite_at_every_length(dtype, causal):
    torch.manual_seed(0)
    layer = pd.build_attention("softmax", 16, 2, causal=causal).to(dtype)
    for n in [*range(1, 65), 200]:
        x = (torch.randn(2, n, 16) * 1e3).to(dtype)
        mask = torch.ones(2, n, dtype=torch.bool)
        mask[1, : n // 3] = False
        assert torch.isfinite(layer(x, mask)).all(), n


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_half_precision_matches_float32(dtype, tol):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 20, 8, generator=g) for _ in range(3))
    ref, w_ref = softmax_attention(q, k, v, causal=True, need_weights=True)
    out, w = softmax_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True, need_weights=True)
    assert out.dtype == w.dtype == dtype
    assert (out.float() - ref).abs().max() < tol and (w.float() - w_ref).abs().max() < tol


def test_autocast_keeps_the_scores_in_float32():
    g = torch.Generator().manual_seed(2)
    q, k, v = ((torch.randn(1, 2, 10, 8, generator=g) * 300).bfloat16() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = softmax_attention(q, k, v)
    assert torch.isfinite(out).all() and out.dtype == torch.bfloat16
