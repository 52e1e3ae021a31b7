"""Online evaluation of return-conditioned policies in gymnasium MuJoCo environments, and D4RL's normalised score.

* :func:`normalized_score` is D4RL's ``100 * (return - ref_min) / (ref_max - ref_min)`` with D4RL's reference
  scores per environment (the same for every dataset of an environment: random-policy and expert returns).
* :func:`evaluate_policy` runs the Decision Transformer conditioning loop (Chen et al. 2021): the model is asked
  for an action given the last ``context`` steps of (return-to-go, state, action); after each step the
  return-to-go is decremented by the reward (both scaled by ``return_scale``). Episodes run in lockstep in a
  batch of environments (one model forward per time step for all of them), episode ``i`` reset with seed
  ``seed + i``: for a given seed the result is the same on every call.

The environments are gymnasium's **v4** MuJoCo tasks (``HalfCheetah-v4``, ``Hopper-v4``, ``Walker2d-v4``), which
have D4RL's models and observation sizes (17 / 11 / 17). gymnasium is imported on first use only (the ``rl``
extra); :func:`normalized_score` works without it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..options import check_int, check_number

__all__ = [
    "ENV_IDS",
    "REF_MAX_SCORE",
    "REF_MIN_SCORE",
    "TARGET_RETURNS",
    "env_id",
    "env_key",
    "evaluate_policy",
    "make_env",
    "normalized_score",
    "require_rl",
]

ENV_IDS: dict[str, str] = {"halfcheetah": "HalfCheetah-v4", "hopper": "Hopper-v4", "walker2d": "Walker2d-v4"}
# D4RL's reference scores (d4rl/infos.py, REF_MIN_SCORE / REF_MAX_SCORE), identical for every dataset of an env
REF_MIN_SCORE: dict[str, float] = {"halfcheetah": -280.178953, "hopper": -20.272305, "walker2d": 1.629008}
REF_MAX_SCORE: dict[str, float] = {"halfcheetah": 12135.0, "hopper": 3234.3, "walker2d": 4592.3}
# the Decision Transformer's evaluation targets (returns to condition on), high and low
TARGET_RETURNS: dict[str, tuple[float, float]] = {
    "halfcheetah": (12000.0, 6000.0),
    "hopper": (3600.0, 1800.0),
    "walker2d": (5000.0, 2500.0),
}

RL_EXTRA_HINT = "install the rl extra: pip install 'gymnasium[mujoco]' stable-baselines3 h5py (or -e '.[rl]')"


def require_rl(*modules: str) -> None:
    """Raise ``ModuleNotFoundError`` naming the ``rl`` extra when one of ``modules`` cannot be imported."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(f"{', '.join(missing)} not installed: {RL_EXTRA_HINT}")


def env_key(env: str) -> str:
    """The short environment name (``hopper``) of ``env``: a short name, a gymnasium id (``Hopper-v4``) or a D4RL
    dataset name (``hopper-medium-v2``), case-insensitive."""
    if not isinstance(env, str):
        raise TypeError(f"env must be a string such as 'hopper' or 'Hopper-v4', got {env!r}")
    low = env.lower()
    for key in ENV_IDS:
        if low == key or low.startswith(key + "-"):
            return key
    raise ValueError(f"env must be one of {', '.join(ENV_IDS)} (or their gymnasium v4 ids), got {env!r}")


def env_id(env: str) -> str:
    """The gymnasium id (``Hopper-v4``) of ``env`` (see :func:`env_key`)."""
    return ENV_IDS[env_key(env)]


def normalized_score(env: str, ret: float | np.ndarray | Sequence[float]) -> float | np.ndarray:
    """D4RL's normalised score ``100 * (ret - ref_min) / (ref_max - ref_min)`` of the raw return(s) ``ret``.

    0 is the random policy's return, 100 D4RL's expert's. A float for a number, an array for an array.
    """
    key = env_key(env)
    lo, hi = REF_MIN_SCORE[key], REF_MAX_SCORE[key]
    if isinstance(ret, (int, float)) and not isinstance(ret, bool):
        return 100.0 * (float(ret) - lo) / (hi - lo)
    return 100.0 * (np.asarray(ret, dtype=np.float64) - lo) / (hi - lo)


def make_env(env: str, **kwargs: Any):
    """``gymnasium.make`` of the v4 environment of ``env`` (gymnasium's v4 deprecation notice silenced)."""
    require_rl("gymnasium", "mujoco")
    import gymnasium as gym

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is out of date.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return gym.make(env_id(env), **kwargs)


def _model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def evaluate_policy(
    model: nn.Module,
    env: str,
    target_return: float,
    episodes: int = 10,
    seed: int = 0,
    state_mean: np.ndarray | Sequence[float] | None = None,
    state_std: np.ndarray | Sequence[float] | None = None,
    return_scale: float = 1000.0,
    max_ep_len: int = 1000,
    device: torch.device | str | None = None,
    *,
    num_envs: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Roll out a return-conditioned policy for ``episodes`` episodes and score it.

    Args:
        model: has ``get_action(states, actions, returns_to_go, timesteps)`` taking ``(E, T, ...)`` histories and
            returning ``(E, act_dim)`` actions (:class:`~primaldual.models.DecisionTransformer`). Run in eval
            mode under ``torch.no_grad``; its train / eval mode is restored afterwards.
        env: ``halfcheetah``, ``hopper``, ``walker2d`` (or ``Hopper-v4``, ``hopper-medium-v2``, ...).
        target_return: the return to condition on, unscaled (e.g. 3600 for Hopper).
        episodes: number of episodes; episode ``i`` is reset with seed ``seed + i``.
        seed: see ``episodes``.
        state_mean, state_std: the dataset's state statistics (states are fed as ``(s - mean) / std``); None
            means 0 / 1.
        return_scale: returns-to-go are divided by it (1000 for the MuJoCo tasks, as in training).
        max_ep_len: an episode stops after this many steps (the environments' own limit is 1000).
        device: where the model runs (default: where its parameters are).
        num_envs: episodes run in lockstep (default: all of them at once).
        progress: called with 1 after each finished episode (for a progress bar).

    Returns:
        ``return_mean``, ``return_std``, ``normalized_score_mean``, ``normalized_score_std``, ``length_mean``,
        ``length_std`` (population std, as the DT code reports), the per-episode ``returns``,
        ``normalized_scores`` and ``lengths``, and ``env``, ``env_id``, ``target_return``, ``episodes``, ``seed``,
        ``return_scale``, ``max_ep_len``, ``gymnasium_version``.
    """
    key = env_key(env)
    check_number("target_return", target_return)
    check_int("episodes", episodes, low=1)
    check_int("seed", seed, low=0)
    check_number("return_scale", return_scale, low=0.0, low_open=True)
    check_int("max_ep_len", max_ep_len, low=1)
    check_int("num_envs", num_envs, low=1, allow_none=True)
    if not callable(getattr(model, "get_action", None)):
        raise TypeError(f"model must have a get_action(states, actions, returns_to_go, timesteps) method: {model!r}")
    require_rl("gymnasium", "mujoco")
    import gymnasium as gym

    device = torch.device(device) if device is not None else _model_device(model)
    E = min(num_envs or episodes, episodes)
    envs = [make_env(key) for _ in range(E)]
    sd = envs[0].observation_space.shape[0]
    ad = envs[0].action_space.shape[0]
    low, high = envs[0].action_space.low, envs[0].action_space.high
    mean = torch.zeros(sd) if state_mean is None else torch.as_tensor(np.asarray(state_mean), dtype=torch.float32)
    std = torch.ones(sd) if state_std is None else torch.as_tensor(np.asarray(state_std), dtype=torch.float32)
    if mean.shape != (sd,) or std.shape != (sd,):
        raise ValueError(
            f"state_mean / state_std must have shape ({sd},), got {tuple(mean.shape)} / {tuple(std.shape)}"
        )
    mean, std = mean.to(device), std.to(device)
    context = int(getattr(model, "context", max_ep_len))
    returns, lengths = [], []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, episodes, E):
            n = min(E, episodes - start)
            seeds = [seed + start + i for i in range(n)]
            rets, lens = _rollout_batch(
                model,
                envs[:n],
                seeds,
                target_return,
                mean=mean,
                std=std,
                scale=return_scale,
                max_ep_len=max_ep_len,
                context=context,
                device=device,
                act_dim=ad,
                low=low,
                high=high,
                progress=progress,
            )
            returns.extend(rets)
            lengths.extend(lens)
    finally:
        model.train(was_training)
        for e in envs:
            e.close()
    r = np.asarray(returns, dtype=np.float64)
    s = np.asarray(normalized_score(key, r), dtype=np.float64)
    ln = np.asarray(lengths, dtype=np.float64)
    return {
        "env": key,
        "env_id": ENV_IDS[key],
        "target_return": float(target_return),
        "episodes": episodes,
        "seed": seed,
        "return_scale": float(return_scale),
        "max_ep_len": max_ep_len,
        "return_mean": float(r.mean()),
        "return_std": float(r.std()),
        "normalized_score_mean": float(s.mean()),
        "normalized_score_std": float(s.std()),
        "length_mean": float(ln.mean()),
        "length_std": float(ln.std()),
        "returns": r.tolist(),
        "normalized_scores": s.tolist(),
        "lengths": [int(v) for v in lengths],
        "gymnasium_version": gym.__version__,
    }


def _rollout_batch(
    model: nn.Module,
    envs: list,
    seeds: list[int],
    target_return: float,
    *,
    mean: torch.Tensor,
    std: torch.Tensor,
    scale: float,
    max_ep_len: int,
    context: int,
    device: torch.device,
    act_dim: int,
    low: np.ndarray,
    high: np.ndarray,
    progress: Callable[[int], None] | None,
) -> tuple[list[float], list[int]]:
    """Run ``len(envs)`` episodes in lockstep; histories keep the last ``context`` steps only."""
    E = len(envs)
    obs = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds)]).astype(np.float32)  # (E, sd)
    states = torch.from_numpy(obs).to(device)[:, None]  # (E, 1, sd), raw
    actions = torch.zeros(E, 0, act_dim, device=device)
    rtg = torch.full((E, 1), target_return / scale, device=device)  # (E, T) scaled return-to-go
    timesteps = torch.zeros(E, 1, dtype=torch.long, device=device)
    alive = np.ones(E, dtype=bool)
    ep_return = np.zeros(E, dtype=np.float64)
    ep_len = np.zeros(E, dtype=np.int64)
    for t in range(max_ep_len):
        actions = torch.cat([actions, torch.zeros(E, 1, act_dim, device=device)], 1)
        idx = torch.from_numpy(np.flatnonzero(alive)).to(device)
        a = model.get_action(((states - mean) / std)[idx], actions[idx], rtg[idx], timesteps[idx])  # (A, ad)
        actions[idx, -1] = a.to(actions.dtype)
        a_np = np.clip(a.float().cpu().numpy(), low, high)
        new_obs = np.zeros_like(obs)
        rewards = np.zeros(E, dtype=np.float64)
        for j, i in enumerate(np.flatnonzero(alive)):
            o, r, terminated, truncated, _ = envs[i].step(a_np[j])
            new_obs[i], rewards[i] = o, r
            ep_return[i] += r
            ep_len[i] += 1
            if terminated or truncated:
                alive[i] = False
                if progress is not None:
                    progress(1)
        if not alive.any() or t == max_ep_len - 1:
            break
        states = torch.cat([states, torch.from_numpy(new_obs).to(device)[:, None]], 1)[:, -context:]
        rew = torch.from_numpy(rewards).to(device=device, dtype=rtg.dtype)
        rtg = torch.cat([rtg, (rtg[:, -1] - rew / scale)[:, None]], 1)[:, -context:]
        timesteps = torch.cat([timesteps, torch.full((E, 1), t + 1, dtype=torch.long, device=device)], 1)[:, -context:]
        actions = actions[:, -(context - 1) :] if context > 1 else actions[:, :0]
    if progress is not None:
        for _ in range(int(alive.sum())):  # episodes that ran to max_ep_len
            progress(1)
    return [float(v) for v in ep_return], [int(v) for v in ep_len]
