"""PrimalFormer / Primal.+ plans: structure, errors, and a few optimisation steps with the KSVD term.

The training check fits a fixed random regression target (a unit test of the optimisation wiring, not a
benchmark): the combined objective task + eta * mean_l J_l^2 must decrease and the KSVD term must be part of it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import primaldual as pd
from primaldual.models.plans import primal_plus, primalformer

DIM, HEADS, N = 16, 2, 21


def test_plans():
    plan = primalformer(3, s=4, eta=0.2)
    assert plan["attention"] == ["primal"] * 3
    assert all(o == {"s": 4, "eta": 0.2} for o in plan["attention_options"])
    plan = primal_plus(2, s=4)
    assert plan["attention"] == ["softmax", "primal"] and plan["attention_options"] == [None, {"s": 4}]
    plan = primal_plus(4, base="linear", primal_layers=(0, -1), base_options={"eps": 1e-5})
    assert plan["attention"] == ["primal", "linear", "linear", "primal"]
    assert plan["attention_options"][1] == {"eps": 1e-5}


def test_plan_errors():
    with pytest.raises(TypeError, match="valid options"):
        primalformer(2, rank=3)
    with pytest.raises(ValueError, match="depth"):
        primalformer(0)
    with pytest.raises(ValueError, match="primal_layers"):
        primal_plus(2, primal_layers=(2,))
    with pytest.raises(ValueError, match="empty"):
        primal_plus(2, primal_layers=())
    with pytest.raises(KeyError, match="registered"):
        primal_plus(2, base="nope")


class _Regressor(nn.Module):
    def __init__(self, plan: dict, depth: int) -> None:
        super().__init__()
        self.encoder = pd.Encoder(DIM, depth, HEADS, **plan)
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x, mask)  # (B, N, DIM)
        m = mask[..., None].to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1))[:, 0]  # mean over real tokens -> (B,)


@pytest.mark.parametrize("which", ["primalformer", "primal_plus"])
def test_models_train_with_ksvd_term(which):
    torch.manual_seed(0)
    depth = 2
    opts = {"s": 4, "rank_multi": 2, "eta": 0.5}
    plan = primalformer(depth, **opts) if which == "primalformer" else primal_plus(depth, **opts)
    model = _Regressor(plan, depth)
    x = torch.randn(8, N, DIM)
    mask = torch.ones(8, N, dtype=torch.bool)
    mask[::2, 15:] = False
    y = torch.randn(8)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    history = []
    for _ in range(40):
        task = (model(x, mask) - y).square().mean()
        ksvd = pd.collect_aux_loss(model)
        assert ksvd is not None and ksvd.requires_grad
        loss = task + ksvd
        history.append((float(loss.detach()), float(ksvd.detach())))
        opt.zero_grad()
        loss.backward()
        for blk in model.encoder.blocks:
            if blk.attention_name == "primal":
                assert blk.attn.lam.grad.abs().sum() > 0  # the KSVD term reaches Lambda
        opt.step()
    assert history[-1][0] < 0.5 * history[0][0], history[::10]
    n_primal = sum(b.attention_name == "primal" for b in model.encoder.blocks)
    assert n_primal == (depth if which == "primalformer" else 1)


def test_ksvd_term_alone_is_driven_down():
    torch.manual_seed(0)
    model = _Regressor(primalformer(2, s=4, rank_multi=2, eta=1.0), 2)
    x, mask = torch.randn(4, N, DIM), torch.ones(4, N, dtype=torch.bool)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        model(x, mask)
        ksvd = pd.collect_aux_loss(model)
        first = float(ksvd.detach()) if first is None else first
        opt.zero_grad()
        ksvd.backward()
        opt.step()
    model(x, mask)
    assert float(pd.collect_aux_loss(model)) < 0.1 * first
