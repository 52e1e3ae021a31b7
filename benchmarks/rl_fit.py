"""How well offline-RL runs fit their data: the action MSE of each run's last checkpoint in evaluation mode.

A run logs ``train/action_mse`` per training step, in training mode, so it moves with the dropout settings and
with the batches of that step. This script scores every run on the **same** windows
(``--windows`` K-step windows of the run's dataset, drawn with seed ``--seed``, whatever the run's seed), with
dropout off, in float32: a number that compares models and block options directly. It reads a run directory of
``primaldual fit`` (task ``offline_rl``): :func:`~primaldual.tasks.offline_rl.training.load_policy` rebuilds the
model from ``config.yaml`` (our DT or the Hugging Face peer) with the weights of ``checkpoints/last.ckpt`` (read
in the safe mode), and the config finds the data. Run::

    python benchmarks/rl_fit.py runs/offline_rl/* [--windows 8192] [--seed 0] [--threads 1]

prints one Markdown row per run (dataset, config name, the block options, seed, step, action MSE). Hand-written: a
few lines over this project's own run files and functions.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch


def fit_mse(run: Path, windows: int, seed: int, batch: int = 512) -> dict[str, object]:
    """The evaluation-mode action MSE of ``run``'s last checkpoint on ``windows`` windows drawn with ``seed``."""
    from primaldual.data.d4rl import TrajectoryDataset, read_d4rl
    from primaldual.tasks.offline_rl.data import data_file
    from primaldual.tasks.offline_rl.training import dt_inputs, load_policy
    from primaldual.train.config import load_config

    ckpt = run / "checkpoints" / "last.ckpt"
    for need in (run / "config.yaml", ckpt):
        if not need.is_file():
            raise FileNotFoundError(f"{run}: no {need.relative_to(run)} (is it a run directory of task offline_rl?)")
    cfg = load_config(run / "config.yaml")
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    data = read_d4rl(data_file(cfg))
    ds = TrajectoryDataset(
        data, cfg.data.max_len, return_scale=cfg.rl.return_scale, max_ep_len=cfg.rl.max_ep_len, seed=seed
    )
    if windows > len(ds):
        raise ValueError(f"--windows {windows}: {run}'s dataset has {len(ds)} windows")
    ds.set_epoch(0)
    torch.manual_seed(0)  # construction draws weights that the checkpoint then replaces
    model, _, _ = load_policy(run)
    total, count = 0.0, 0
    with torch.no_grad():
        for lo in range(0, windows, batch):
            b = ds.batch(np.arange(lo, min(lo + batch, windows)))
            pred = model(*dt_inputs(b))
            m = b["mask"].bool()
            err = (pred.float() - b["actions"]) ** 2  # (B, K, act_dim)
            total += float(err[m].sum())
            count += int(m.sum()) * err.shape[-1]
    m = cfg.model
    options = "peer's" if m.kind == "hf_dt" else f"{m.init}, {m.activation}, attn {m.attn_drop}, ffn {m.ffn_drop}"
    return {
        "dataset": cfg.data.name,
        "name": cfg.name,
        "options": options,
        "seed": cfg.seed,
        "step": int(state["global_step"]),
        "mse": total / count,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories of task offline_rl")
    p.add_argument("--windows", type=int, default=8192, help="windows scored (the same for every run)")
    p.add_argument("--seed", type=int, default=0, help="seed that draws the windows")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = p.parse_args(argv)
    if a.windows < 1:
        p.error(f"--windows must be a positive int, got {a.windows}")
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    print(
        "| dataset | run | block (init, activation, attention / FFN dropout) | seed | step | action MSE (eval mode) |"
    )
    print("|---|---|---|---|---|---|")
    for run in a.runs:
        r = fit_mse(run, a.windows, a.seed)
        print(f"| {r['dataset']} | {r['name']} | {r['options']} | {r['seed']} | {r['step']} | {r['mse']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
