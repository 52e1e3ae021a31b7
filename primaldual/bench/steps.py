"""Training-step benchmark of named training configs: ms per step, interleaved in one process.

``primaldual bench steps CONFIG [CONFIG ...]`` builds each config's data module and Lightning module exactly as
``primaldual fit`` does (:func:`~primaldual.train.run.build_datamodule`, ``prepare_data``, ``setup("fit")``,
:func:`~primaldual.train.run.build_module`, ``torch.manual_seed(0)`` before each build) and times its full training
step on one fixed batch (the first ``data.batch_size`` training samples, unshuffled; ``--batch`` sets the size for
every config alike).

What one timed step is: the module's ``training_loss(batch, batch_idx)`` (for task ``vision`` this includes the
DeiT batch augmentation: mixup / cutmix, RandAugment, erasing), i.e. the forward pass, the task loss and the
layers' auxiliary (KSVD) loss; ``loss.backward()``; the optimiser step (``configure_optimizers``' optimiser with its
parameter groups; the learning-rate schedule is not stepped) and ``zero_grad(set_to_none=True)``.

With ``trainer.compile: true`` in a config (or ``--set trainer.compile=true``) its model is compiled as a run
compiles it (:func:`~primaldual.train.compile.compile_model`: dropout swapped for ``CounterDropout`` on CPU, checked
against eager on the first validation batch, eager with one line where that fails); the warm-up steps pay for the
compilation, so give ``--warmup`` 2 or more, and the table marks the config "(compiled)".

What is not timed: data loading and collation (the same batch is reused), evaluation, logging, checkpointing and the
rest of the Lightning loop (callbacks, hooks, gradient clipping, accumulation), and the config's
``trainer.precision`` / ``trainer.accelerator``: every step runs in float32 on ``--device`` (default the CPU, with
``--threads`` torch threads, default 1; ``cuda``: the first GPU, synchronised before and after each timed stretch).
Build and warm-up steps (``--warmup``) are excluded. Peak memory per config (``peak_mb``): the most any of its
timed stretches needed above what was allocated before it (:class:`~primaldual.utils.memory.PeakMemory`: CUDA's
``max_memory_allocated``, or the process's peak resident set on the CPU), so with several configs built at once it
is each one's activations, gradients and optimiser growth, not the resident models.

Why interleaved: on a shared or noisy machine the speed drifts over minutes (other jobs, thermal and frequency
changes), so timing config A for a minute and then config B folds the drift into the ratio. Instead all configs
are built up front, and each of ``--rounds`` rounds times ``--steps`` consecutive steps of every config in turn,
the order rotated by one each round so that no config always runs first or last; a config's time is the median
over rounds of its per-step mean, with the spread (min / max over rounds) beside it. The ratio to the first config
is of the medians. Interleaving cancels slow drift, not contention: take timings with nothing else running on the
machine (and the same ``--threads`` for every comparison), and read a min-max spread wider than the differences
between configs as "no measurable difference".

Output (``--out``, default ``runs/bench/steps``): ``steps.json`` (machine, versions, the command, settings and one
record per config: median / min / max / per-round ms per step, ratio to the first, parameter count, attention plan,
batch) and ``steps.md`` (the table that is also printed).
"""

from __future__ import annotations

import argparse
import gc
import shlex
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "StepCase",
    "add_arguments",
    "attention_plan",
    "build_case",
    "parse_sets",
    "run_from_args",
    "run_steps",
    "steps_table",
    "time_steps",
]

TABLE_HEADER = "| config | attention | params | ms / step (median) | min-max | ratio to first | peak MiB |"


@dataclass
class StepCase:
    """One built config: its module, optimiser and fixed training batch."""

    spec: str
    cfg: Any  # RunConfig
    module: Any  # the Lightning module (has ``training_loss``)
    optimizer: Any  # torch.optim.Optimizer
    batch: tuple[Any, ...]
    params: int
    batch_size: int
    compiled: bool = False  # trainer.compile was set and the model compiled (not fallen back to eager)
    device: str = "cpu"


def parse_sets(items: list[str] | None) -> list[str]:
    """``["KEY=VALUE", ...]`` (``--set``) -> the ``load_config`` overrides ``["--KEY", "VALUE", ...]``."""
    overrides: list[str] = []
    for item in items or []:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not eq or not key:
            raise ValueError(f"--set: expected KEY=VALUE (e.g. --set trainer.precision=32-true), got {item!r}")
        overrides += [f"--{key}", value]
    return overrides


def attention_plan(attention: Any) -> str:
    """The attention plan in a few words: ``softmax``; a per-layer list run-length encoded, ``softmax, primal x2``."""
    if isinstance(attention, str):
        return attention
    if not isinstance(attention, (list, tuple)) or not attention:
        return str(attention)
    runs: list[list[Any]] = []
    for name in attention:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ", ".join(f"{name} x{n}" if n > 1 else str(name) for name, n in runs)


def build_case(
    spec: str, overrides: list[str] | None = None, batch_size: int | None = None, device: str = "cpu"
) -> StepCase:
    """Load config ``spec`` (with ``overrides``), build its data and module as a run does, and take the batch.

    Raises:
        ConfigError: unknown config or key. ValueError: a task without a split of examples (offline RL), a
            module without ``training_loss``, an empty training split. MissingDataError: data not available.
    """
    import torch
    from torch.utils.data import DataLoader

    from ..tasks.base import get_task
    from ..train.config import load_config
    from ..train.run import build_datamodule, build_module

    cfg = load_config(spec, overrides)
    if not get_task(cfg.task).example_splits:
        raise ValueError(
            f"{spec}: task {cfg.task!r} has no split of examples to batch (benchmarks/dt_update.py times the "
            "Decision Transformer's update); bench steps times the tasks with train / val / test examples"
        )
    torch.manual_seed(0)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    module = build_module(cfg, dm)
    if not callable(getattr(module, "training_loss", None)):
        raise ValueError(
            f"{spec}: the {type(module).__name__} of task {cfg.task!r} has no training_loss(batch, batch_idx) to time"
        )
    module.to(device)
    module.train()
    opt = module.configure_optimizers()
    if isinstance(opt, dict):
        opt = opt["optimizer"]
    size = cfg.data.batch_size if batch_size is None else batch_size
    loader = DataLoader(dm.datasets["train"], batch_size=size, shuffle=False)
    try:
        batch = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in next(iter(loader)))
    except StopIteration:
        raise ValueError(f"{spec}: the training split is empty") from None
    params = sum(p.numel() for p in module.parameters())
    compiled = False
    if cfg.trainer.compile:  # as a run compiles: in place, checked against eager on the first validation batch
        from ..train.compile import compile_model

        inputs = list(next(iter(dm.val_dataloader()[0]))[:-1])  # the model's inputs, as the run's check takes them

        def say(line: str) -> None:
            print(f"{spec}: {line}", flush=True)

        compiled = compile_model(module.model, inputs, say, cfg.trainer.compile_mode)
    return StepCase(spec, cfg, module, opt, batch, int(params), int(batch[0].shape[0]), compiled, str(device))


def _sync(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(case: StepCase, steps: int) -> float:
    """Run ``steps`` consecutive training steps of ``case``; returns the mean seconds per step."""
    module, opt, batch = case.module, case.optimizer, case.batch
    _sync(case.device)
    start = time.perf_counter()
    for i in range(steps):
        loss = module.training_loss(batch, i)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(case.device)
    return (time.perf_counter() - start) / steps


def run_steps(
    specs: list[str],
    *,
    overrides: list[str] | None = None,
    batch: int | None = None,
    steps: int = 10,
    rounds: int = 5,
    warmup: int = 3,
    threads: int = 1,
    device: str = "cpu",
    verbose: bool = True,
) -> list[dict[str, Any]]:
    """Build every config of ``specs``, warm each up, then time ``rounds`` interleaved rounds (see the module
    docstring); returns one record per config, in the order given. torch's thread count is restored afterwards."""
    import torch

    from ..options import check_int

    check_int("--steps", steps, low=1)
    check_int("--rounds", rounds, low=1)
    check_int("--warmup", warmup, low=0)
    check_int("--threads", threads, low=1)
    check_int("--batch", batch, low=1, allow_none=True)
    if not specs:
        raise ValueError("bench steps: give at least one CONFIG")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device: expected 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    from ..utils.memory import PeakMemory

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cases = []
        for spec in specs:
            case = build_case(spec, overrides, batch, device)
            cases.append(case)
            if verbose:
                plan = attention_plan(case.cfg.model.attention)
                print(
                    f"built {spec}: task {case.cfg.task}, {plan}, {case.params:,} parameters, batch {case.batch_size}"
                )
        for case in cases:
            for _ in range(warmup):
                time_steps(case, 1)
        per_round: list[list[float]] = [[] for _ in cases]
        peaks = [0.0 for _ in cases]
        for r in range(rounds):
            for j in range(len(cases)):
                k = (r + j) % len(cases)  # rotated: every config takes every position
                gc.collect()
                memory = PeakMemory(device)
                per_round[k].append(1000.0 * time_steps(cases[k], steps))
                peaks[k] = max(peaks[k], memory.mb())
            if verbose:
                times = ", ".join(f"{c.spec} {per_round[i][-1]:.2f}" for i, c in enumerate(cases))
                print(f"round {r + 1}/{rounds} (ms / step): {times}", flush=True)
    finally:
        torch.set_num_threads(previous)
    first = statistics.median(per_round[0])
    records = []
    for case, ms, peak in zip(cases, per_round, peaks):
        median = statistics.median(ms)
        m = case.cfg.model
        records.append(
            {
                "config": case.spec,
                "name": case.cfg.name,
                "task": case.cfg.task,
                "dataset": case.cfg.data.name,
                "attention": attention_plan(m.attention),
                "attention_plan": m.attention,
                "attention_options": m.attention_options,
                "params": case.params,
                "batch": case.batch_size,
                "compiled": case.compiled,
                "compile_mode": case.cfg.trainer.compile_mode if case.compiled else None,
                "ms_per_step": median,
                "ms_per_step_min": min(ms),
                "ms_per_step_max": max(ms),
                "ms_per_step_rounds": ms,
                "ratio_to_first": median / first,
                "device": device,
                "peak_mb": round(peak, 1),
                "peak_method": PeakMemory(device).method,
            }
        )
    return records


def _ms(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def steps_table(records: list[dict[str, Any]]) -> str:
    """The markdown table: config, attention plan, parameters, median ms / step, min-max, ratio to the first."""
    lines = [TABLE_HEADER, "|---|---|---:|---:|---:|---:|---:|"]
    for r in records:
        mode = r.get("compile_mode") or "default"
        how = "" if not r.get("compiled") else " (compiled)" if mode == "default" else f" (compiled, {mode})"
        lines.append(
            f"| {r['config']} | {r['attention']}{how} | {r['params']:,} | "
            f"{_ms(r['ms_per_step'])} | "
            f"{_ms(r['ms_per_step_min'])}-{_ms(r['ms_per_step_max'])} | {r['ratio_to_first']:.2f} | "
            f"{r.get('peak_mb', float('nan')):.0f} |"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="training config names or YAML files (see `configs`)")
    p.add_argument("--steps", type=int, default=10, help="consecutive timed steps per config per round (default 10)")
    p.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds; the median over rounds is reported (default 5)"
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps per config (default 3)")
    p.add_argument("--batch", type=int, default=None, help="batch size for every config (default: data.batch_size)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the steps run (default cpu)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="sets",
        help="config override for every config, e.g. model.dropout=0.0 (repeatable)",
    )
    p.add_argument(
        "--out", default="runs/bench/steps", help="output folder for steps.json and steps.md (default runs/bench/steps)"
    )


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _command(args: argparse.Namespace) -> str:
    parts = ["primaldual", "bench", "steps", *args.configs]
    parts += ["--steps", str(args.steps), "--rounds", str(args.rounds), "--warmup", str(args.warmup)]
    if args.batch is not None:
        parts += ["--batch", str(args.batch)]
    parts += ["--threads", str(args.threads)]
    if args.device != "cpu":
        parts += ["--device", args.device]
    for s in args.sets:
        parts += ["--set", s]
    return shlex.join([*parts, "--out", str(args.out)])


def run_from_args(args: argparse.Namespace) -> int:
    import torch

    where = (
        f"the CPU with {_n(args.threads, 'thread')}"
        if args.device == "cpu"
        else f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CUDA'}"
    )

    from ..utils.io import atomic_write_json, atomic_write_text
    from .layers import machine_info

    overrides = parse_sets(args.sets)
    records = run_steps(
        list(args.configs),
        overrides=overrides,
        batch=args.batch,
        steps=args.steps,
        rounds=args.rounds,
        warmup=args.warmup,
        threads=args.threads,
        device=args.device,
    )
    command = _command(args)
    settings = {
        "steps": args.steps,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "batch": args.batch,
        "threads": args.threads,
        "overrides": overrides,
    }
    out = Path(args.out)
    result = {
        "benchmark": "steps",
        "command": command,
        "machine": machine_info("cpu"),
        "torch": torch.__version__,
        "threads": args.threads,
        "settings": settings,
        "records": records,
    }
    table = steps_table(records)
    md = (
        "# Training-step timings (`primaldual bench steps`)\n\n"
        f"`{command}`\n\n"
        f"{_n(args.steps, 'step')} x {_n(args.rounds, 'interleaved round')} after {_n(args.warmup, 'warm-up step')}, "
        f"float32 on {where}, torch {torch.__version__}; median over rounds of the "
        "per-step mean.\n\n"
        f"{table}\n"
    )
    atomic_write_json(out / "steps.json", result)
    atomic_write_text(out / "steps.md", md)
    print()
    print(table)
    print(f"\nwrote {out / 'steps.json'} and {out / 'steps.md'}")
    return 0
