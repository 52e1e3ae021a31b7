"""One run: config -> run directory -> Trainer.fit (resuming from ``last.ckpt`` if present) -> summary.

UEA runs are epoch-based; LRA and language-model (``lm``) runs are step-based (``trainer.max_steps``, an evaluation
and a checkpoint every ``trainer.val_check_interval`` steps, default a tenth of the run), with the heldout protocol:
the best-validation checkpoint (LRA: accuracy; LM: lowest loss) is evaluated once on test.

Nothing is written before the config is validated and the data and model are built: a bad value, missing data or a
model that cannot be built leave no run directory behind. The running ``fit`` holds ``run.lock`` (a second process
on the same directory, ``--fresh`` included, is refused with the holder's PID); a resume reads ``last.ckpt``, or,
when that is unreadable, ``last.prev.ckpt``; every checkpoint is read in the safe mode (no code in it runs).

Run directory (default ``runs/<task>/<dataset>/<name>-<protocol>-seed<k>-<config hash>``)::

    config.yaml            the resolved config (a restart with a different config is refused)
    run.lock               present while a ``fit`` runs (its PID, host, start time and command)
    history.csv            one row per epoch / evaluation (train / eval metrics), complete across resumes
    logs/version_<i>/      Lightning CSVLogger output (metrics.csv per step/epoch, hparams.yaml); one per attempt
    checkpoints/last.ckpt  written after every epoch / evaluation, atomically; the same command resumes from it
    checkpoints/last.prev.ckpt  the one before (the fallback when last.ckpt is unreadable)
    checkpoints/best.ckpt  the epoch / evaluation the protocol selects
    summary.json           the result (protocol label, best epoch or step, test accuracy or perplexity, ...)
    tokenizer.json / dict.txt   language models: the run's tokenizer (for ``primaldual generate``)
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from ..models import RetrievalClassifier, SequenceClassifier, TimeSeriesClassifier, VisionClassifier
from ..options import check_int
from ..utils.io import atomic_write_json, atomic_write_text
from .callbacks import AtomicCheckpointIO, EpochHistory, EpochSeed
from .checkpoints import check_fits, load_checkpoint, resume_checkpoint
from .config import (
    LM_TASK,
    RL_TASK,
    VISION_TASK,
    ConfigError,
    RunConfig,
    check_machine,
    dump_config,
    load_config,
)
from .datamodule import UEADataModule
from .lm import LanguageModelModule, LMDataModule, build_lm, lm_report, lm_results
from .lock import LOCK_NAME, RunLock
from .lra_data import LRADataModule, labels_of
from .module import ClassificationModule
from .protocols import get_protocol
from .vision import VisionDataModule, VisionModule

__all__ = [
    "build_datamodule",
    "build_model",
    "build_module",
    "default_run_dir",
    "evaluate",
    "fit",
    "prepare_run_dir",
    "run_config",
    "set_threads",
]


def default_run_dir(cfg: RunConfig, base: str | os.PathLike = "runs") -> Path:
    """``<base>/<task>/<dataset>/<name>-<protocol>-seed<k>-<hash>``: the same command always maps to the same dir."""
    return Path(base) / cfg.task / cfg.data.name / f"{cfg.name}-{cfg.protocol}-seed{cfg.seed}-{cfg.fingerprint()}"


def _is_launcher_process() -> bool:
    """True in the process the user started (not a DDP worker re-launched by Lightning)."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def build_datamodule(cfg: RunConfig) -> UEADataModule | LRADataModule | LMDataModule:
    """The task's data module (not yet set up)."""
    if cfg.task == "uea":
        return UEADataModule(cfg.data, cfg.protocol, cfg.seed)
    if cfg.task == LM_TASK:
        return LMDataModule(cfg.data, cfg.seed)
    if cfg.task == VISION_TASK:
        return VisionDataModule(cfg.data, cfg.seed)
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
    if kind == "lm":
        return build_lm(cfg, dm.vocab_size)
    if kind == "timeseries":
        return TimeSeriesClassifier(dm.num_channels, dm.num_classes, dm.max_len, **common)
    classes = _from_data(m.num_classes, dm.num_classes, "model.num_classes")
    if kind == "vit":
        if dm.image_size % m.patch_size:
            raise ConfigError(f"model.patch_size: {m.patch_size} must divide the image side ({dm.image_size})")
        return VisionClassifier(
            dm.image_size,
            m.patch_size,
            classes,
            in_channels=dm.channels,
            drop_path=m.drop_path,
            patch_kernel=m.patch_kernel,
            stem=m.stem,
            mean=dm.mean,
            std=dm.std,
            **common,
        )
    vocab = m.vocab_size if m.vocab_size is not None else dm.vocab_size
    if vocab < dm.vocab_size:
        raise ConfigError(f"model.vocab_size: {vocab} is smaller than the data's vocabulary ({dm.vocab_size})")
    tokens = {"pooling": m.pooling, "norm_first": m.norm_first, "positions": m.positions, **common}
    if kind == "retrieval":
        return RetrievalClassifier(vocab, dm.max_len, classes, **tokens)
    return SequenceClassifier(vocab, classes, dm.max_len, **tokens)


def build_module(cfg: RunConfig, dm: UEADataModule | LRADataModule | LMDataModule) -> ClassificationModule:
    """Model + optimiser / schedule settings in the Lightning module."""
    total = cfg.trainer.max_steps if cfg.step_based else None
    if cfg.task == LM_TASK:
        model = build_model(cfg, dm)
        return LanguageModelModule(model, cfg.optim, cfg.schedule, total, dm.split_bytes, dm.split_targets)
    if cfg.task == VISION_TASK:
        return VisionModule(
            build_model(cfg, dm),
            cfg.optim,
            cfg.schedule,
            total,
            cfg.augment,
            num_classes=dm.num_classes,
            image_size=dm.image_size,
            seed=cfg.seed,
        )
    return ClassificationModule(build_model(cfg, dm), cfg.optim, dm.eval_splits, cfg.schedule, total)


def _safe(method: Any) -> dict[str, bool]:
    """``weights_only=True`` for a Trainer method that takes it (Lightning >= 2.6). The loads are safe either way:
    they go through :class:`AtomicCheckpointIO`, which always loads with ``weights_only=True``."""
    return {"weights_only": True} if "weights_only" in inspect.signature(method).parameters else {}


def _val_interval(cfg: RunConfig) -> int:
    return cfg.trainer.val_check_interval or max(1, cfg.trainer.max_steps // 10)


def _has_progress(run_dir: Path) -> bool:
    """Whether a run directory holds anything a restart would resume or report (a checkpoint or a summary)."""
    ck = run_dir / "checkpoints"
    return (run_dir / "summary.json").is_file() or any(
        (ck / n).is_file() for n in ("last.ckpt", "last.prev.ckpt", "best.ckpt")
    )


def _clear_run_dir(run_dir: Path) -> None:
    """Delete everything in ``run_dir`` except the lock this process holds."""
    for p in run_dir.iterdir():
        if p.name == LOCK_NAME:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def prepare_run_dir(cfg: RunConfig, run_dir: Path, fresh: bool, verbose: bool) -> None:
    """``--fresh`` clearing and ``config.yaml`` (written, or compared with the one there). The caller holds the lock."""
    text = dump_config(cfg)
    launcher = _is_launcher_process()
    if fresh and run_dir.exists() and launcher:
        if not (run_dir / "config.yaml").is_file() and any(p.name != LOCK_NAME for p in run_dir.iterdir()):
            raise ConfigError(
                f"--fresh refused: {run_dir} is not a run directory (no config.yaml), so nothing in it is deleted; "
                "pass a run directory, or another --run-dir"
            )
        _clear_run_dir(run_dir)
    saved = run_dir / "config.yaml"
    if saved.exists() and saved.read_text() != text and _same_run(saved.read_text(), text):
        if launcher:  # only how it runs changed (compilation, progress bar): the record follows the latest attempt
            atomic_write_text(saved, text)
    elif saved.exists() and saved.read_text() != text:
        if not launcher or _has_progress(run_dir):
            raise ConfigError(
                f"{run_dir} holds a run with a different config ({saved}); pass --fresh to start over there "
                f"or --run-dir to use another directory"
            )
        # an earlier attempt that failed before its first checkpoint: nothing to resume, so it is replaced
        if verbose:
            print(f"{run_dir}: an earlier attempt with another config left no checkpoint; starting over", flush=True)
        _clear_run_dir(run_dir)
    if not saved.exists() and launcher:
        atomic_write_text(saved, text)


# trainer keys that change how a run executes, not what it computes: a resume may switch them
_HOW_KEYS = ("enable_progress_bar", "compile")


def _same_run(saved: str, text: str) -> bool:
    """Whether two config.yaml texts describe the same run, apart from :data:`_HOW_KEYS`."""
    try:
        a, b = yaml.safe_load(saved), yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    for d in (a, b):
        for key in _HOW_KEYS:
            (d.get("trainer") or {}).pop(key, None)
    return a == b


def _trainer(cfg: RunConfig, run_dir: Path, callbacks: list[L.Callback], logger: Any = None) -> L.Trainer:
    t = cfg.trainer
    if cfg.step_based:
        # Evaluate every K steps across epoch boundaries; max_epochs -1 = unbounded (max_steps stops the run).
        # Lightning counts val_check_interval in batches: K optimiser steps are K * accumulate_grad_batches batches.
        when: dict[str, Any] = {
            "max_steps": t.max_steps,
            "max_epochs": -1,
            "val_check_interval": _val_interval(cfg) * t.accumulate_grad_batches,
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
        accumulate_grad_batches=t.accumulate_grad_batches,
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
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    if cfg.task == RL_TASK:  # offline RL: its own loop (rollout evaluation), the same run directory and lock
        from .rl import fit_rl

        return fit_rl(cfg, run_dir, fresh=fresh, verbose=verbose)
    protocol = get_protocol(cfg.protocol, cfg.task)
    launcher = _is_launcher_process()
    check_machine(cfg)
    lock = RunLock(run_dir)
    action = "--fresh refused" if fresh else "refused"
    if launcher:
        lock.check_free(action)  # before the (possibly slow) data set-up; taken for real below
    # Data and model first: nothing is written until both are built. (Seeding first keeps the model's
    # initialisation what it always was.)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    module = build_module(cfg, dm)
    with lock.acquire(action) if launcher else contextlib.nullcontext():
        prepare_run_dir(cfg, run_dir, fresh, verbose)
        if launcher and isinstance(dm, LMDataModule):
            dm.save_tokenizer(run_dir)  # primaldual generate needs only the run directory
        return _fit(cfg, run_dir, protocol, dm, module, verbose)


def _fit(cfg: RunConfig, run_dir: Path, protocol: Any, dm: Any, module: ClassificationModule, verbose: bool):
    note = (lambda msg: print(msg, flush=True)) if verbose and _is_launcher_process() else (lambda msg: None)
    resume = resume_checkpoint(run_dir, note)
    every = "val" if cfg.step_based else "epoch"
    lm = cfg.task == LM_TASK
    metrics = ("loss", "ppl") if lm else ("loss", "acc")
    history = EpochHistory(run_dir, protocol, dm.eval_splits, verbose=verbose, every=every, metrics=metrics)
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
    seeder = EpochSeed(cfg.seed, cfg.trainer.accumulate_grad_batches)
    trainer = _trainer(cfg, run_dir, [seeder, history, last_ckpt], logger)
    if cfg.trainer.compile:
        _compile(module, dm, trainer, note if trainer.is_global_zero else (lambda msg: None))
    if verbose and trainer.is_global_zero:
        n = sum(p.numel() for p in module.parameters())
        print(
            f"{cfg.name}: {cfg.model.attention} attention, {n / 1e6:.2f}M parameters, {cfg.data.name} "
            f"train/val/test {dm.sizes.get('train', 0)}/{dm.sizes.get('val', 0)}/{dm.sizes['test']}, "
            f"{protocol.label}\nrun directory: {run_dir}" + (f"\nresuming from {resume}" if resume else ""),
            flush=True,
        )
    t0 = time.time()
    trainer.fit(module, dm, ckpt_path=str(resume) if resume else None, **_safe(trainer.fit))
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
    if lm:
        res = trainer.test(module, dm, ckpt_path=str(history.best_path), verbose=False, **_safe(trainer.test))
        summary["data"] = {k: v for k, v in dm.info.items() if isinstance(v, str | int | float | bool)}
        summary.update(lm_results(dm, getattr(module, "results", {}).get("test", res[0]), best))
        if trainer.is_global_zero:
            atomic_write_json(run_dir / "summary.json", summary)
            if verbose:
                print(lm_report(cfg, summary, protocol.label), flush=True)
        return summary
    if cfg.task != "uea":
        summary["data"] = {k: v for k, v in dm.info.items() if isinstance(v, str | int | float | bool)}
        summary["majority_class_test_acc"] = _majority_baseline(dm)
    if protocol.name == "heldout":
        summary["val_acc"] = best["val/acc"]
        res = trainer.test(module, dm, ckpt_path=str(history.best_path), verbose=False, **_safe(trainer.test))
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


def _compile(module: ClassificationModule, dm: Any, trainer: L.Trainer, note: Any) -> None:
    """``trainer.compile``: the model compiled in place on the run's device, checked on the first validation batch."""
    from .compile import compile_model

    device = trainer.strategy.root_device
    batch = next(iter(dm.val_dataloader()[0]))
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in batch[:-1]]
    module.model.to(device)
    compile_model(module.model, inputs, note)


def run_config(run_dir: str | os.PathLike, overrides: list[str] | None = None) -> RunConfig:
    """The config a run was trained with: its ``config.yaml`` (plus ``overrides``)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} not found")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise FileNotFoundError(f"{run_dir}: no config.yaml; expected a run directory written by `primaldual fit`")
    return load_config(saved, overrides)


def _same_model(cfg: RunConfig, run_dir: Path) -> None:
    """Refuse to evaluate a run with a config whose model differs from the one it was trained with."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return
    try:
        trained = load_config(saved)
    except ConfigError:
        return  # an old or edited config.yaml: the checkpoint check below still catches a mismatch
    if trained.task != cfg.task:
        key, there, here = "task", trained.task, cfg.task
    else:
        key = next((k for k in vars(trained.model) if getattr(trained.model, k) != getattr(cfg.model, k)), None)
        if key is None:
            return
        key, there, here = f"model.{key}", getattr(trained.model, key), getattr(cfg.model, key)
    raise ConfigError(
        f"{run_dir} was trained with another config than the one given ({key}: {there!r} there, {here!r} here); "
        "leave out --config to evaluate it with its own config.yaml"
    )


def evaluate(
    cfg: RunConfig | None, stage: str, ckpt: str = "best", run_dir: str | os.PathLike | None = None
) -> list[dict[str, float]]:
    """``validate`` (the protocol's per-epoch split) or ``test`` a checkpoint of a run (``best``, ``last`` or a path).

    ``cfg`` None: the run's own ``config.yaml`` (``run_dir`` required). The checkpoint is read in the safe mode and
    checked against the model before anything runs.
    """
    if cfg is None:
        if run_dir is None:
            raise ValueError("evaluate: give a config or a run directory")
        cfg = run_config(run_dir)
    if cfg.task == RL_TASK:
        raise ConfigError(
            "offline_rl runs are evaluated by rollouts during fit (history.csv; the final checkpoint's scores are in "
            "summary.json); validate / test do not apply"
        )
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if ckpt in ("best", "last") else Path(ckpt)
    if ckpt in ("best", "last") and not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} not found; train first with `primaldual fit` and the same config, or pass --run-dir"
        )
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found; train first with `primaldual fit` and the same config")
    check_machine(cfg)
    _same_model(cfg, run_dir)
    state = load_checkpoint(path)  # safe; refuses before any data is read
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup(stage)
    module = build_module(cfg, dm)
    where = str(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else "the given config"
    check_fits(module, state, path, where)
    del state
    trainer = _trainer(cfg, run_dir, [])
    run = trainer.validate if stage == "validate" else trainer.test
    return run(module, dm, ckpt_path=str(path), **_safe(run))


def _majority_baseline(dm: LRADataModule) -> float:
    """Test accuracy of always predicting the most frequent training class."""
    majority = np.bincount(labels_of(dm.datasets["train"])).argmax()
    return float((labels_of(dm.datasets["test"]) == majority).mean())


def set_threads(n: int | None, flag: str = "--threads") -> None:
    """Limit torch's intra-op threads (e.g. 1 per run when two runs share two cores); None leaves torch's default."""
    if check_int(flag, n, low=1, allow_none=True) is not None:
        torch.set_num_threads(n)
