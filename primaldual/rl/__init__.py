"""Offline RL evaluation: gymnasium v4 MuJoCo rollouts of return-conditioned policies and D4RL's normalised score.

gymnasium is imported on first use (the ``rl`` extra); :func:`normalized_score` and the reference constants work
without it. Data: :mod:`primaldual.data.d4rl` (reader) and :mod:`primaldual.recipes.d4rl` (generator);
model: :class:`primaldual.models.DecisionTransformer`. See ``docs/offline_rl.md``.
"""

from .evaluate import (
    ENV_IDS,
    REF_MAX_SCORE,
    REF_MIN_SCORE,
    TARGET_RETURNS,
    env_id,
    env_key,
    evaluate_policy,
    make_env,
    normalized_score,
    require_rl,
)

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
