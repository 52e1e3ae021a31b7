"""The Decision Transformer's Lightning module: masked action MSE to train, MuJoCo rollouts to evaluate.

* **Model** (``model.kind: dt``): :class:`~primaldual.models.DecisionTransformer`, state / action sizes from the
  data; ``hf_dt``: Hugging Face's ``DecisionTransformerModel`` at the same sizes
  (:class:`~primaldual.integrations.hf.peers.HFDecisionTransformer`, the ``hf`` extra).
* **Loss**: the action MSE over the real (unpadded) steps of the batch + ``collect_aux_loss(model)`` (the primal
  layers' KSVD term). Optimiser and warm-up / decay are :class:`~primaldual.train.module.ClassificationModule`'s
  (``optim``, ``schedule``), the gradient norm clipped by the trainer (``trainer.gradient_clip_val``).
* **Evaluation** (the validation step; the trainer runs it every ``trainer.val_check_interval`` steps):
  ``rl.eval_episodes`` rollouts per target return (``rl.target_returns``, default the environment's reference
  targets), episode ``i`` reset with seed ``rl.eval_seed + i`` (the same episodes at every evaluation), scored by
  :func:`~primaldual.rl.evaluate.evaluate_policy`. Under DDP the episodes are shared between the ranks (contiguous
  shares, gathered in episode order), so every rank logs the same scores. Rollouts run in float32 whatever
  ``trainer.precision`` says. The test step runs the same rollouts (``primaldual test RUN`` re-scores a checkpoint).

Logged per target ``t``: ``<split>/target<t>/{return_mean, return_std, normalized_score_mean,
normalized_score_std, length_mean}``; the per-episode normalised scores of the last evaluation are kept in
``last_scores`` (and in the checkpoint). Every checkpoint also carries the data's ``state_mean`` / ``state_std``,
which a policy needs at deployment, and the action width: :func:`load_policy` rebuilds the policy from a run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...aux_loss import collect_aux_loss_parts
from ...train.config import ConfigError, RunConfig
from ...train.module import ClassificationModule, log_ksvd

__all__ = ["DTModule", "ROLLOUT_METRICS", "build_dt", "load_policy"]

# what each evaluation records per target return
ROLLOUT_METRICS = ("return_mean", "return_std", "normalized_score_mean", "normalized_score_std", "length_mean")


def build_dt(cfg: RunConfig, state_dim: int, act_dim: int) -> nn.Module:
    """The :class:`~primaldual.models.DecisionTransformer` of ``cfg.model`` / ``cfg.rl`` for these sizes, or for
    ``model.kind: hf_dt`` Hugging Face's (:class:`~primaldual.integrations.hf.peers.HFDecisionTransformer`)."""
    m = cfg.model
    common = dict(max_ep_len=cfg.rl.max_ep_len, context=cfg.data.max_len, action_tanh=cfg.rl.action_tanh)
    if m.resolved_kind(cfg.task) == "hf_dt":
        try:
            from ...integrations.hf.peers import HFDecisionTransformer
        except ImportError as e:
            raise ConfigError(f"model.kind: 'hf_dt' needs the hf extra ({e})") from None
        return HFDecisionTransformer(
            state_dim,
            act_dim,
            **common,
            dim=m.dim,
            depth=m.depth,
            num_heads=m.num_heads,
            ffn_dim=m.ffn_dim,
            dropout=m.dropout,
        )
    from ...models.decision_transformer import DecisionTransformer

    return DecisionTransformer(
        state_dim,
        act_dim,
        **common,
        activation=m.activation,
        attn_drop=m.attn_drop,
        ffn_drop=m.ffn_drop,
        init=m.init,
        **m.backbone_kwargs(),
    )


def dt_inputs(batch: dict[str, Tensor]) -> list[Tensor]:
    """The model's positional inputs of a batch: ``states (B, K, sd), actions (B, K, ad), returns_to_go (B, K, 1),
    timesteps (B, K), mask (B, K)``."""
    return [batch["states"], batch["actions"], batch["returns_to_go"], batch["timesteps"], batch["mask"]]


class DTModule(ClassificationModule):
    """A return-conditioned policy trained on action MSE and evaluated by rollouts (see the module docstring).

    Args:
        model: has ``model(states, actions, returns_to_go, timesteps, mask) -> (B, K, act_dim)`` and ``get_action``.
        cfg: the run's config (``optim``, ``schedule``, ``trainer.max_steps``, ``rl``).
        env: the environment's short name (``hopper``). targets: the returns to condition the rollouts on.
        state_mean, state_std: the data's state statistics. act_dim: the action width (kept in the checkpoint).
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: RunConfig,
        env: str,
        targets: list[float],
        state_mean: np.ndarray,
        state_std: np.ndarray,
        act_dim: int,
    ) -> None:
        super().__init__(model, cfg.optim, ["val"], cfg.schedule, cfg.trainer.max_steps)
        self.rl, self.env, self.targets = cfg.rl, env, [float(t) for t in targets]
        self.state_mean = np.asarray(state_mean, dtype=np.float32)
        self.state_std = np.asarray(state_std, dtype=np.float32)
        self.act_dim = act_dim
        self.last_scores: dict[str, list[float]] = {}

    def _losses(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor | None]:
        pred = self.model(*dt_inputs(batch))  # (B, K, act_dim)
        real = batch["mask"].bool()
        sq = ((pred.float() - batch["actions"]) ** 2)[real]  # (real steps, act_dim)
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1 and self.training:
            # the mean over the *global* batch's real steps (DDP averages the ranks' gradients, hence * world): the
            # ranks' shares hold different numbers of padded steps, so a mean of per-rank means would weight them
            # differently from one process with the whole batch
            count = self.all_gather(torch.tensor(float(sq.numel()), device=sq.device)).sum()
            mse = sq.sum() * world / count
        else:
            mse = sq.mean()
        aux, self.aux_parts = collect_aux_loss_parts(self.model)  # None without primal layers
        return mse, mse if aux is None else mse + aux, aux

    def training_loss(self, batch: dict[str, Tensor], batch_idx: int) -> tuple[Tensor, Tensor, Tensor | None, None]:
        """``(loss, action MSE, aux loss or None, None)`` of one batch (``primaldual bench steps`` times it)."""
        mse, loss, aux = self._losses(batch)
        return loss, mse, aux, None

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, mse, aux, _ = self.training_loss(batch, batch_idx)
        if not math.isfinite(loss.item()):  # a diverged run stops here, not after hours of rollouts of NaN actions
            raise FloatingPointError(f"step {self.global_step + 1}: the loss is {loss.item()}")
        kw: dict[str, Any] = {"batch_size": batch["mask"].shape[0], "sync_dist": True}
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, **kw)
        self.log("train/action_mse", mse, on_step=True, on_epoch=False, **kw)
        self.log("train/aux_loss", 0.0 if aux is None else aux.detach(), on_step=False, on_epoch=True, **kw)
        log_ksvd(self, kw)
        return loss

    def _episodes(self) -> tuple[int, int]:
        """This rank's contiguous share ``[lo, hi)`` of the evaluation episodes."""
        world, rank = self.trainer.world_size, self.trainer.global_rank
        n = self.rl.eval_episodes
        return rank * n // world, (rank + 1) * n // world

    def _rollouts(self, split: str) -> None:
        from ...rl.evaluate import evaluate_policy, normalized_score

        lo, hi = self._episodes()
        world = self.trainer.world_size
        for t in self.targets:
            returns = np.zeros(0)
            if hi > lo:
                with torch.autocast(self.device.type, enabled=False):  # rollouts in float32
                    r = evaluate_policy(
                        self.model,
                        self.env,
                        t,
                        episodes=hi - lo,
                        seed=self.rl.eval_seed + lo,
                        state_mean=self.state_mean,
                        state_std=self.state_std,
                        return_scale=self.rl.return_scale,
                        max_ep_len=self.rl.max_ep_len,
                        device=self.device,
                    )
                returns = np.stack([r["returns"], r["lengths"]], 1)  # (episodes, 2): return, length
            if world > 1:  # contiguous shares gathered in rank order = episode order
                m = -(-self.rl.eval_episodes // world)
                pad = torch.full((m, 2), float("nan"), dtype=torch.float64, device=self.device)
                pad[: len(returns)] = torch.as_tensor(returns, dtype=torch.float64)
                every = self.all_gather(pad).reshape(-1, 2)  # (world * m, 2)
                returns = every[~torch.isnan(every[:, 0])].cpu().numpy()
            rets, lens = returns[:, 0], returns[:, 1]
            scores = np.asarray(normalized_score(self.env, rets), dtype=np.float64)
            tag = f"{split}/target{t:g}"
            values = {
                "return_mean": rets.mean(),
                "return_std": rets.std(),
                "normalized_score_mean": scores.mean(),
                "normalized_score_std": scores.std(),
                "length_mean": lens.mean(),
            }
            for k in ROLLOUT_METRICS:  # identical on every rank: no reduction
                self.log(f"{tag}/{k}", float(values[k]), on_epoch=True, batch_size=1, add_dataloader_idx=False)
            self.last_scores[f"target{t:g}"] = [float(s) for s in scores]

    def validation_step(self, batch: Tensor, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._rollouts("val")

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        self._rollouts("test")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_mean"] = torch.as_tensor(self.state_mean)
        checkpoint["state_std"] = torch.as_tensor(self.state_std)
        checkpoint["act_dim"] = int(self.act_dim)
        checkpoint["last_scores"] = dict(self.last_scores)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.last_scores = dict(checkpoint.get("last_scores", {}))


def load_policy(
    run_dir: str | os.PathLike, ckpt: str = "last", device: str | torch.device = "cpu"
) -> tuple[nn.Module, np.ndarray, np.ndarray]:
    """The trained policy of an offline-RL run, ready for :func:`~primaldual.rl.evaluate.evaluate_policy` or a
    deployment loop: ``(model in eval mode, state_mean, state_std)``.

    Args:
        run_dir: a run directory written by ``primaldual fit`` (its ``config.yaml`` builds the model).
        ckpt: ``last``, ``best`` or a checkpoint path; read in the safe mode and checked against the model.
    """
    from ...train.checkpoints import check_fits, load_checkpoint
    from ...train.rundir import run_config

    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if cfg.task != "offline_rl":
        raise ValueError(f"{run_dir}: a {cfg.task!r} run, not an offline_rl one")
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if ckpt in ("best", "last") else Path(ckpt)
    state = load_checkpoint(path, map_location="cpu")
    mean, std = state["state_mean"].numpy(), state["state_std"].numpy()
    weights = {k.removeprefix("model."): v for k, v in state["state_dict"].items()}  # (the module's "model.")
    model = build_dt(cfg, len(mean), int(state["act_dim"]))
    check_fits(model, {"state_dict": weights}, path, str(run_dir / "config.yaml"))
    model.load_state_dict(weights)
    return model.to(device).eval(), mean, std
