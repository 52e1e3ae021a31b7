"""The generic runner: config -> run directory -> ``Trainer.fit`` (resuming from ``last.ckpt``) -> summary.

It knows no task by name: the registered task (:mod:`primaldual.tasks`) builds the data module, the model and the
Lightning module, names the selection protocol and turns the result into its summary and report. Epoch-based runs
evaluate after every epoch; step-based runs (``trainer.max_steps > 0``) every ``trainer.val_check_interval`` steps
(default a tenth of the run). With the heldout protocol the selected checkpoint is evaluated once on test.

Nothing is written before the config is validated and the data and model are built: a bad value, missing data or a
model that cannot be built leave no run directory behind. The running ``fit`` holds ``run.lock`` (a second process
on the same directory, ``--fresh`` included, is refused with the holder's PID); a resume reads ``last.ckpt``, or,
when that is unreadable, ``last.prev.ckpt``; every checkpoint is read in the safe mode (no code in it runs). The
run directory's layout: :mod:`primaldual.train.rundir`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from ..options import check_int
from ..tasks.base import get_task
from ..utils.io import atomic_write_json
from .callbacks import AtomicCheckpointIO, EpochHistory, EpochSeed, StepTimer
from .checkpoints import check_fits, load_checkpoint, resume_checkpoint
from .config import ConfigError, RunConfig, load_config
from .lock import RunLock
from .logs import loggers, progress_bar, quiet_dependencies
from .rundir import check_run_dir, default_run_dir, is_launcher_process, prepare_run_dir, run_config

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
    "usable_cores",
    "ThreadsOversubscribedWarning",
]


def build_datamodule(cfg: RunConfig) -> L.LightningDataModule:
    """The task's data module (not yet set up)."""
    return get_task(cfg.task).datamodule(cfg)


def build_model(cfg: RunConfig, dm: L.LightningDataModule) -> nn.Module:
    """The task model of ``cfg.model`` sized from the (set-up) data module."""
    return get_task(cfg.task).model(cfg, dm)


def build_module(cfg: RunConfig, dm: L.LightningDataModule) -> L.LightningModule:
    """Model + loss + optimiser / schedule settings in the task's Lightning module."""
    return get_task(cfg.task).module(cfg, dm)


def _safe(method: Any) -> dict[str, bool]:
    """``weights_only=True`` for a Trainer method that takes it (Lightning >= 2.6). The loads are safe either way:
    they go through :class:`AtomicCheckpointIO`, which always loads with ``weights_only=True``."""
    return {"weights_only": True} if "weights_only" in inspect.signature(method).parameters else {}


def _val_interval(cfg: RunConfig) -> int:
    return cfg.trainer.val_check_interval or max(1, cfg.trainer.max_steps // 10)


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
    bar, bar_callbacks = progress_bar(t.enable_progress_bar)
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
        enable_progress_bar=bar,
        logger=logger if logger is not None else False,
        callbacks=[*callbacks, *bar_callbacks],
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
    before_training: Callable[[L.LightningModule, Path, bool], None] | None = None,
) -> dict[str, Any]:
    """Train (or resume) one run and return its summary (also written to ``summary.json``).

    Args:
        cfg: the resolved config. run_dir: default :func:`default_run_dir`. fresh: delete the run dir first.
        verbose: per-epoch lines and the final report on stdout (rank 0).
        before_training: ``f(module, run_dir, resuming)``, called under the run's lock once the run directory is
            prepared, before training (``resuming``: a checkpoint will be restored over the module's weights). On a
            fresh start it may set the model's weights (``primaldual convert`` starts stage 2 from its stage-1 weights
            this way) and write its own entries.
    """
    # before the data and the lock: a directory that is not ours is never touched
    run_dir = check_run_dir(run_dir if run_dir is not None else default_run_dir(cfg), fresh)
    task = get_task(cfg.task)
    protocol = task.protocol(cfg.protocol)
    launcher = is_launcher_process()
    check_machine(cfg)
    lock = RunLock(run_dir)
    action = "--fresh refused" if fresh else "refused"
    if launcher:
        lock.check_free(action)  # before the (possibly slow) data set-up; taken for real below
    # Data and model first: nothing is written until both are built. (Seeding first keeps the model's
    # initialisation what it always was.)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    dm = task.datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    module = task.module(cfg, dm)
    with lock.acquire(action) if launcher else contextlib.nullcontext(), quiet_dependencies():
        prepare_run_dir(cfg, run_dir, fresh, verbose)
        if launcher:
            task.on_run_dir(cfg, dm, run_dir)
        return _fit(cfg, run_dir, protocol, dm, module, verbose, before_training)


def _fit(
    cfg: RunConfig,
    run_dir: Path,
    protocol: Any,
    dm: Any,
    module: L.LightningModule,
    verbose: bool,
    before_training: Callable[[L.LightningModule, Path, bool], None] | None = None,
):
    task = get_task(cfg.task)
    note = (lambda msg: print(msg, flush=True)) if verbose and is_launcher_process() else (lambda msg: None)
    resume = resume_checkpoint(run_dir, note)
    if resume is not None:  # before Lightning restores it: a checkpoint of another model is one clear line
        hint = "it was written by another model; pass --fresh to start the run over, or another --run-dir"
        check_fits(module, load_checkpoint(resume), resume, str(run_dir / "config.yaml"), hint)
    if before_training is not None and is_launcher_process():
        before_training(module, run_dir, resume is not None)
    every = "val" if cfg.step_based else "epoch"
    metrics = task.history_metrics(cfg)
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
    logger = loggers(cfg.trainer.logger, run_dir, cfg.name)
    seeder = EpochSeed(cfg.seed, cfg.trainer.accumulate_grad_batches)
    timer = StepTimer()
    trainer = _trainer(cfg, run_dir, [seeder, history, last_ckpt, timer], logger)
    if cfg.trainer.compile:
        say = note if trainer.is_global_zero else (lambda msg: None)
        _compile(module, task.example_inputs(dm), trainer, say, cfg.trainer.compile_mode)
    if verbose and trainer.is_global_zero:
        n = sum(p.numel() for p in module.parameters())
        trained = sum(p.numel() for p in module.parameters() if p.requires_grad)
        size = f"{n / 1e6:.2f}M parameters" + (f" ({trained / 1e6:.3f}M trained)" if trained != n else "")
        print(
            f"{cfg.name}: {cfg.model.attention} attention, {size}, {task.describe_data(cfg, dm)}, "
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
        **timer.summary(),  # this attempt's steps
    }
    if cfg.step_based:
        summary.update(steps=int(trainer.global_step), best_step=int(best["step"]), evaluations=len(history.rows))
    summary.update(_ksvd_summary(module.model, history.rows))
    test = None
    if protocol.eval_split != "test" and protocol.test_once:  # the selected checkpoint, evaluated once on test
        test = trainer.test(module, dm, ckpt_path=str(history.best_path), verbose=False, **_safe(trainer.test))[0]
    summary.update(task.results(cfg, dm, module, protocol, best, test))
    if trainer.is_global_zero:
        summary = _keep_timing(run_dir / "summary.json", summary)
        atomic_write_json(run_dir / "summary.json", summary)
        if verbose:
            print(task.report(cfg, summary, protocol), flush=True)
    return summary


# what an attempt measures of its own training steps: a later attempt that trains no step (a finished run started
# again, to print its result) keeps the earlier figures instead of replacing them by nothing
_TIMING_KEYS = (
    "fit_seconds_this_attempt",
    "train_steps_timed",
    "train_step_seconds",
    "peak_memory_mb",
    "peak_memory_method",
)


def _keep_timing(path: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with the timing and memory fields of the ``summary.json`` at ``path`` when this attempt timed no
    training step (an unreadable or foreign earlier file is ignored: it is replaced, as before)."""
    if summary.get("train_steps_timed") or not path.is_file():
        return summary
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return summary
    if not isinstance(old, dict) or not old.get("train_steps_timed"):
        return summary
    kept = {k: old[k] for k in _TIMING_KEYS if k in old}
    return {**summary, **kept}


def _ksvd_summary(model: nn.Module, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The KSVD term beside the task loss, from the last history row, for models with primal layers: ``ksvd_J2``
    (mean over the primal layers of their unweighted term J^2 at the last logged training step or epoch),
    ``ksvd_rms_J`` (its square root: |J| for the global reduction, the RMS of the per-sample J for the per-sample
    one), ``ksvd_eta`` and ``ksvd_eta_J2`` (what the training loss added), and ``task_loss`` where the row has it.
    Empty for models without primal layers."""
    from ..aux_loss import AuxLossMixin

    etas = sorted(
        {
            float(m.aux_loss_weight)
            for m in model.modules()
            if isinstance(m, AuxLossMixin) and m.aux_loss_group == "ksvd"
        }
    )
    last = rows[-1] if rows else {}
    j2 = last.get("train/ksvd_J2", last.get("train/ksvd_J2_step"))
    if not etas or j2 is None:
        return {}
    eta = etas[0] if len(etas) == 1 else etas
    out: dict[str, Any] = {"ksvd_J2": j2, "ksvd_rms_J": j2**0.5, "ksvd_eta": eta}
    if len(etas) == 1:
        out["ksvd_eta_J2"] = etas[0] * j2
    if "train/task_loss" in last:
        out["task_loss"] = last["train/task_loss"]
    return out


def _compile(module: L.LightningModule, example: list[Any], trainer: L.Trainer, note: Any, mode: str) -> None:
    """``trainer.compile``: the model compiled in place on the run's device (``trainer.compile_mode``), checked on one
    batch of its inputs."""
    from .compile import compile_model

    device = trainer.strategy.root_device
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in example]
    module.model.to(device)
    compile_model(module.model, inputs, note, mode)


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
    task = get_task(cfg.task)
    # absolute, as fit writes it into the checkpoints (else Lightning warns that their dirpath "has changed")
    run_dir = (Path(run_dir) if run_dir is not None else default_run_dir(cfg)).resolve()
    if not isinstance(ckpt, str) or not ckpt.strip():
        raise ValueError(f"--ckpt: expected best, last or a checkpoint path, got {ckpt!r}")
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if ckpt in ("best", "last") else Path(ckpt)
    if ckpt in ("best", "last") and not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} not found; train first with `primaldual fit` and the same config, or pass --run-dir"
        )
    if not path.is_file() and ckpt not in ("best", "last"):
        raise FileNotFoundError(f"--ckpt: no checkpoint file {path} (--ckpt takes best, last or a .ckpt file's path)")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found; train first with `primaldual fit` and the same config")
    check_machine(cfg)
    _same_model(cfg, run_dir)
    state = load_checkpoint(path)  # safe; refuses before any data is read
    dm = task.datamodule(cfg)
    dm.prepare_data()
    dm.setup(stage)
    module = task.module(cfg, dm)
    where = str(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else "the given config"
    check_fits(module, state, path, where)
    del state
    with quiet_dependencies():
        trainer = _trainer(cfg, run_dir, [])
        run = trainer.validate if stage == "validate" else trainer.test
        return run(module, dm, ckpt_path=str(path), verbose=False, **_safe(run))  # the caller prints the metrics


class ThreadsOversubscribedWarning(UserWarning):
    """Intra-op threads plus data-loader workers exceed the cores this process may use."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it, else the CPU count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_threads(n: int | None, flag: str = "--threads", workers: int = 0) -> int:
    """torch's intra-op threads: ``n`` when given (e.g. 1 per run when two runs share two cores), else torch's
    default; returns the count. With ``workers`` data-loader worker processes, threads + workers above the cores is a
    :class:`ThreadsOversubscribedWarning`: busy workers (decoding, augmentation) then slow every multi-threaded kernel
    several-fold. The default is not lowered for them: a light worker (ListOps tokens) is mostly idle, and one thread
    fewer made a reduced ListOps run 1.35x slower on 2 cores (``benchmarks/worker_threads.py``, docs/benchmarks.md).
    """
    if check_int(flag, n, low=1, allow_none=True) is not None:
        torch.set_num_threads(n)
    threads, cores = torch.get_num_threads(), usable_cores()
    if workers > 0 and threads + workers > cores:
        warnings.warn(
            ThreadsOversubscribedWarning(
                f"{threads} intra-op threads + {workers} data-loader workers exceed the {cores} cores this process "
                f"may use; if the workers are busy (image decoding, augmentation), pass --threads "
                f"{max(1, cores - workers)} (benchmarks/worker_threads.py measures both)"
            ),
            stacklevel=2,
        )
    return threads


def check_machine(cfg: RunConfig) -> None:
    """Raise :class:`ConfigError` when ``trainer.accelerator`` names hardware this machine does not have, or
    ``trainer.devices`` asks for more devices of it than there are (checked when a run starts, not on load: a run's
    config stays loadable, for analysis, on a machine without its accelerator)."""
    acc = cfg.trainer.accelerator
    if acc in ("auto", "cpu"):
        return
    from lightning.pytorch.accelerators import AcceleratorRegistry, CUDAAccelerator, MPSAccelerator

    classes = [CUDAAccelerator, MPSAccelerator] if acc == "gpu" else [AcceleratorRegistry[acc]["accelerator"]]
    available = [c for c in classes if c.is_available()]
    if not available:
        raise ConfigError(
            f"trainer.accelerator: {acc!r}, but this machine has no such device (torch sees none); "
            "use --trainer.accelerator cpu or auto"
        )
    devices = cfg.trainer.devices
    count = max(c.auto_device_count() for c in available)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > count:
        raise ConfigError(f"trainer.devices: {devices} {acc} devices requested, but this machine has {count}")
