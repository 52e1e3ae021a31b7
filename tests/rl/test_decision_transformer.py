"""The Decision Transformer on the shared causal encoder: shapes, causality over the (R, s, a) token order, exact
left padding, and the KSVD term of Primal.+DT."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.models import DecisionTransformer

SD, AD, K = 5, 3, 6


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread (several spin-waiting threads are slow on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _inputs(B: int = 2, T: int = K, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(B, T, SD, generator=g)
    actions = torch.rand(B, T, AD, generator=g) * 2 - 1
    rtg = torch.randn(B, T, 1, generator=g)
    timesteps = torch.arange(T).expand(B, T) + torch.tensor([[0], [7]])[:B]
    return states, actions, rtg, timesteps


def _model(plan: str = "softmax", **kw) -> DecisionTransformer:
    opts = pd.primal_plus(2, s=4, eta=0.05, ksvd_reduction="sample") if plan == "primal_plus" else {}
    return DecisionTransformer(SD, AD, max_ep_len=50, context=K, dim=16, depth=2, num_heads=2, **opts, **kw).eval()


PLANS = ["softmax", "primal_plus"]


@pytest.mark.parametrize("plan", PLANS)
def test_shapes_and_range(plan):
    model = _model(plan)
    out = model(*_inputs())
    assert out.shape == (2, K, AD) and out.abs().max() < 1
    assert model(*_inputs(T=3)).shape == (2, 3, AD)  # shorter windows work
    assert _model(plan, action_tanh=False)(*_inputs()).shape == (2, K, AD)
    if plan == "primal_plus":
        assert model.attention_names == ["softmax", "primal"]


@pytest.mark.parametrize("plan", PLANS)
def test_state_token_outputs_equal_the_full_encoder(plan):
    """The forward runs the last block's FFN on the state tokens only: the same actions, gradients and KSVD term as
    the full encoder output read at the state tokens (1, 4, 7, ...)."""
    model = _model(plan)
    s, a, r, ts = _inputs()
    mask = torch.ones(2, K, dtype=torch.bool)
    mask[1, :2] = False
    out = model(s, a, r, ts, mask)
    aux = pd.collect_aux_loss(model)
    grads = torch.autograd.grad(out.pow(2).sum() + (aux if aux is not None else 0.0), list(model.parameters()))
    full = model.encoder.forward
    model.encoder.forward = lambda x, m=None, positions=None: full(x, m)[:, positions]
    ref = model(s, a, r, ts, mask)
    aux_ref = pd.collect_aux_loss(model)
    loss = ref.pow(2).sum() + (aux_ref if aux_ref is not None else 0.0)
    ref_grads = torch.autograd.grad(loss, list(model.parameters()))
    assert torch.allclose(out, ref, atol=1e-6)
    assert all(torch.allclose(g, h, atol=1e-6) for g, h in zip(grads, ref_grads, strict=True))


@pytest.mark.parametrize("plan", PLANS)
def test_causal_over_tokens(plan):
    """Prediction t sees R_<=t, s_<=t, a_<t: changing a_t or anything later leaves predictions <= t unchanged."""
    model = _model(plan)
    s, a, r, ts = _inputs()
    ref = model(s, a, r, ts)
    t = 2
    for which in range(4):
        x = [v.clone() for v in (s, a, r, ts)]
        if which == 3:
            x[3][:, t + 1 :] = 40  # later timesteps
        else:
            x[which][:, t + 1 :] += 5.0  # later states / actions / returns-to-go
        out = model(*x)
        torch.testing.assert_close(out[:, : t + 1], ref[:, : t + 1])
        assert not torch.allclose(out[:, t + 1 :], ref[:, t + 1 :])
    a2 = a.clone()
    a2[:, t] = -a2[:, t]  # the action being predicted is not an input of its own prediction
    out = model(s, a2, r, ts)
    torch.testing.assert_close(out[:, : t + 1], ref[:, : t + 1])
    assert not torch.allclose(out[:, t + 1 :], ref[:, t + 1 :])
    s2 = s.clone()
    s2[:, t] += 1.0  # but the current state is
    assert not torch.allclose(model(s2, a, r, ts)[:, t], ref[:, t])


@pytest.mark.parametrize("plan", PLANS)
def test_left_padding_is_exact(plan):
    """A left-padded window predicts at its real steps what the unpadded window does; pad values do not matter."""
    model = _model(plan)
    s, a, r, ts = _inputs(T=4)
    ref = model(s, a, r, ts)  # (2, 4, AD)
    pad = K - 4

    def left(x, fill):
        return torch.cat([torch.full((2, pad, *x.shape[2:]), fill, dtype=x.dtype), x], 1)

    mask = torch.ones(2, K, dtype=torch.bool)
    mask[:, :pad] = False
    for fill in (0, 3):
        out = model(left(s, fill), left(a, fill), left(r, fill), left(ts, fill), mask)
        torch.testing.assert_close(out[:, pad:], ref, atol=1e-5, rtol=1e-5)
    # get_action pads the same way and returns the last step's prediction
    torch.testing.assert_close(model.get_action(s, a, r, ts), ref[:, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.get_action(s[0], a[0], r[0, :, 0], ts[0]), ref[0, -1], atol=1e-5, rtol=1e-5)
    # histories longer than the context keep the last K steps
    s, a, r, ts = _inputs(T=K + 3)
    torch.testing.assert_close(model.get_action(s, a, r, ts), model(*(x[:, -K:] for x in (s, a, r, ts)))[:, -1])


def test_primal_plus_ksvd_term_and_gradient():
    model = _model("primal_plus").train()
    out = model(*_inputs())
    aux = pd.collect_aux_loss(model)
    assert aux is not None and aux.dim() == 0 and torch.isfinite(aux)
    (out.pow(2).mean() + aux).backward()
    primal = model.encoder.blocks[-1].attn
    assert primal.w_e.grad is not None and primal.w_e.grad.abs().sum() > 0
    assert primal.w_r.grad is not None and primal.w_r.grad.abs().sum() > 0
    model.zero_grad()
    model(*_inputs())
    aux = pd.collect_aux_loss(model)
    aux.backward()  # the KSVD term alone reaches the primal parameters
    assert primal.w_e.grad.abs().sum() > 0
    assert pd.collect_aux_loss(_model("softmax").train()) is None


def test_input_errors():
    model = _model()
    s, a, r, ts = _inputs()
    with pytest.raises(ValueError, match="context is 6"):
        model(*_inputs(T=K + 1))
    with pytest.raises(ValueError, match="timesteps must be in"):
        model(s, a, r, ts + 100)
    with pytest.raises(ValueError, match="actions must have shape"):
        model(s, a[..., :2], r, ts)
    with pytest.raises(ValueError, match="mask must be a torch.bool"):
        model(s, a, r, ts, torch.ones(2, K))
    with pytest.raises(ValueError, match="timesteps must be an int64"):
        model(s, a, r, ts.float())
    with pytest.raises(TypeError, match="dropout"):
        DecisionTransformer(SD, AD, dropout="0.1")


def test_block_options_are_validated():
    with pytest.raises(ValueError, match="init must be one of 'pytorch', 'gpt2'"):
        DecisionTransformer(SD, AD, init="normal")
    with pytest.raises(ValueError, match="activation must be one of 'gelu', 'relu'"):
        DecisionTransformer(SD, AD, activation="swish")
    with pytest.raises(TypeError, match="attn_drop"):
        DecisionTransformer(SD, AD, attn_drop="0.1")
    with pytest.raises(ValueError, match="ffn_drop"):
        DecisionTransformer(SD, AD, ffn_drop=1.0)
    with pytest.raises(ValueError, match="attn_drop must be 0 for primal attention"):
        _model("primal_plus", attn_drop=0.1)


def test_gpt2_init_draws_every_weight_from_gpt2s_distribution():
    torch.manual_seed(0)
    depth, dim = 2, 64
    m = DecisionTransformer(SD, AD, max_ep_len=500, context=K, dim=dim, depth=depth, num_heads=2)
    assert m.init == "gpt2"  # the default
    residual = {f"encoder.blocks.{i}.{n}.weight" for i in range(depth) for n in ("attn.proj", "ffn.net.3")}
    for name, p in m.named_parameters():
        p = p.detach()
        if name.endswith("bias"):
            assert float(p.abs().max()) == 0.0, name
        elif "norm" in name or "_ln" in name:
            assert bool((p == 1).all()), name
        elif p.numel() >= 1000:  # enough draws for the standard deviation to be within 10%
            want = 0.02 / (2 * depth) ** 0.5 if name in residual else 0.02
            assert abs(float(p.std()) / want - 1) < 0.1, (name, float(p.std()), want)
    # PyTorch's defaults are far from it: N(0, 1) timestep table, U(+-1/sqrt(fan_in)) linears with biases
    d = DecisionTransformer(SD, AD, max_ep_len=500, context=K, dim=dim, depth=depth, num_heads=2, init="pytorch")
    assert float(d.embed_timestep.weight.std()) > 0.9 and float(d.embed_state.bias.abs().max()) > 0


@pytest.mark.parametrize("plan", PLANS)
def test_gpt2_init_keeps_the_model_exact(plan):
    """The initialisation changes values, not the computation: padding stays exact and the KSVD term is there."""
    torch.manual_seed(0)
    model = _model(plan, init="gpt2", activation="relu", ffn_drop=0.0)
    assert isinstance(model.encoder.blocks[0].ffn.net[1], torch.nn.ReLU)
    assert model.encoder.blocks[0].ffn.net[2].p == 0.0 and model.encoder.blocks[0].ffn.net[4].p == 0.1
    s, a, r, ts = _inputs(T=4)
    full = model(s, a, r, ts)
    mask = torch.ones(2, K, dtype=torch.bool)
    mask[:, :2] = False

    def pad(x):
        return torch.cat([x.new_zeros((2, 2, *x.shape[2:])), x], 1)

    padded = model(pad(s), pad(a), pad(r), pad(ts), mask)[:, 2:]
    torch.testing.assert_close(padded, full, atol=1e-5, rtol=1e-5)
    if plan == "primal_plus":
        model.train()(s, a, r, ts)
        aux = pd.collect_aux_loss(model)
        assert aux is not None and torch.isfinite(aux)
