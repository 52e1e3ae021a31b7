"""The ``rl`` section of task ``offline_rl`` (:attr:`primaldual.tasks.Task.config`): the episode and rollout settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RLConfig"]


@dataclass
class RLConfig:
    """Offline RL (task ``offline_rl``): the Decision Transformer's episode and
    rollout settings. ``max_ep_len``: the model's timestep table and the rollouts' episode cap; ``return_scale``:
    returns-to-go are divided by it; ``target_returns``: the returns the periodic evaluation conditions on (None:
    the reference targets of the environment, e.g. Hopper 3600 / 1800); ``eval_episodes`` per target, seeded
    ``eval_seed + i``; ``action_tanh``: tanh on the predicted actions. The context K is ``data.max_len``."""

    max_ep_len: int = 1000
    return_scale: float = 1000.0
    target_returns: Any = None
    eval_episodes: int = 10
    eval_seed: int = 0
    action_tanh: bool = True
