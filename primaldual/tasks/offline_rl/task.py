"""Task ``offline_rl``: a (Primal.+) Decision Transformer on D4RL-layout data, evaluated by MuJoCo rollouts.

Models: ``model.kind: dt``, :class:`~primaldual.models.DecisionTransformer`; ``hf_dt``, Hugging Face's
``DecisionTransformerModel`` at the same sizes (:class:`~primaldual.integrations.hf.peers.HFDecisionTransformer`,
the ``hf`` extra), a peer trained and evaluated the same way.

Trained by the shared runner like every task (run directory, lock, checkpoint recovery, resume, history, DDP):
the data module is :class:`~primaldual.tasks.offline_rl.data.RLDataModule`, the Lightning module
:class:`~primaldual.tasks.offline_rl.training.DTModule`, whose validation step is the rollout evaluation. The
protocol is ``final``: the last checkpoint is reported, nothing is selected on the rollouts, and there is no
separate test pass (``primaldual test RUN`` re-runs the rollouts of a checkpoint).
"""

from __future__ import annotations

from typing import Any

from ...encoder import ACTIVATIONS
from ...options import check_bool, check_choice, check_int, check_name, check_number
from ...train.config import ConfigError, RunConfig
from ..base import Task, data_info, register_task
from ..checks import DTBlockKeys, InitKey, check_init, peer_attention
from ..protocols import Protocol
from .config import RLConfig

__all__ = ["FINAL", "OfflineRLTask"]

FINAL = Protocol(
    "heldout",  # the config's name for it (frozen configs say ``protocol: heldout``)
    "final checkpoint (nothing is selected on the rollouts)",
    "val",
    select_on="last",
    test_once=False,
)


@register_task("offline_rl")
class OfflineRLTask(Task):
    model_kinds = ("dt", "hf_dt")
    causal = True
    config = {"model": (DTBlockKeys, InitKey), "rl": RLConfig}
    example_splits = False  # evaluated by rollouts

    def check(self, cfg: RunConfig) -> None:
        check_name("data.name", cfg.data.name)
        if cfg.data.max_len is None:
            raise ConfigError("data.max_len: task 'offline_rl' needs the context K in timesteps (e.g. 20)")
        m = cfg.model
        check_choice("model.activation", m.activation, tuple(ACTIVATIONS))
        check_number("model.attn_drop", m.attn_drop, low=0, high=1, high_open=True)
        check_number("model.ffn_drop", m.ffn_drop, low=0, high=1, high_open=True, allow_none=True)
        check_init(m)
        if m.resolved_kind(self.name) == "hf_dt":
            peer_attention(m, "Hugging Face's DecisionTransformerModel")
            default = type(cfg)().model
            # model.init is not checked: transformers initialises the peer with GPT-2's scheme, which the shipped
            # configs' `gpt2` names; `pytorch`, the schema's default, is what run directories before it hold
            for key in ("activation", "attn_drop", "ffn_drop"):
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
        d_default = RunConfig().data
        for key in ("eval_batch_size", "num_workers"):  # batches are built in-process; evaluation is by rollouts
            if getattr(cfg.data, key) != getattr(d_default, key):
                raise ConfigError(
                    f"data.{key}: offline RL builds its batches in-process and evaluates by rollouts; it does "
                    f"not use {key} (leave it at {getattr(d_default, key)!r})"
                )
        t_r = r.target_returns
        if t_r is not None and not (
            isinstance(t_r, list | tuple)
            and t_r
            and all(not isinstance(x, bool) and isinstance(x, int | float) for x in t_r)
        ):
            raise ConfigError(f"rl.target_returns: expected null or a list of numbers, got {t_r!r}")

    def protocol(self, name: str) -> Protocol:
        return FINAL

    def history_metrics(self, cfg: RunConfig) -> tuple[str, ...]:
        from .training import ROLLOUT_METRICS

        return tuple(f"target{t:g}/{k}" for t in _targets(cfg) for k in ROLLOUT_METRICS)

    # --- building ----------------------------------------------------------------------------------------------
    def datamodule(self, cfg: RunConfig) -> Any:
        from .data import RLDataModule

        return RLDataModule(cfg)

    def model(self, cfg: RunConfig, dm: Any) -> Any:
        from .training import build_dt

        return build_dt(cfg, dm.state_dim, dm.act_dim)

    def module(self, cfg: RunConfig, dm: Any) -> Any:
        from .training import DTModule

        return DTModule(self.model(cfg, dm), cfg, dm.env, _targets(cfg), dm.state_mean, dm.state_std, dm.act_dim)

    def example_inputs(self, dm: Any) -> list[Any]:
        return dm.example_inputs()

    def describe_data(self, cfg: RunConfig, dm: Any) -> str:
        label = dm.meta.get("label", "D4RL layout")
        return (
            f"{cfg.data.name} ({dm.transitions} transitions, {len(dm.windows.trajectories)} trajectories; {label}); "
            f"evaluation: {cfg.rl.eval_episodes} episodes x targets {_targets(cfg)}"
        )

    # --- results -----------------------------------------------------------------------------------------------
    def results(
        self, cfg: RunConfig, dm: Any, module: Any, protocol: Protocol, best: dict[str, Any], test: dict | None
    ) -> dict[str, Any]:
        from .data import behaviour_score

        targets = module.targets
        final = {k[len("val/") :]: v for k, v in best.items() if k.startswith("val/target")}
        for tag, scores in module.last_scores.items():
            final[f"{tag}/normalized_scores"] = scores
        first = f"target{targets[0]:g}"
        return {
            "data_label": dm.meta.get("label", "D4RL layout (no metadata.json)"),
            "data_file": str(dm.path),
            "data": data_info(dm.windows),
            "reported_checkpoint": f"final (step {best['step']}); no checkpoint is selected on the rollouts",
            "eval_episodes": cfg.rl.eval_episodes,
            "eval_seeds": f"{cfg.rl.eval_seed} + i",
            "max_ep_len": cfg.rl.max_ep_len,
            "target_returns": targets,
            "final": final,
            "normalized_score_mean": final[f"{first}/normalized_score_mean"],
            "normalized_score_std": final[f"{first}/normalized_score_std"],
            "normalized_score_target": targets[0],
            "best_target_normalized_score_mean": max(final[f"target{t:g}/normalized_score_mean"] for t in targets),
            "behaviour_policy": behaviour_score(dm.meta, dm.kind),
            "state_mean": [float(x) for x in dm.state_mean],
            "state_std": [float(x) for x in dm.state_std],
        }

    def report(self, cfg: RunConfig, summary: dict[str, Any], protocol: Protocol) -> str:
        b = summary["behaviour_policy"]
        return (
            f"\n{cfg.data.name} {cfg.name} [final checkpoint, step {summary['steps']}]: normalised score "
            f"{summary['normalized_score_mean']:.1f} +- {summary['normalized_score_std']:.1f} at target "
            f"{summary['normalized_score_target']:g} ({cfg.rl.eval_episodes} episodes)"
            + (f"; behaviour policy {b['normalized_score_mean']:.1f}" if b else "")
            + f"\nrun directory: {summary['run_dir']} (config.yaml, history.csv, checkpoints/, summary.json)"
        )

    # --- the seeds table ---------------------------------------------------------------------------------------
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


def _targets(cfg: RunConfig) -> list[float]:
    """``rl.target_returns``, else the environment's reference targets."""
    from ...rl.evaluate import TARGET_RETURNS
    from .data import env_kind

    return [float(t) for t in (cfg.rl.target_returns or TARGET_RETURNS[env_kind(cfg.data.name)[0]])]
