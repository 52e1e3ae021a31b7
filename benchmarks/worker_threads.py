"""Reduced runs with data-loader workers: torch's default threads against the cores the workers leave.

With ``data.num_workers > 0``, torch's default gives every core an intra-op thread and the workers compete with
them (``primaldual fit`` warns, :class:`~primaldual.train.run.ThreadsOversubscribedWarning`). This script times
whole ``primaldual fit`` runs of a config (default ``lra/listops/reduced/<model>`` on generated ListOps data, whose
worker only tokenises; ``--config vision/fashion_mnist/reduced/<model>``: the worker decodes and augments images)
with a short step budget, in fresh processes, the two settings interleaved round by round:

* ``default``: no ``--threads``: torch's default, as many intra-op threads as cores;
* ``fewer``: ``--threads <cores - workers>``: the cores the workers leave.

It reports the wall time of each run (median per setting) and the ratio. Two runs of one setting in a row differ
by process noise, so compare the ratio over several rounds, and keep the machine otherwise idle::

    python benchmarks/worker_threads.py --rounds 3 --steps 60 --workers 1 --out runs/bench/worker_threads.json
    python benchmarks/worker_threads.py --config vision/fashion_mnist/reduced/deit --rounds 3 --steps 60 \\
        --override augment.randaugment_ops 2 --override augment.crop_scale "[0.08, 1.0]"
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from primaldual.options import check_int
from primaldual.train.run import usable_cores
from primaldual.utils.io import atomic_write_json

SETTINGS = ("default", "fewer")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="runs per setting, interleaved")
    p.add_argument("--steps", type=int, default=60, help="optimiser steps per run")
    p.add_argument("--workers", type=int, default=1, help="data.num_workers")
    p.add_argument("--model", default="primalformer", help="lra/listops/reduced/<model>")
    p.add_argument(
        "--config", default=None, help="any training config instead (its data must be installed; --model is ignored)"
    )
    p.add_argument("--examples", type=int, default=2000, help="generated ListOps training examples")
    p.add_argument("--data", default=None, help="a ListOps folder (default: generated into a temporary folder)")
    p.add_argument(
        "--override",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="a config override for every run, e.g. --override augment.randaugment_ops 2 (repeatable)",
    )
    p.add_argument("--out", default=None, help="write the records as JSON")
    args = p.parse_args(argv)
    for flag in ("rounds", "steps", "workers", "examples"):
        check_int(f"--{flag}", getattr(args, flag), low=1)
    return args


def generate(folder: Path, examples: int) -> Path:
    """Small ListOps splits (the reduced configs' rules) for the runs."""
    from primaldual.recipes.listops import ListOpsConfig, write_listops

    out = folder / "listops"
    write_listops(out, {"train": examples, "val": 100, "test": 100}, seed=0, config=ListOpsConfig(max_length=1000))
    return out


def config_name(args: argparse.Namespace) -> str:
    return args.config or f"lra/listops/reduced/{args.model}"


def command(args: argparse.Namespace, data: Path | None, run_dir: Path, setting: str) -> list[str]:
    cmd = [sys.executable, "-m", "primaldual.cli", "fit", "--config", config_name(args)]
    cmd += [] if data is None else ["--data.root", str(data)]
    cmd += ["--data.num_workers", str(args.workers), "--data.val_size", "64"]
    cmd += [x for key, value in args.override for x in (f"--{key.lstrip('-')}", value)]
    cmd += ["--trainer.max_steps", str(args.steps), "--trainer.val_check_interval", str(args.steps)]
    cmd += ["--trainer.enable_progress_bar", "false", "--run-dir", str(run_dir)]
    return cmd + (["--threads", str(max(1, usable_cores() - args.workers))] if setting == "fewer" else [])


def run(args: argparse.Namespace) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="primaldual-worker-threads-") as tmp:
        if args.data:
            data: Path | None = Path(args.data)
        else:
            data = None if args.config else generate(Path(tmp), args.examples)
        for r in range(args.rounds):
            order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]  # alternate which setting goes first
            for setting in order:
                run_dir = Path(tmp) / f"run-{r}-{setting}"
                t0 = time.perf_counter()
                res = subprocess.run(command(args, data, run_dir, setting), capture_output=True, text=True)
                seconds = time.perf_counter() - t0
                if res.returncode != 0:
                    raise RuntimeError(f"{setting} run failed:\n{res.stderr[-3000:]}")
                warned = "ThreadsOversubscribedWarning" in res.stderr
                records.append({"round": r, "setting": setting, "seconds": round(seconds, 2), "warned": warned})
                print(f"round {r} {setting:8s} {seconds:7.1f} s" + ("  (warned)" if warned else ""), flush=True)
    med = {s: statistics.median(x["seconds"] for x in records if x["setting"] == s) for s in SETTINGS}
    return {
        "cores": usable_cores(),
        "settings": vars(args),
        "records": records,
        "median_seconds": med,
        "default_over_fewer": round(med["default"] / med["fewer"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = run(args)
    med = result["median_seconds"]
    print(
        f"\n{result['cores']} cores, {args.workers} worker(s), {args.steps} steps of {config_name(args)}: "
        f"default threads {med['default']:.1f} s, fewer threads {med['fewer']:.1f} s (median of {args.rounds}); "
        f"default / fewer = {result['default_over_fewer']:.2f}"
    )
    if args.out:
        atomic_write_json(Path(args.out), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
