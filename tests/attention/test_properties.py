"""Property-based checks (hypothesis): random shapes, masks (all-padding rows included), dtypes and options for
every registered mechanism must keep the invariants the registry-wide tests state on fixed inputs.

Invariants: output shape ``(B, N, C)``; finite outputs and gradients; exact zeros at padded positions and zero
gradient into padded inputs; padding invariance (appended padding changes nothing at real positions) for
padding-exact mechanisms; causal layers never read a later token.
"""

from __future__ import annotations

import pytest
import torch

import primaldual as pd

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NAMES = [i.name for i in pd.list_attentions()]
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@st.composite
def _options(draw: st.DrawFn, name: str, heads: int) -> dict:
    """Mechanism options drawn from their valid ranges."""
    if name == "primal":
        opts = {"s": draw(st.integers(1, 4)), "rank_multi": draw(st.integers(1, 3))}
        opts["padding"] = "exact"
        opts["ksvd_reduction"] = draw(st.sampled_from(["global", "sample"]))
        return opts
    if name == "sparse":
        return {
            "window": draw(st.integers(0, 4)),
            "stride": draw(st.integers(0, 5)),
            "num_global": draw(st.integers(0, 2)),
        }
    opts: dict = {}
    if "bn" in name:
        opts["beta"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
        opts["divide_std"] = draw(st.booleans())
        opts["stats_over"] = draw(st.sampled_from(["tokens", "batch"]))
    if "sh" in name:
        opts["factors"] = draw(st.lists(st.integers(1, 4), min_size=heads, max_size=heads))
        opts["pooling"] = draw(st.sampled_from(["avg", "stride"]))
    if name.startswith("softmax") and "sh" not in name and "bn" not in name:
        opts["backend"] = draw(st.sampled_from(["auto", "eager"]))
    return opts


@st.composite
def _case(draw: st.DrawFn, name: str) -> dict:
    caps = next(i.capabilities for i in pd.list_attentions() if i.name == name)
    causal = draw(st.sampled_from([c for c, ok in ((False, caps.non_causal), (True, caps.causal)) if ok]))
    heads = draw(st.integers(1, 3))
    head_dim = draw(st.integers(1, 4))
    b, n = draw(st.integers(1, 3)), draw(st.integers(1, 12))
    rows = draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=b, max_size=b))
    return {
        "causal": causal,
        "heads": heads,
        "dim": heads * head_dim,
        "mask": torch.tensor(rows, dtype=torch.bool),  # (B, N); all-False rows are fully padded sequences
        "dtype": draw(st.sampled_from([torch.float32, torch.float64])),
        "options": draw(_options(name, heads)),
        "seed": draw(st.integers(0, 2**16)),
    }


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_invariants_on_random_inputs(name, data):
    c = data.draw(_case(name))
    torch.manual_seed(c["seed"])
    dtype, mask = c["dtype"], c["mask"]
    layer = pd.build_attention(name, c["dim"], c["heads"], causal=c["causal"], dtype=dtype, **c["options"]).eval()
    b, n = mask.shape
    x = torch.randn(b, n, c["dim"], dtype=dtype, requires_grad=True)
    out = layer(x, mask)
    assert out.shape == (b, n, c["dim"]) and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert (out[~mask] == 0).all()
    aux = pd.collect_aux_loss(layer)
    (out.square().sum() + (aux if aux is not None else 0.0)).backward()
    assert torch.isfinite(x.grad).all() and (x.grad[~mask] == 0).all()

    tol = 1e-4 if dtype == torch.float32 else 1e-10
    with torch.no_grad():
        xp = torch.cat([x, 50 * torch.randn(b, 3, c["dim"], dtype=dtype)], 1)  # appended padding
        mp = torch.cat([mask, torch.zeros(b, 3, dtype=torch.bool)], 1)
        outp = layer(xp, mp)
        assert torch.allclose(outp[:, :n], out, atol=tol, rtol=tol)
        if c["causal"] and n > 1:
            t = data.draw(st.integers(0, n - 2))
            y = x.detach().clone()
            y[:, t + 1 :] += torch.randn_like(y[:, t + 1 :])
            assert torch.allclose(layer(y, mask)[:, : t + 1], out[:, : t + 1], atol=tol, rtol=tol)
