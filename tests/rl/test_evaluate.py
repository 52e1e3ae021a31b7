"""D4RL's normalised score against the reference constants, and the Decision Transformer rollout loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from primaldual.rl import ENV_IDS, REF_MAX_SCORE, REF_MIN_SCORE, TARGET_RETURNS, env_id, normalized_score

# D4RL's reference scores (d4rl/infos.py; ../shared/reference/benchmarks.md section 3)
REFERENCE = {"halfcheetah": (-280.178953, 12135.0), "hopper": (-20.272305, 3234.3), "walker2d": (1.629008, 4592.3)}


def _need_gym() -> None:
    pytest.importorskip("gymnasium")
    pytest.importorskip("mujoco")


def test_reference_constants():
    assert {k: v[0] for k, v in REFERENCE.items()} == REF_MIN_SCORE
    assert {k: v[1] for k, v in REFERENCE.items()} == REF_MAX_SCORE
    assert ENV_IDS == {"halfcheetah": "HalfCheetah-v4", "hopper": "Hopper-v4", "walker2d": "Walker2d-v4"}
    assert TARGET_RETURNS["hopper"] == (3600.0, 1800.0)


@pytest.mark.parametrize("env", list(REFERENCE))
def test_normalized_score(env):
    lo, hi = REFERENCE[env]
    assert normalized_score(env, lo) == pytest.approx(0.0, abs=1e-12)
    assert normalized_score(env, hi) == pytest.approx(100.0)
    assert normalized_score(env, (lo + hi) / 2) == pytest.approx(50.0)
    mid = 1000.0
    assert normalized_score(env, mid) == pytest.approx(100 * (mid - lo) / (hi - lo))
    arr = normalized_score(env, [lo, hi])
    assert isinstance(arr, np.ndarray) and np.allclose(arr, [0, 100])
    # every spelling of the environment
    for name in (env.upper(), ENV_IDS[env], f"{env}-medium-v2", f"{env}-medium-replay"):
        assert normalized_score(name, mid) == normalized_score(env, mid)
        assert env_id(name) == ENV_IDS[env]


def test_hopper_medium_example():
    # 100 * (2000 + 20.272305) / (3234.3 + 20.272305): a Hopper return of 2000 scores 62.07
    assert normalized_score("hopper", 2000.0) == pytest.approx(62.0749, abs=1e-4)


def test_unknown_env():
    with pytest.raises(ValueError, match="env must be one of halfcheetah, hopper, walker2d"):
        normalized_score("ant", 1.0)
    with pytest.raises(TypeError, match="env must be a string"):
        normalized_score(3, 1.0)


class Recorder(nn.Module):
    """A stub policy: a constant action; records what get_action receives."""

    def __init__(self, act_dim: int, context: int = 4) -> None:
        super().__init__()
        self.context = context
        self.bias = nn.Parameter(torch.zeros(act_dim))
        self.calls: list[tuple[torch.Tensor, ...]] = []

    def get_action(self, states, actions, returns_to_go, timesteps):
        self.calls.append((states.clone(), actions.clone(), returns_to_go.clone(), timesteps.clone()))
        return self.bias.expand(states.shape[0], -1) + 0.1


def test_conditioning_loop():
    """The return-to-go falls by each reward / scale, timesteps count up, states are normalised, K steps kept."""
    _need_gym()
    from primaldual.rl import evaluate_policy, make_env

    model = Recorder(3, context=4)
    mean, std = np.full(11, 0.5, np.float32), np.full(11, 2.0, np.float32)
    res = evaluate_policy(model, "hopper", 3600, 1, 7, mean, std, return_scale=1000.0, max_ep_len=12)
    env = make_env("hopper")
    obs, _ = env.reset(seed=7)
    observed, rewards = [obs], []
    for _ in range(res["lengths"][0]):
        obs, r, term, trunc, _ = env.step(np.full(3, 0.1, np.float32))
        observed.append(obs)
        rewards.append(r)
        if term or trunc:
            break
    assert res["return_mean"] == pytest.approx(sum(rewards))
    assert res["lengths"][0] == len(rewards) == len(model.calls)
    for t, (s, a, rtg, ts) in enumerate(model.calls):
        n = min(t + 1, 4)
        assert s.shape == (1, n, 11) and a.shape == (1, n, 3) and rtg.shape == (1, n) and ts.shape == (1, n)
        assert ts[0].tolist() == list(range(t + 1 - n, t + 1))
        want_rtg = [(3600 - sum(rewards[:j])) / 1000 for j in range(t + 1 - n, t + 1)]
        np.testing.assert_allclose(rtg[0].numpy(), want_rtg, rtol=1e-5)
        np.testing.assert_allclose(s[0, -1].numpy(), (observed[t] - 0.5) / 2.0, rtol=1e-5, atol=1e-6)
        assert torch.all(a[0, -1] == 0) and torch.allclose(a[0, :-1], torch.full((n - 1, 3), 0.1))
    assert res["normalized_score_mean"] == pytest.approx(normalized_score("hopper", res["return_mean"]))


@pytest.fixture
def one_thread():
    """Tiny models step fastest on one thread (several spin-waiting threads are slow on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_evaluate_decision_transformer_is_deterministic(one_thread):
    _need_gym()
    from primaldual.models import DecisionTransformer
    from primaldual.rl import evaluate_policy

    model = DecisionTransformer(11, 3, max_ep_len=50, context=5, dim=16, depth=1, num_heads=2).train()
    kw = dict(state_mean=np.zeros(11), state_std=np.ones(11), max_ep_len=50)
    a = evaluate_policy(model, "hopper", 3600, 2, 3, **kw)
    b = evaluate_policy(model, "hopper", 3600, 2, 3, **kw)
    assert a == b and model.training  # same result, mode restored
    assert len(a["returns"]) == 2 and all(1 <= n <= 50 for n in a["lengths"])
    assert a["return_mean"] == pytest.approx(np.mean(a["returns"])) and a["return_std"] == pytest.approx(
        np.std(a["returns"])
    )
    assert a["normalized_score_mean"] == pytest.approx(float(np.mean(normalized_score("hopper", a["returns"]))))
    assert a["returns"][0] != a["returns"][1]  # different reset seeds
    c = evaluate_policy(model, "hopper", 3600, 2, 3, num_envs=1, **kw)  # one at a time: same episodes
    np.testing.assert_allclose(c["returns"], a["returns"], rtol=1e-4)
    with pytest.raises(ValueError, match="state_mean / state_std must have shape"):
        evaluate_policy(model, "hopper", 3600, 1, 0, state_mean=np.zeros(3), max_ep_len=5)
