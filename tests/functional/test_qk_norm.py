"""The query / key RMS norms against their formula, x * rsqrt(mean(x^2) + eps) * g, per head and over all heads."""

from __future__ import annotations

import pytest
import torch

from primaldual.functional.qk_norm import qk_rms_norm
from tests.conftest import rel_err


def _formula(t: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """The norm over the last dimension of ``t`` ``(..., F)``, in float64."""
    t = t.double()
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * g.double()


def test_per_head_norm_is_the_formula_on_each_head():
    torch.manual_seed(0)
    t, g = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.rand(4, dtype=torch.float64) + 0.5
    assert rel_err(qk_rms_norm(t, g, 1e-6, "head"), _formula(t, g, 1e-6)) < 1e-14


def test_all_heads_norm_is_the_formula_on_each_tokens_heads_together():
    torch.manual_seed(1)
    B, H, N, D = 2, 3, 5, 4
    t, g = torch.randn(B, H, N, D, dtype=torch.float64), torch.rand(H * D, dtype=torch.float64) + 0.5
    flat = t.transpose(1, 2).reshape(B, N, H * D)  # (B, N, H*D): a token's heads side by side
    want = _formula(flat, g, 1e-5).view(B, N, H, D).transpose(1, 2)  # (B, H, N, D)
    assert rel_err(qk_rms_norm(t, g, 1e-5, "all_heads"), want) < 1e-14


def test_eps_matters_for_small_inputs():
    t, g = torch.full((1, 1, 1, 4), 1e-3, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    out = qk_rms_norm(t, g, 1e-6, "head")  # mean square 1e-6 equals eps: 1/sqrt(2) of the unit norm
    assert torch.allclose(out, torch.full_like(out, 2**-0.5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_are_normalised_in_float32_and_returned_in_their_dtype(dtype):
    torch.manual_seed(2)
    t, g = (torch.randn(1, 2, 3, 8) * 300).to(dtype), torch.rand(8) + 0.5
    out = qk_rms_norm(t, g.to(dtype), 1e-6, "head")
    assert out.dtype == dtype
    want = _formula(t.float(), g.to(dtype).float(), 1e-6).to(dtype)  # one rounding, at the end
    assert torch.equal(out, want)


def test_an_unknown_kind_is_named():
    with pytest.raises(ValueError, match="kind must be one of"):
        qk_rms_norm(torch.ones(1, 1, 1, 4), torch.ones(4), 1e-6, "heads")
