"""The functional kernels validate their options as the layers do: ``"false"`` is not a bool, ``"1"`` not a number."""

from __future__ import annotations

import pytest
import torch

from primaldual import functional as F

Q = torch.randn(1, 2, 4, 4)
KERNELS = [(F.softmax_attention, {}), (F.linear_attention, {}), (F.sparse_attention, {"window": 1})]


@pytest.mark.parametrize("kernel,kw", KERNELS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("option", ["causal", "need_weights"])
def test_flags_are_bools_on_every_path(kernel, kw, option):
    """Before: ``causal="false"`` ran causal on the masked / weights paths and hit SDPA's raw error on the others."""
    mask = torch.tensor([[True, True, True, False]])
    for extra in ({}, {"key_mask": mask}):
        with pytest.raises(TypeError, match=rf"{option} must be a bool \(true or false\), got 'false'"):
            kernel(Q, Q, Q, **kw, **extra, **{option: "false"})


@pytest.mark.parametrize(
    "kernel,kw,bad,message",
    [
        (F.softmax_attention, {}, {"scale": "1"}, "scale must be a number"),
        (F.softmax_attention, {}, {"dropout_p": 1.0}, r"dropout_p must be a number in \[0, 1\)"),
        (F.sparse_attention, {"window": 1}, {"scale": float("nan")}, "scale must be a finite number"),
        (F.linear_attention, {}, {"eps": -1.0}, "eps must be a number >= 0"),
        (F.linear_attention, {}, {"chunk_size": 2.0}, "chunk_size must be an int"),
    ],
)
def test_numbers_are_checked(kernel, kw, bad, message):
    with pytest.raises((TypeError, ValueError), match=message):
        kernel(Q, Q, Q, **kw, **bad)


def test_pooling_and_branch_options_name_themselves():
    import primaldual as pd

    with pytest.raises(ValueError, match="factors must be one int >= 1 or a sequence"):
        pd.build_attention("softmax_sh", 12, 3, factors=2.0)
    with pytest.raises(ValueError, match="grid must be None or a pair of ints"):
        pd.build_attention("softmax_sh", 12, 3, grid=(True, 4))
    with pytest.raises(ValueError, match="eps: an option of the primal branch"):
        pd.build_attention("hybrid", 12, 3, causal=True, primal_branch=False, eps=1e-6)
