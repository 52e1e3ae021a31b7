"""Task ``offline_rl``: a (Primal.+) Decision Transformer on D4RL-layout data, evaluated by MuJoCo rollouts.

Models: ``model.kind: dt``, :class:`~primaldual.models.DecisionTransformer`; ``hf_dt``, Hugging Face's
``DecisionTransformerModel`` at the same sizes (:class:`~primaldual.integrations.hf.peers.HFDecisionTransformer`,
the ``hf`` extra), a peer trained and evaluated by the same loop.

Its own loop (:func:`primaldual.tasks.offline_rl.fit.fit_rl`), not a Lightning ``Trainer``: no ``validate`` / ``test`` (the
rollouts during fit are the evaluation; the final checkpoint is reported). Everything offline RL lives in
:mod:`primaldual.rl`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...encoder import ACTIVATIONS
from ...options import check_bool, check_choice, check_int, check_number
from ...train.config import ConfigError, RunConfig
from ...train.validate import path_part, peer_attention
from ..base import Task, register_task
from ..checks import check_init

__all__ = ["OfflineRLTask"]


@register_task("offline_rl")
class OfflineRLTask(Task):
    model_kinds = ("dt", "hf_dt")
    causal = True
    sections = ("rl",)
    compiles = True
    lightning = False
    # what the loop implements of trainer.precision (anything else would be silently ignored: refused instead)
    precisions = ("32-true", "32", 32, "bf16-mixed")
    keys = (("model", "activation"), ("model", "attn_drop"), ("model", "ffn_drop"), ("model", "init"))

    def check(self, cfg: RunConfig) -> None:
        path_part("data.name", cfg.data.name)
        if cfg.data.max_len is None:
            raise ConfigError("data.max_len: task 'offline_rl' needs the context K in timesteps (e.g. 20)")
        m = cfg.model
        check_choice("model.activation", m.activation, tuple(ACTIVATIONS))
        check_number("model.attn_drop", m.attn_drop, low=0, high=1, high_open=True)
        check_number("model.ffn_drop", m.ffn_drop, low=0, high=1, high_open=True, allow_none=True)
        check_init(m)
        if m.resolved_kind(self.name) == "hf_dt":
            peer_attention(m, "Hugging Face's DecisionTransformerModel")
            default = RunConfig().model
            for _, key in self.keys:
                if getattr(m, key) != getattr(default, key):
                    raise ConfigError(
                        f"model.{key}: model.kind 'hf_dt' is Hugging Face's DecisionTransformerModel, whose block is "
                        f"fixed (ReLU, attention dropout = model.dropout, no FFN hidden dropout, GPT-2 init); leave "
                        f"model.{key} at {getattr(default, key)!r} (got {getattr(m, key)!r})"
                    )
        elif m.attn_drop and "primal" in (m.attention if isinstance(m.attention, list | tuple) else [m.attention]):
            raise ConfigError(
                "model.attn_drop: a primal layer forms no attention matrix to drop; set it to 0 for a plan with "
                f"primal layers (got {m.attn_drop} with model.attention {m.attention!r})"
            )
        r = cfg.rl
        check_int("rl.max_ep_len", r.max_ep_len, low=1)
        check_number("rl.return_scale", r.return_scale, low=0, low_open=True)
        check_int("rl.eval_episodes", r.eval_episodes, low=1)
        check_int("rl.eval_seed", r.eval_seed, low=0)
        check_bool("rl.action_tanh", r.action_tanh)
        t, d = cfg.trainer, RunConfig().trainer
        if not any(type(t.precision) is type(p) and t.precision == p for p in self.precisions):
            raise ConfigError(
                f"trainer.precision: the offline-RL loop trains in 32-true or bf16-mixed (autocast), got {t.precision!r}"
            )
        d_default = RunConfig().data
        for key in ("eval_batch_size", "num_workers"):  # the loop batches in-process and evaluates by rollouts
            if getattr(cfg.data, key) != getattr(d_default, key):
                raise ConfigError(
                    f"data.{key}: the offline-RL loop draws its batches in-process and evaluates by rollouts; it does "
                    f"not use {key} (leave it at {getattr(d_default, key)!r})"
                )
        for key in ("accumulate_grad_batches", "strategy", "devices", "num_nodes"):
            if getattr(t, key) != getattr(d, key):
                raise ConfigError(
                    f"trainer.{key}: the offline-RL loop runs one process on one device without accumulation; it "
                    f"does not use {key} (leave it at {getattr(d, key)!r})"
                )
        t_r = r.target_returns
        if t_r is not None and not (
            isinstance(t_r, list | tuple)
            and t_r
            and all(not isinstance(x, bool) and isinstance(x, int | float) for x in t_r)
        ):
            raise ConfigError(f"rl.target_returns: expected null or a list of numbers, got {t_r!r}")

    table_title = "D4RL normalised score"

    def table_value(self, summary: dict[str, Any]) -> float:
        return summary["normalized_score_mean"]  # the final checkpoint's: nothing is selected on rollouts

    def table_column(self, protocol: str) -> str:
        return "final checkpoint"

    def table_notes(self, summaries: list[dict[str, Any]]) -> list[str]:
        behaviour = {s["dataset"]: s["behaviour_policy"] for s in summaries if s.get("behaviour_policy")}
        return [
            f"{d}: behaviour policy normalised score {b['normalized_score_mean']:.2f}" for d, b in behaviour.items()
        ]

    def fit(self, cfg: RunConfig, run_dir: Path, *, fresh: bool = False, verbose: bool = True) -> dict[str, Any]:
        from .fit import fit_rl

        return fit_rl(cfg, run_dir, fresh=fresh, verbose=verbose)
