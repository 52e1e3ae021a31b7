"""``CounterDropout`` is ``nn.Dropout`` eagerly and draws counter-based masks compiled on CPU;
``use_counter_dropout`` swaps exactly the plain ``nn.Dropout`` modules."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from primaldual import CounterDropout, use_counter_dropout
from primaldual.functional.dropout import counter_dropout, dropout_keys


def test_eagerly_it_is_nn_dropout():
    x = torch.randn(8, 16)
    torch.manual_seed(0)
    want = nn.Dropout(0.3)(x)
    torch.manual_seed(0)
    assert torch.equal(CounterDropout(0.3)(x), want)
    assert torch.equal(CounterDropout(0.3).eval()(x), x)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler for Inductor")
def test_compiled_on_cpu_it_draws_the_counter_mask_from_torch_generator():
    x = torch.randn(6, 50)
    layer = CounterDropout(0.2)
    compiled = torch.compile(layer, options={"fallback_random": True})
    torch.manual_seed(5)
    got = compiled(x)
    torch.manual_seed(5)
    assert torch.equal(got, counter_dropout(x, 0.2, dropout_keys()))
    assert torch.equal(torch.compile(CounterDropout(0.2).eval())(x), x)


class _MyDropout(nn.Dropout):
    pass


def test_use_counter_dropout_swaps_plain_dropout_only():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Sequential(nn.Dropout(0.5, inplace=True)), _MyDropout())
    model.eval()
    before = model.state_dict()
    assert use_counter_dropout(model) == 2
    assert type(model[1]) is CounterDropout and model[1].p == 0.1 and not model[1].training
    assert type(model[2][0]) is CounterDropout and model[2][0].inplace
    assert type(model[3]) is _MyDropout
    assert model.state_dict().keys() == before.keys()
    assert use_counter_dropout(model) == 0
