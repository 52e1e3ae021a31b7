"""Offline RL's environments: gymnasium v4 MuJoCo rollouts of a return-conditioned policy, scored by D4RL's
normalised score (:mod:`.evaluate`). Training is task ``offline_rl`` (:mod:`primaldual.tasks.offline_rl`, the
shared runner); the model is :mod:`primaldual.models.decision_transformer`.

gymnasium is imported on first use (the ``rl`` extra); :func:`normalized_score` and the reference constants work
without it. Data: :mod:`primaldual.data.d4rl` reads the D4RL HDF5 layout; :mod:`primaldual.recipes.d4rl` builds
such data by the D4RL recipe (``primaldual data generate d4rl``). See ``docs/offline_rl.md``.
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
