"""Hugging Face's DecisionTransformerModel as a peer of our DT in task ``offline_rl`` (``model.kind: hf_dt``): built
from our sizes, our interface (forward, get_action, left padding), inapplicable options refused, a tiny fit through
the same loop with a short rollout, and a resume that equals an uninterrupted run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from primaldual.cli import main
from primaldual.train.config import ConfigError, load_config

from .test_train import _config, hopper_dir  # noqa: F401  (hopper_dir: a fixture)

pytest.importorskip("transformers")
pytest.importorskip("h5py")
pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
peers = pytest.importorskip("primaldual.integrations.hf.peers")

SIZES = {"dim": 16, "depth": 2, "num_heads": 2, "ffn_dim": 40, "dropout": 0.1}


def _inputs(b: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, k, 11, generator=g),
        torch.rand(b, k, 3, generator=g) * 2 - 1,
        torch.randn(b, k, 1, generator=g),
        torch.randint(0, 50, (b, k), generator=g),
    )


def test_hf_dt_builds_at_our_sizes():
    m = peers.HFDecisionTransformer(11, 3, max_ep_len=50, context=5, **SIZES)
    c = m.model.config
    assert (c.state_dim, c.act_dim, c.hidden_size, c.n_layer, c.n_head, c.n_inner) == (11, 3, 16, 2, 2, 40)
    assert (c.max_ep_len, c.action_tanh, c.n_positions) == (50, True, 15)
    assert (c.resid_pdrop, c.embd_pdrop, c.attn_pdrop, c.activation_function) == (0.1, 0.1, 0.1, "relu")
    assert m.context == 5 and m.max_ep_len == 50
    from primaldual.models import DecisionTransformer

    ours = DecisionTransformer(11, 3, max_ep_len=50, context=5, **SIZES)
    # ours + the state and return heads, the (3K, dim) position table and the one-row token table, all unused
    extra = (16 * 11 + 11) + (16 + 1) + 15 * 16 + 16
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in ours.parameters()) + extra


def test_hf_dt_forward_and_get_action_follow_our_dt():
    torch.manual_seed(0)
    m = peers.HFDecisionTransformer(11, 3, max_ep_len=50, context=5, **SIZES).eval()
    s, a, r, t = _inputs(2, 5)
    pred = m(s, a, r, t)
    assert pred.shape == (2, 5, 3) and bool((pred.abs() < 1).all())  # tanh actions
    # left padding, masked, leaves the real steps' predictions unchanged (position ids are all 0 in HF's DT)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[:, :2] = False
    junk = [x.clone() for x in (s, a, r)]
    for x in junk:
        x[:, :2] = 7.0
    torch.testing.assert_close(
        m(*junk, t, mask)[:, 2:], m(s[:, 2:], a[:, 2:], r[:, 2:], t[:, 2:]), atol=1e-5, rtol=1e-5
    )
    # the action at step t does not see a_t or later
    a2 = a.clone()
    a2[:, 3:] = -a2[:, 3:]
    torch.testing.assert_close(m(s, a2, r, t)[:, :4], pred[:, :4])
    # get_action: a short history is left-padded to the context, a long one cut to it
    short = m.get_action(s[0, :3], a[0, :3], r[0, :3, 0], t[0, :3])
    torch.testing.assert_close(short, m(s[:1, :3], a[:1, :3], r[:1, :3], t[:1, :3])[0, -1])
    long_s, long_a, long_r, long_t = _inputs(2, 8, seed=1)
    torch.testing.assert_close(
        m.get_action(long_s, long_a, long_r, long_t), m(*(x[:, -5:] for x in _inputs(2, 8, seed=1)))[:, -1]
    )
    with pytest.raises(ValueError, match="timesteps must be in"):
        m(s, a, r, t + 50)
    with pytest.raises(ValueError, match="mask must be a torch.bool"):
        m(s, a, r, t, torch.ones(2, 5))


def test_hf_dt_gradients_skip_padded_steps():
    m = peers.HFDecisionTransformer(11, 3, max_ep_len=50, context=5, **SIZES).train()
    s, a, r, t = _inputs(2, 5)
    s.requires_grad_(True)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, :3] = False
    loss = ((m(s, a, r, t, mask) - a) ** 2)[mask].mean()
    loss.backward()
    assert torch.isfinite(s.grad).all() and float(s.grad[0, :3].abs().max()) == 0.0
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_hf_dt_config_sits_beside_dt_and_refuses_what_it_does_not_use():
    ours, peer = load_config("rl/hopper-medium/dt"), load_config("rl/hopper-medium/hf_dt")
    assert peer.name == "hf_dt" and peer.model.kind == "hf_dt" and peer.model.attention == "softmax"
    a, b = ours.to_dict(), peer.to_dict()
    for d in (a, b):
        d.pop("name")
        d["model"].pop("kind")
    assert a == b  # the same sizes, data, optimiser, schedule, steps and rollouts
    with pytest.raises(ConfigError, match="model.kind 'hf_dt' is Hugging Face's DecisionTransformerModel"):
        load_config("rl/hopper-medium/hf_dt", ["--model.attention", "primal"])
    with pytest.raises(ConfigError, match="attention_options null"):
        load_config("rl/hopper-medium/hf_dt", ["--model.attention_options", "{backend: eager}"])
    with pytest.raises(ConfigError, match="model.kind: 'hf_dt' does not fit task 'lm'"):
        load_config("lm/english/reduced/transformer", ["--model.kind", "hf_dt"])


def _fit(tmp_path, root, run_dir, **changes) -> int:
    model = {"kind": "hf_dt", **changes.pop("model", {})}
    path = _config(tmp_path, root, model=model, **changes)
    return main(["fit", "--threads", "1", "--config", path, "--run-dir", str(run_dir)])


def test_hf_dt_fits_with_the_same_loop_and_rolls_out(tmp_path, hopper_dir):  # noqa: F811
    run = tmp_path / "run"
    assert _fit(tmp_path, hopper_dir, run) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["task"] == "offline_rl" and s["steps"] == 2 and s["evaluations"] == 2
    assert np.isfinite(s["normalized_score_mean"]) and s["eval_episodes"] == 1
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert any(k.startswith("model.model.encoder.h.0.attn.c_attn") for k in state["state_dict"])
    # the trained weights roll out again through evaluate_policy (one short episode)
    from primaldual.rl import evaluate_policy
    from primaldual.tasks.offline_rl.training import load_policy

    m, mean, std = load_policy(run)
    assert isinstance(m, peers.HFDecisionTransformer) and list(mean) == pytest.approx(s["state_mean"])
    res = evaluate_policy(m, "hopper", 3600.0, episodes=1, seed=0, state_mean=mean, state_std=std, max_ep_len=5)
    assert 1 <= res["length_mean"] <= 5 and np.isfinite(res["return_mean"])


def test_hf_dt_resume_equals_an_uninterrupted_run(tmp_path, hopper_dir):  # noqa: F811
    run = tmp_path / "run"
    assert _fit(tmp_path, hopper_dir, run, trainer={"max_steps": 1}) == 0
    cfg_path = run / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["trainer"]["max_steps"] = 2
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # as if the run had been started with 2 steps
    assert main(["fit", "--threads", "1", "--config", str(cfg_path), "--run-dir", str(run)]) == 0
    resumed = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    fresh = tmp_path / "fresh"
    assert _fit(tmp_path, hopper_dir, fresh) == 0
    straight = torch.load(fresh / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 2
    for k, v in straight["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][k], v)


def test_hf_dt_falls_back_to_eager_attention_where_sdpa_is_refused(monkeypatch):
    """Releases of transformers that refuse SDPA for DecisionTransformerModel (5.17) get its eager attention: the
    same predictions from the same weights, and the model says which one it runs."""
    torch.manual_seed(0)
    sdpa = peers.HFDecisionTransformer(11, 3, context=4, dim=16, depth=2, num_heads=2, dropout=0.0).eval()
    real = peers.DecisionTransformerModel

    def refusing(config):
        if config._attn_implementation == "sdpa":
            raise ValueError(
                "DecisionTransformerModel does not support an attention implementation through "
                "torch.nn.functional.scaled_dot_product_attention yet."
            )
        return real(config)

    monkeypatch.setattr(peers, "DecisionTransformerModel", refusing)
    eager = peers.HFDecisionTransformer(11, 3, context=4, dim=16, depth=2, num_heads=2, dropout=0.0).eval()
    assert (sdpa.attn_implementation, eager.attn_implementation) == ("sdpa", "eager")
    eager.load_state_dict(sdpa.state_dict())
    x = _inputs(2, 4)
    assert torch.allclose(sdpa(*x), eager(*x), atol=1e-5)

    def other(config):
        raise ValueError("something else")

    monkeypatch.setattr(peers, "DecisionTransformerModel", other)
    with pytest.raises(ValueError, match="something else"):
        peers.HFDecisionTransformer(11, 3, context=4, dim=16, depth=2, num_heads=2)


def _hf_weights_in_ours(peer) -> dict[str, torch.Tensor]:
    """The peer's weights under our DT's names. GPT-2's Conv1D stores ``(in, out)``: transposed. Every token gets
    position id 0, so the position table adds one constant row after ``embed_ln``: folded into its bias."""
    g, e = peer.model, peer.model.encoder
    sd = {
        f"{k}.{n}": p
        for k in ("embed_timestep", "embed_return", "embed_state", "embed_action", "embed_ln")
        for n, p in getattr(g, k).named_parameters()
    }
    sd["embed_ln.bias"] = sd["embed_ln.bias"] + e.wpe.weight[0]
    for i, b in enumerate(e.h):
        pre = f"encoder.blocks.{i}."
        for ours, (mod, transpose) in {
            "attn.qkv": (b.attn.c_attn, True),
            "attn.proj": (b.attn.c_proj, True),
            "norm1": (b.ln_1, False),
            "norm2": (b.ln_2, False),
            "ffn.net.0": (b.mlp.c_fc, True),
            "ffn.net.3": (b.mlp.c_proj, True),
        }.items():
            sd[pre + ours + ".weight"] = mod.weight.T if transpose else mod.weight
            sd[pre + ours + ".bias"] = mod.bias
    sd.update({"encoder.norm.weight": e.ln_f.weight, "encoder.norm.bias": e.ln_f.bias})
    sd.update(
        {"predict_action.0.weight": g.predict_action[0].weight, "predict_action.0.bias": g.predict_action[0].bias}
    )
    return {k: v.detach().clone() for k, v in sd.items()}


def test_our_dt_with_the_peers_block_is_the_peer_weight_for_weight():
    """``init="gpt2", activation="relu", attn_drop=dropout, ffn_drop=0`` is Hugging Face's DecisionTransformerModel:
    with its weights copied across, the same actions and the same gradients (float64, left padding included); its
    initialisation draws from the same distributions."""
    from primaldual.models import DecisionTransformer

    torch.manual_seed(0)
    peer = peers.HFDecisionTransformer(11, 3, max_ep_len=50, context=5, **SIZES).double().eval()
    same = {"init": "gpt2", "activation": "relu", "attn_drop": SIZES["dropout"], "ffn_drop": 0.0}
    ours = DecisionTransformer(11, 3, max_ep_len=50, context=5, **SIZES, **same).double().eval()
    ours.load_state_dict(_hf_weights_in_ours(peer), strict=True)
    s, a, r, t = (x.double() if x.is_floating_point() else x for x in _inputs(3, 5))
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[0, :2] = False
    want, got = peer(s, a, r, t, mask), ours(s, a, r, t, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-12, rtol=1e-12)
    ((want - a) ** 2)[mask].mean().backward()
    ((got - a) ** 2)[mask].mean().backward()
    theirs = {k: p.grad for k, p in peer.model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(ours.embed_state.weight.grad, theirs["embed_state.weight"], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(
        ours.encoder.blocks[1].attn.qkv.weight.grad, theirs["encoder.h.1.attn.c_attn.weight"].T, atol=1e-12, rtol=1e-12
    )
    torch.testing.assert_close(
        ours.encoder.blocks[0].ffn.net[0].weight.grad, theirs["encoder.h.0.mlp.c_fc.weight"].T, atol=1e-12, rtol=1e-12
    )
    # their dropout sites: embeddings, attention weights, after attention, after the MLP (none inside it)
    blk = ours.encoder.blocks[0]
    assert (ours.drop.p, blk.attn.attn_drop) == (0.1, 0.1)
    assert (blk.drop.p, blk.ffn.net[2].p, blk.ffn.net[4].p) == (0.1, 0.0, 0.1)
    big = {"dim": 64, "depth": 2, "num_heads": 2, "ffn_dim": 128}
    fresh = peers.HFDecisionTransformer(11, 3, max_ep_len=500, context=5, **big).model
    mine = DecisionTransformer(11, 3, max_ep_len=500, context=5, **big, **same)
    for theirs_w, ours_w in (
        (fresh.embed_timestep.weight, mine.embed_timestep.weight),
        (fresh.encoder.h[0].attn.c_attn.weight, mine.encoder.blocks[0].attn.qkv.weight),
        (fresh.encoder.h[1].mlp.c_proj.weight, mine.encoder.blocks[1].ffn.net[3].weight),
    ):
        assert abs(float(theirs_w.std()) / float(ours_w.std()) - 1) < 0.1


def test_hf_dt_refuses_our_block_options():
    for key, value in (("activation", "relu"), ("attn_drop", "0.1"), ("ffn_drop", "0.0")):
        with pytest.raises(ConfigError, match=f"model.{key}: model.kind 'hf_dt' is Hugging Face's"):
            load_config("rl/hopper-medium/hf_dt", [f"--model.{key}", value])
    # the shipped DT configs start from GPT-2's initialisation, which is what transformers gives the peer; the
    # schema's `pytorch` is what the peer's run directories from before that default hold
    assert load_config("rl/hopper-medium/hf_dt").model.init == "gpt2"
    assert load_config("rl/hopper-medium/hf_dt", ["--model.init", "pytorch"]).model.init == "pytorch"
    assert load_config("rl/hopper-medium/dt").model.init == "gpt2"
    cfg = load_config("rl/hopper-medium/dt", ["--model.activation", "relu", "--model.attn_drop", "0.1"])
    assert (cfg.model.init, cfg.model.activation, cfg.model.attn_drop, cfg.model.ffn_drop) == (
        "gpt2",
        "relu",
        0.1,
        None,
    )
    with pytest.raises(ConfigError, match="model.attn_drop: a primal layer forms no attention matrix"):
        load_config("rl/hopper-medium/primal_plus", ["--model.attn_drop", "0.1"])
    with pytest.raises(ConfigError, match="model.init must be one of 'pytorch', 'gpt2'"):
        load_config("rl/hopper-medium/dt", ["--model.init", "xavier"])
    assert load_config("lm/english/reduced/transformer", ["--model.init", "gpt2"]).model.init == "gpt2"  # an LM key too
    with pytest.raises(ConfigError, match="model.init: model.kind 'hf_gpt2' is initialised by transformers"):
        load_config("lm/english/reduced/hf_gpt2", ["--model.init", "gpt2"])
    with pytest.raises(ConfigError, match="model.init: only task 'lm' / 'offline_rl' uses it"):
        load_config("uea/default", ["--model.init", "gpt2"])
