"""Offline RL training loop (task ``offline_rl``, :mod:`primaldual.tasks.offline_rl`): Decision Transformer training on D4RL-layout data, evaluated by
rollouts.

* **Data**: ``data.name`` ``<env>-<kind>`` (e.g. ``hopper-medium``), read from ``data.root`` or the cache
  ``d4rl/<env>-<kind>`` (:func:`~primaldual.data.d4rl.read_d4rl`; a missing folder is a one-line error naming
  ``primaldual data generate d4rl``). Windows of ``data.max_len`` = K timesteps from
  :class:`~primaldual.data.d4rl.TrajectoryDataset` (item ``i`` of epoch ``e`` drawn from ``[seed, e, i]``), so the
  batch of optimiser step ``s`` is a function of ``s`` alone and a resume continues the exact stream.
* **Model** (``model.kind: dt``): :class:`~primaldual.models.DecisionTransformer`, state / action sizes from the
  data; the state mean / std of the data are stored in ``summary.json`` and in every checkpoint.
* **Loss**: masked action MSE + ``collect_aux_loss(model)`` (the primal layers' KSVD term); the optimiser of
  ``optim`` (AdamW in the configs), the warm-up / decay of ``schedule`` (:func:`~primaldual.train.module.lr_factor`),
  gradient norm clipped at ``trainer.gradient_clip_val``.
* **Speed** (the model's forward and backward are most of a step): ``trainer.compile: true`` compiles the model in
  place as the Lightning tasks do (:func:`~primaldual.train.compile.compile_model`: checked against eager first,
  dropout masks drawn by a fused counter-based hash on the CPU); ``trainer.precision: bf16-mixed`` runs the
  forward and the loss under bfloat16 autocast (matrix products in bfloat16; weights, gradients and the optimiser
  stay float32; rollouts run in float32). ``benchmarks/dt_update.py`` times each against the plain float32 step.
* **Evaluation**: every ``trainer.val_check_interval`` steps and at the end, ``rl.eval_episodes`` rollouts per
  target return (``rl.target_returns``, default the reference targets of the environment), seeds
  ``rl.eval_seed + i`` (the same episodes at every evaluation), scored by
  :func:`~primaldual.rl.evaluate.evaluate_policy`: mean and population std of the raw return and of D4RL's
  normalised score. The **final** checkpoint is reported (nothing is selected on the rollouts); ``summary.json``
  puts the behaviour policy's normalised score (the dataset's ``metadata.json``) beside it.

The loop is plain PyTorch (not a Lightning Trainer): one process, on the CPU or one CUDA device (``trainer.accelerator``
``auto`` / ``gpu`` / ``cuda`` when one is there); the run directory, lock and
config check are the harness's (``config.yaml``, ``run.lock``, ``history.csv``, ``checkpoints/last.ckpt`` +
``last.prev.ckpt`` written atomically after every evaluation, ``summary.json``). The same command resumes.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...aux_loss import collect_aux_loss
from ...data.cache import MissingDataError, dataset_dir
from ...train.config import ConfigError, RunConfig
from ...train.module import build_optimizer, lr_factor
from ...utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text

__all__ = ["behaviour_score", "build_dt", "data_file", "fit_rl", "rl_data_dir"]

HISTORY = "history.csv"


def rl_data_dir(cfg: RunConfig) -> Path:
    """``data.root``, else the cache ``d4rl/<data.name>``."""
    if cfg.data.root is not None:
        return Path(cfg.data.root).expanduser()
    return dataset_dir("d4rl") / cfg.data.name


def _env_kind(name: str) -> tuple[str, str]:
    from ...rl.evaluate import env_key

    env, _, kind = name.partition("-")
    try:
        return env_key(env), kind
    except (KeyError, ValueError):
        raise ConfigError(
            f"data.name: expected <env>-<kind> with env halfcheetah, hopper or walker2d, got {name!r}"
        ) from None


def _generate_hint(env: str, kind: str) -> str:
    return f"primaldual data generate d4rl --env {env} --kind {kind or 'medium'}"


def _load_data(cfg: RunConfig) -> tuple[Any, dict[str, Any], Path]:
    from ...data.d4rl import read_d4rl

    env, kind = _env_kind(cfg.data.name)
    path = data_file(cfg)
    data = read_d4rl(path)
    meta_path = path.parent / "metadata.json"
    meta = _read_metadata(meta_path) if meta_path.is_file() else {}
    return data, meta, path


def _read_metadata(path: Path) -> dict[str, Any]:
    """The generator's ``metadata.json`` beside the data (a JSON object); anything else is a
    :class:`~primaldual.data.d4rl.D4RLFormatError` naming the file."""
    from ...data.d4rl import D4RLFormatError

    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise D4RLFormatError(f"{path}: not a readable JSON file ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(meta, dict):
        raise D4RLFormatError(f"{path}: expected a JSON object, got a JSON {type(meta).__name__}")
    return meta


def data_file(cfg: RunConfig) -> Path:
    """The HDF5 file of ``data.name``: ``data.root`` itself when it is a file; else, in ``data.root`` (or the cache),
    the file named after the dataset (``<data.name>.hdf5``, D4RL's ``<data.name>-v2.hdf5``, or ``.h5``).

    Raises:
        MissingDataError: no such file (the message lists what the folder holds and how to generate the data).
        ConfigError: several files of that name (say which with ``data.root``).
    """
    env, kind = _env_kind(cfg.data.name)
    root = rl_data_dir(cfg)
    if root.is_file():
        if root.suffix not in (".hdf5", ".h5"):
            raise ConfigError(f"data.root: {root} is a file but not HDF5 (.hdf5 / .h5)")
        return root
    files = sorted(p for p in root.glob("*") if p.suffix in (".hdf5", ".h5")) if root.is_dir() else []
    name = re.compile(rf"{re.escape(cfg.data.name)}(-v\d+)?")
    matches = [p for p in files if name.fullmatch(p.stem)]
    if len(matches) > 1:
        raise ConfigError(
            f"data.root: {root} holds several files of {cfg.data.name} ({', '.join(p.name for p in matches)}); "
            "point data.root at the one to train on"
        )
    if not matches:
        there = f" (it holds {', '.join(p.name for p in files)})" if files else ""
        raise MissingDataError(
            f"{root}: no D4RL data for {cfg.data.name}: expected {cfg.data.name}.hdf5{there}; generate it with "
            f"`{_generate_hint(env, kind)}`, or point --data.root at the file"
        )
    return matches[0]


def _check_widths(env: str, state_dim: int, act_dim: int, path: Path) -> None:
    """Refuse data whose observation / action widths are not the environment's (before any training step)."""
    from ...rl.evaluate import env_id, make_env

    e = make_env(env)
    try:
        want = (int(e.observation_space.shape[0]), int(e.action_space.shape[0]))
    finally:
        e.close()
    if (state_dim, act_dim) != want:
        raise ConfigError(
            f"data.name: {path} has observations of width {state_dim} and actions of width {act_dim}, but "
            f"{env_id(env)} has {want[0]} and {want[1]}; the data was made for another environment"
        )


def behaviour_score(meta: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The behaviour policy's normalised score recorded by ``primaldual data generate d4rl`` (None if absent)."""
    b = meta.get("behaviour_policy") or {}
    entry = b.get(kind) if isinstance(b.get(kind), dict) else next((v for v in b.values() if isinstance(v, dict)), None)
    if not entry or "normalized_score_mean" not in entry:
        return None
    keys = ("normalized_score_mean", "normalized_score_std", "return_mean", "return_std", "episodes")
    return {k: entry[k] for k in keys if k in entry}


def build_dt(cfg: RunConfig, state_dim: int, act_dim: int) -> nn.Module:
    """The :class:`~primaldual.models.DecisionTransformer` of ``cfg.model`` / ``cfg.rl`` for these sizes, or for
    ``model.kind: hf_dt`` Hugging Face's (:class:`~primaldual.integrations.hf.peers.HFDecisionTransformer`)."""
    from ...models.decision_transformer import DecisionTransformer

    m = cfg.model
    if m.resolved_kind(cfg.task) == "hf_dt":
        return _hf_dt(cfg, state_dim, act_dim)
    return DecisionTransformer(
        state_dim,
        act_dim,
        max_ep_len=cfg.rl.max_ep_len,
        context=cfg.data.max_len,
        action_tanh=cfg.rl.action_tanh,
        activation=m.activation,
        attn_drop=m.attn_drop,
        ffn_drop=m.ffn_drop,
        init=m.init,
        **m.backbone_kwargs(),
    )


def _hf_dt(cfg: RunConfig, state_dim: int, act_dim: int) -> nn.Module:
    try:
        from ...integrations.hf.peers import HFDecisionTransformer
    except ImportError as e:
        raise ConfigError(f"model.kind: 'hf_dt' needs the hf extra ({e})") from None
    m = cfg.model
    return HFDecisionTransformer(
        state_dim,
        act_dim,
        max_ep_len=cfg.rl.max_ep_len,
        context=cfg.data.max_len,
        action_tanh=cfg.rl.action_tanh,
        dim=m.dim,
        depth=m.depth,
        num_heads=m.num_heads,
        ffn_dim=m.ffn_dim,
        dropout=m.dropout,
    )


def _optimizer(cfg: RunConfig, model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    s = cfg.schedule
    opt = build_optimizer(cfg.optim, model.parameters())
    total = s.total_steps or cfg.trainer.max_steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, partial(lr_factor, warmup=s.warmup_steps, decay=s.decay, total=total)
    )
    return opt, sched


def _batch(ds: Any, step: int, batch_size: int, per_epoch: int) -> dict[str, torch.Tensor]:
    """The batch of optimiser step ``step``: items ``[b * B, (b + 1) * B)`` of epoch ``step // per_epoch``."""
    epoch, b = divmod(step, per_epoch)
    ds.set_epoch(epoch)
    return ds.batch(np.arange(b * batch_size, (b + 1) * batch_size))


def _inputs(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [batch["states"], batch["actions"], batch["returns_to_go"], batch["timesteps"], batch["mask"]]


def _autocast(cfg: RunConfig, device: torch.device):
    """``trainer.precision: bf16-mixed``: bfloat16 autocast (matrix products in bfloat16, float32 weights and
    optimiser); else nothing."""
    if cfg.trainer.precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    pred = model(*_inputs(batch))
    m = batch["mask"].bool()
    mse = ((pred.float() - batch["actions"]) ** 2)[m].mean()
    aux = collect_aux_loss(model)  # None without primal layers
    return (mse if aux is None else mse + aux), mse


def _evaluate(cfg: RunConfig, model: nn.Module, env: str, targets: list[float], mean, std) -> dict[str, Any]:
    from ...rl.evaluate import evaluate_policy

    was = model.training
    model.eval()
    out: dict[str, Any] = {}
    try:
        for t in targets:
            r = evaluate_policy(
                model,
                env,
                float(t),
                episodes=cfg.rl.eval_episodes,
                seed=cfg.rl.eval_seed,
                state_mean=mean,
                state_std=std,
                return_scale=cfg.rl.return_scale,
                max_ep_len=cfg.rl.max_ep_len,
                device=_device(model),
            )
            tag = f"target{t:g}"
            for k in ("return_mean", "return_std", "normalized_score_mean", "normalized_score_std", "length_mean"):
                out[f"{tag}/{k}"] = float(r[k])
            out[f"{tag}/normalized_scores"] = [float(x) for x in np.atleast_1d(r.get("normalized_scores", []))]
    finally:
        model.train(was)
    return out


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _save(path: Path, state: dict[str, Any]) -> None:
    from ...train.checkpoints import keep_previous

    buf = io.BytesIO()
    torch.save(state, buf)
    keep_previous(path)  # last.prev.ckpt: both names always hold a complete checkpoint
    atomic_write_bytes(path, buf.getvalue())


def _load_last(run_dir: Path, note) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from, by the harness's contract (:func:`~primaldual.train.checkpoints.
    resume_checkpoint`): ``last.ckpt``, else ``last.prev.ckpt`` (the bad file kept as ``last.ckpt.corrupt``), else a
    :class:`~primaldual.train.checkpoints.CheckpointError` naming ``--fresh``; ``(path, state)``, or None for a fresh
    start."""
    from ...train.checkpoints import load_checkpoint, resume_checkpoint

    path = resume_checkpoint(run_dir, note, weights_key="model")
    return None if path is None else (path, load_checkpoint(path, weights_key="model"))


# what the loop saves in its checkpoints (every key is needed to continue the run exactly)
_STATE_KEYS = ("model", "optimizer", "scheduler", "torch_rng", "step", "history", "train_seconds")


def _restore(
    state: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer, sched: Any, path: Path
) -> tuple[int, list[dict[str, Any]], float]:
    """Load a checkpoint of this loop into the model, optimiser and schedule; ``(step, history rows, train
    seconds)``. A checkpoint of another model or format is a :class:`CheckpointError` naming the file."""
    from ...train.checkpoints import CheckpointError

    hint = "pass --fresh to start the run over, or another --run-dir"
    if missing := [k for k in _STATE_KEYS if k not in state]:
        raise CheckpointError(f"{path}: not a checkpoint of this run (missing {', '.join(missing)}); {hint}")
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        return int(state["step"]), list(state["history"]), float(state["train_seconds"])
    except (RuntimeError, KeyError, ValueError, TypeError) as e:
        first = " ".join(str(e).split())[:240]
        raise CheckpointError(f"{path}: does not fit this run's model ({first}); {hint}") from None


def _write_history(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    flat = [{k: v for k, v in r.items() if not isinstance(v, list)} for r in rows]
    keys = list(dict.fromkeys(k for r in flat for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(flat)
    atomic_write_text(run_dir / HISTORY, buf.getvalue())


def fit_rl(cfg: RunConfig, run_dir: Path, *, fresh: bool = False, verbose: bool = True) -> dict[str, Any]:
    """Train (or resume) one offline RL run; return its summary (also written to ``summary.json``)."""
    from ...data.d4rl import TrajectoryDataset
    from ...rl.evaluate import TARGET_RETURNS, require_rl
    from ...train.lock import RunLock
    from ...train.rundir import prepare_run_dir

    require_rl("gymnasium", "h5py")
    if cfg.trainer.accelerator not in ("auto", "cpu") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator: {cfg.trainer.accelerator!r} is not available here")
    note = (lambda msg: print(msg, flush=True)) if verbose else (lambda msg: None)
    env, kind = _env_kind(cfg.data.name)
    data, meta, hdf5 = _load_data(cfg)
    _check_widths(env, data.state_dim, data.act_dim, hdf5)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    ds = TrajectoryDataset(
        data, cfg.data.max_len, return_scale=cfg.rl.return_scale, max_ep_len=cfg.rl.max_ep_len, seed=cfg.seed
    )
    cuda = torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda")
    device = torch.device("cuda" if cuda else "cpu")
    model = build_dt(cfg, data.state_dim, data.act_dim).to(device)
    opt, sched = _optimizer(cfg, model)
    targets = list(cfg.rl.target_returns) if cfg.rl.target_returns is not None else list(TARGET_RETURNS[env])
    B, total = cfg.data.batch_size, cfg.trainer.max_steps
    if len(ds) < B:  # an epoch must hold one batch: the loop draws items [b * B, (b + 1) * B) of it
        raise ConfigError(
            f"data.batch_size: {hdf5} has {len(ds)} timesteps, fewer than one batch ({B}); "
            "pass a smaller --data.batch_size or more data"
        )
    per_epoch = len(ds) // B
    every = cfg.trainer.val_check_interval or max(1, total // 10)
    mean, std = ds.state_mean, ds.state_std
    lock = RunLock(run_dir)
    action = "--fresh refused" if fresh else "refused"
    lock.check_free(action)
    with lock.acquire(action):
        prepare_run_dir(cfg, run_dir, fresh, verbose)
        ck = run_dir / "checkpoints"
        last = _load_last(run_dir, note)
        step, rows, train_seconds = 0, [], 0.0
        if last is not None:
            step, rows, train_seconds = _restore(last[1], model, opt, sched, last[0])
            note(f"resuming from step {step}")
        n = sum(p.numel() for p in model.parameters())
        note(
            f"{cfg.name}: {cfg.model.attention} attention, {n / 1e6:.3f}M parameters, {cfg.data.name} "
            f"({len(data)} transitions, {len(ds.trajectories)} trajectories; {meta.get('label', 'D4RL layout')}), "
            f"{total} steps x batch {B}, evaluation every {every} steps: {cfg.rl.eval_episodes} episodes x "
            f"targets {targets}\nrun directory: {run_dir}"
        )
        if cfg.trainer.compile:  # in place (same parameter names), checked against eager on one batch
            from ...train.compile import compile_model

            first = {k: v.to(device) for k, v in _batch(ds, step, B, per_epoch).items()}
            compile_model(model, _inputs(first), note)
        model.train()
        t_run = time.time()
        loss_sum, mse_sum, count = 0.0, 0.0, 0
        while step < total:
            t0 = time.perf_counter()
            batch = {k: v.to(device) for k, v in _batch(ds, step, B, per_epoch).items()}
            with _autocast(cfg, device):
                loss, mse = _loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.trainer.gradient_clip_val is not None:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
            opt.step()
            sched.step()
            step += 1
            train_seconds += time.perf_counter() - t0
            if not math.isfinite(loss.item()):
                raise FloatingPointError(f"step {step}: the loss is {loss.item()}")
            loss_sum, mse_sum, count = loss_sum + loss.item(), mse_sum + mse.item(), count + 1
            if step % every == 0 or step == total:
                t1 = time.perf_counter()
                ev = _evaluate(cfg, model, env, targets, mean, std)
                row = {
                    "step": step,
                    "train/loss": loss_sum / count,
                    "train/action_mse": mse_sum / count,
                    "lr": sched.get_last_lr()[0],
                    "train_seconds": round(train_seconds, 2),
                    "eval_seconds": round(time.perf_counter() - t1, 2),
                    **ev,
                }
                rows.append(row)
                loss_sum, mse_sum, count = 0.0, 0.0, 0
                _write_history(run_dir, rows)
                scores = ", ".join(f"{t:g}: {ev[f'target{t:g}/normalized_score_mean']:.1f}" for t in targets)
                note(f"step {step}/{total}: loss {row['train/loss']:.4f}; normalised score by target {scores}")
                ck.mkdir(parents=True, exist_ok=True)
                _save(
                    ck / "last.ckpt",
                    {
                        "model": model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(),
                        "torch_rng": torch.get_rng_state(),
                        "step": step,
                        "history": rows,
                        "train_seconds": train_seconds,
                        "state_mean": torch.as_tensor(mean),
                        "state_std": torch.as_tensor(std),
                    },
                )
        final = rows[-1]
        summary: dict[str, Any] = {
            "name": cfg.name,
            "task": cfg.task,
            "dataset": cfg.data.name,
            "data_label": meta.get("label", "D4RL layout (no metadata.json)"),
            "data_file": str(hdf5),
            "attention": cfg.model.attention,
            "protocol": cfg.protocol,
            "seed": cfg.seed,
            "steps": step,
            "reported_checkpoint": f"final (step {step}); no checkpoint is selected on the rollouts",
            "evaluations": len(rows),
            "eval_episodes": cfg.rl.eval_episodes,
            "eval_seeds": f"{cfg.rl.eval_seed} + i",
            "max_ep_len": cfg.rl.max_ep_len,
            "target_returns": targets,
            "final": {k: v for k, v in final.items() if k.startswith("target")},
            "normalized_score_mean": final[f"target{targets[0]:g}/normalized_score_mean"],
            "normalized_score_std": final[f"target{targets[0]:g}/normalized_score_std"],
            "normalized_score_target": targets[0],
            "best_target_normalized_score_mean": max(final[f"target{t:g}/normalized_score_mean"] for t in targets),
            "behaviour_policy": behaviour_score(meta, kind),
            "train_seconds": round(train_seconds, 1),
            "train_seconds_per_1k_steps": round(1000 * train_seconds / max(1, step), 1),
            "fit_seconds_this_attempt": round(time.time() - t_run, 1),
            "state_mean": [float(x) for x in mean],
            "state_std": [float(x) for x in std],
            "run_dir": str(run_dir),
        }
        atomic_write_json(run_dir / "summary.json", summary)
        b = summary["behaviour_policy"]
        note(
            f"\n{cfg.data.name} {cfg.name} [final checkpoint, step {step}]: normalised score "
            f"{summary['normalized_score_mean']:.1f} +- {summary['normalized_score_std']:.1f} at target {targets[0]:g} "
            f"({cfg.rl.eval_episodes} episodes)"
            + (f"; behaviour policy {b['normalized_score_mean']:.1f}" if b else "")
            + f"\nrun directory: {run_dir} (config.yaml, history.csv, checkpoints/, summary.json)"
        )
        return summary
