"""One run: config -> run directory -> Trainer.fit (resuming from ``last.ckpt`` if present) -> summary.

UEA runs are epoch-based; LRA runs are step-based (``trainer.max_steps``, an evaluation and a checkpoint every
``trainer.val_check_interval`` steps, default a tenth of the run), with the LRA protocol: the best-validation
checkpoint is evaluated once on test.

Run directory (default ``runs/<task>/<dataset>/<name>-<protocol>-seed<k>-<config hash>``)::

    config.yaml            the resolved config (a restart with a different config is refused)
    history.csv            one row per epoch / evaluation (train / eval metrics), complete across resumes
    logs/version_<i>/      Lightning CSVLogger output (metrics.csv per step/epoch, hparams.yaml); one per attempt
    checkpoints/last.ckpt  written after every epoch / evaluation, atomically; the same command resumes from it
    checkpoints/best.ckpt  the epoch / evaluation the protocol selects
    summary.json           the result (protocol label, best epoch or step, test accuracy, data source, ...)
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from ..models import RetrievalClassifier, SequenceClassifier, TimeSeriesClassifier
from ..utils.io import atomic_write_json, atomic_write_text
from .callbacks import AtomicCheckpointIO, EpochHistory, EpochSeed
from .config import ConfigError, RunConfig, dump_config
from .datamodule import UEADataModule
from .lra_data import LRADataModule, labels_of
from .module import ClassificationModule
from .protocols import get_protocol

__all__ = ["build_datamodule", "build_model", "build_module", "default_run_dir", "evaluate", "fit"]


def default_run_dir(cfg: RunConfig, base: str | os.PathLike = "runs") -> Path:
    """``<base>/<task>/<dataset>/<name>-<protocol>-seed<k>-<hash>``: the same command always maps to the same dir."""
    return Path(base) / cfg.task / cfg.data.name / f"{cfg.name}-{cfg.protocol}-seed{cfg.seed}-{cfg.fingerprint()}"


def _is_launcher_process() -> bool:
    """True in the process the user started (not a DDP worker re-launched by Lightning)."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def build_datamodule(cfg: RunConfig) -> UEADataModule | LRADataModule:
    """The task's data module (not yet set up)."""
    if cfg.task == "uea":
        return UEADataModule(cfg.data, cfg.protocol, cfg.seed)
    return LRADataModule(cfg.data, cfg.task, cfg.seed)


def _from_data(cfg_value: int | None, data_value: int, key: str) -> int:
    if cfg_value is not None and cfg_value != data_value:
        raise ConfigError(f"{key}: the config says {cfg_value} but the data has {data_value}; set it to null or that")
    return data_value


def build_model(cfg: RunConfig, dm: UEADataModule | LRADataModule) -> nn.Module:
    """The task model of ``cfg.model`` sized from the (set-up) data module."""
    m = cfg.model
    common = {
        "dim": m.dim,
        "depth": m.depth,
        "num_heads": m.num_heads,
        "ffn_dim": m.ffn_dim,
        "dropout": m.dropout,
        "attention": m.attention,
        "attention_options": m.attention_options,
    }
    kind = m.resolved_kind(cfg.task)
    if kind == "timeseries":
        return TimeSeriesClassifier(dm.num_channels, dm.num_classes, dm.max_len, **common)
    classes = _from_data(m.num_classes, dm.num_classes, "model.num_classes")
    vocab = m.vocab_size if m.vocab_size is not None else dm.vocab_size
    if vocab < dm.vocab_size:
        raise ConfigError(f"model.vocab_size: {vocab} is smaller than the data's vocabulary ({dm.vocab_size})")
    tokens = {"pooling": m.pooling, "norm_first": m.norm_first, "positions": m.positions, **common}
    if kind == "retrieval":
        return RetrievalClassifier(vocab, dm.max_len, classes, **tokens)
    return SequenceClassifier(vocab, classes, dm.max_len, **tokens)


def build_module(cfg: RunConfig, dm: UEADataModule | LRADataModule) -> ClassificationModule:
    """Model + optimiser / schedule settings in the Lightning module."""
    total = cfg.trainer.max_steps if cfg.step_based else None
    return ClassificationModule(build_model(cfg, dm), cfg.optim, dm.eval_splits, cfg.schedule, total)


def _val_interval(cfg: RunConfig) -> int:
    return cfg.trainer.val_check_interval or max(1, cfg.trainer.max_steps // 10)


def _prepare_run_dir(cfg: RunConfig, run_dir: Path, fresh: bool) -> None:
    text = dump_config(cfg)
    if fresh and run_dir.exists() and _is_launcher_process():
        shutil.rmtree(run_dir)
    saved = run_dir / "config.yaml"
    if saved.exists():
        if saved.read_text() != text:
            raise ConfigError(
                f"{run_dir} holds a run with a different config ({saved}); pass --fresh to start over there "
                f"or --run-dir to use another directory"
            )
    elif _is_launcher_process():
        atomic_write_text(saved, text)


def _trainer(cfg: RunConfig, run_dir: Path, callbacks: list[L.Callback], logger: Any = None) -> L.Trainer:
    t = cfg.trainer
    if cfg.step_based:
        # Evaluate every K steps across epoch boundaries; max_epochs -1 = unbounded (max_steps stops the run).
        when: dict[str, Any] = {
            "max_steps": t.max_steps,
            "max_epochs": -1,
            "val_check_interval": _val_interval(cfg),
            "check_val_every_n_epoch": None,
        }
    else:
        when = {"max_epochs": t.max_epochs}
    return L.Trainer(
        default_root_dir=run_dir,
        **when,
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=t.strategy,
        precision=t.precision,
        gradient_clip_val=t.gradient_clip_val,
        log_every_n_steps=t.log_every_n_steps,
        enable_progress_bar=t.enable_progress_bar,
        logger=logger if logger is not None else False,
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        use_distributed_sampler=False,  # the data module shards with a seeded DistributedSampler itself
        num_sanity_val_steps=0,  # keeps the RNG stream and logs identical between fresh and resumed runs
        enable_model_summary=False,
    )


def fit(
    cfg: RunConfig,
    run_dir: str | os.PathLike | None = None,
    *,
    fresh: bool = False,
    verbose: bool = True,
) -> dict[str, Any]:
    """Train (or resume) one run and return its summary (also written to ``summary.json``).

    Args:
        cfg: the resolved config. run_dir: default :func:`default_run_dir`. fresh: delete the run dir first.
        verbose: per-epoch lines and the final report on stdout (rank 0).
    """
    protocol = get_protocol(cfg.protocol)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    _prepare_run_dir(cfg, run_dir, fresh)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    module = build_module(cfg, dm)
    every = "val" if cfg.step_based else "epoch"
    history = EpochHistory(run_dir, protocol, dm.eval_splits, verbose=verbose, every=every)
    # Monitor-less top-1 under the fixed name "last": one file, replaced (atomically) after every epoch
    # (step-based: after every periodic evaluation, so a resume loses at most one evaluation interval).
    last_ckpt = ModelCheckpoint(
        dirpath=run_dir / "checkpoints",
        filename="last",
        monitor=None,
        save_top_k=1,
        save_on_train_epoch_end=not cfg.step_based,
        enable_version_counter=False,
    )
    logger = CSVLogger(run_dir, name="logs")
    trainer = _trainer(cfg, run_dir, [EpochSeed(cfg.seed), history, last_ckpt], logger)
    last = run_dir / "checkpoints" / "last.ckpt"
    resume = last.is_file()
    if verbose and trainer.is_global_zero:
        n = sum(p.numel() for p in module.parameters())
        print(
            f"{cfg.name}: {cfg.model.attention} attention, {n / 1e6:.2f}M parameters, {cfg.data.name} "
            f"train/val/test {dm.sizes.get('train', 0)}/{dm.sizes.get('val', 0)}/{dm.sizes['test']}, "
            f"{protocol.label}\nrun directory: {run_dir}" + (f"\nresuming from {last}" if resume else ""),
            flush=True,
        )
    t0 = time.time()
    trainer.fit(module, dm, ckpt_path=str(last) if resume else None)
    best = protocol.best(history.rows)
    summary: dict[str, Any] = {
        "name": cfg.name,
        "task": cfg.task,
        "dataset": cfg.data.name,
        "attention": cfg.model.attention,
        "protocol": protocol.name,
        "protocol_label": protocol.label,
        "seed": cfg.seed,
        "epochs": len(history.rows) if not cfg.step_based else history.rows[-1]["epoch"] + 1,
        "best_epoch": best["epoch"] + 1,
        "run_dir": str(run_dir),
        "fit_seconds_this_attempt": round(time.time() - t0, 1),
    }
    if cfg.step_based:
        summary.update(steps=int(trainer.global_step), best_step=int(best["step"]), evaluations=len(history.rows))
    if cfg.task != "uea":
        summary["data"] = {k: v for k, v in dm.info.items() if isinstance(v, str | int | float | bool)}
        summary["majority_class_test_acc"] = _majority_baseline(dm)
    if protocol.name == "heldout":
        summary["val_acc"] = best["val/acc"]
        res = trainer.test(module, dm, ckpt_path=str(history.best_path), verbose=False)
        summary["test_acc"] = float(res[0]["test/acc"])
        summary["test_loss"] = float(res[0]["test/loss"])
    else:
        summary["test_acc"] = best["test/acc"]
        summary["test_loss"] = best["test/loss"]
    if trainer.is_global_zero:
        atomic_write_json(run_dir / "summary.json", summary)
        if verbose:
            where = (
                f"step {summary['best_step']} of {summary['steps']}"
                if cfg.step_based
                else f"epoch {summary['best_epoch']} of {summary['epochs']}"
            )
            base = summary.get("majority_class_test_acc")
            base_txt = f"; majority class {100 * base:.2f}%" if base is not None else ""
            print(
                f"\n{cfg.data.name} {cfg.name} [{protocol.label}]: test accuracy {100 * summary['test_acc']:.2f}% "
                f"({where}{base_txt})\nrun directory: {run_dir} "
                f"(config.yaml, history.csv, logs/*/metrics.csv, checkpoints/, summary.json)",
                flush=True,
            )
    return summary


def evaluate(
    cfg: RunConfig, stage: str, ckpt: str = "best", run_dir: str | os.PathLike | None = None
) -> list[dict[str, float]]:
    """``validate`` (the protocol's per-epoch split) or ``test`` a checkpoint of a run (``best``, ``last`` or a path)."""
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if ckpt in ("best", "last") else Path(ckpt)
    if ckpt in ("best", "last") and not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} not found; train first with `primaldual fit` and the same config, or pass --run-dir"
        )
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found; train first with `primaldual fit` and the same config")
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup(stage)
    module = build_module(cfg, dm)
    trainer = _trainer(cfg, run_dir, [])
    run = trainer.validate if stage == "validate" else trainer.test
    return run(module, dm, ckpt_path=str(path), weights_only=False)


def _majority_baseline(dm: LRADataModule) -> float:
    """Test accuracy of always predicting the most frequent training class."""
    majority = np.bincount(labels_of(dm.datasets["train"])).argmax()
    return float((labels_of(dm.datasets["test"]) == majority).mean())


def set_threads(n: int | None) -> None:
    """Limit torch's intra-op threads (e.g. 1 per run when two runs share two cores)."""
    if n:
        torch.set_num_threads(n)
