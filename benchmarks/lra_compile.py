"""LRA training steps eager vs compiled, Transformer vs PrimalFormer, interleaved in one process per task.

``primaldual bench lra`` runs every (task, model) case in a fresh process, one after the other, so a ratio of two
cases carries the machine's drift between them (on a shared 2-core machine the same case moved 20-40% from one
run to the next). Here, per task, the four cases (Transformer and PrimalFormer, each eager and compiled with
``trainer.compile``'s settings: :func:`primaldual.use_counter_dropout` and ``compile_options``) are built in one
process from :func:`primaldual.bench.lra.build_case` (the reference LRA model, random tokens, AdamW), warmed up
(``--warmup`` steps; the compiled cases compile there), and then timed in ``--rounds`` rounds of ``--steps``
consecutive steps each, the order rotated by one per round. A case's figure is the median over rounds of its
per-step mean (seconds per 1K steps), with the min-max over rounds; the ratios are of medians from the same rounds.

Run: ``python benchmarks/lra_compile.py --threads 2 --json runs/bench/lra_compile.json``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from primaldual.bench.interleave import time_interleaved
from primaldual.bench.lra import PAPER, TASKS, build_case
from primaldual.utils.io import atomic_write_json

CASES = (("transformer", False), ("primalformer", False), ("transformer", True), ("primalformer", True))


def _label(model: str, compiled: bool) -> str:
    return f"{model} {'compiled' if compiled else 'eager'}"


def time_task(task: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    steps: dict[str, Callable[[], None]] = {}
    for model, compiled in CASES:
        case = {"task": task, "model": model, "batch": args.batch, "device": "cpu", "compile": compiled}
        torch.manual_seed(0)
        _, step, _ = build_case(case)
        steps[_label(model, compiled)] = step
    # ms per step = s per 1K steps
    per_round = time_interleaved(steps, rounds=args.rounds, calls=args.steps, warmup=args.warmup)
    return {
        n: {"s_per_1k": statistics.median(v), "min": min(v), "max": max(v), "rounds": v} for n, v in per_round.items()
    }


def table(rows: dict[str, dict[str, dict[str, Any]]]) -> str:
    tasks = list(rows)
    out = ["| s per 1K steps (min-max over rounds) | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for model, compiled in CASES:
        label = _label(model, compiled)
        cells = []
        for t in tasks:
            c = rows[t][label]
            cell = f"{c['s_per_1k']:.1f} ({c['min']:.0f}-{c['max']:.0f})"
            if model == "primalformer":
                ref = rows[t][_label("transformer", compiled)]["s_per_1k"]
                cell += f" **{ref / c['s_per_1k']:.2f}x**"
            cells.append(cell)
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    gains = []
    for t in tasks:
        eager, comp = rows[t]["primalformer eager"]["s_per_1k"], rows[t]["primalformer compiled"]["s_per_1k"]
        gains.append(f"{eager / comp:.2f}x")
    out.append("| PrimalFormer compiled vs eager | " + " | ".join(gains) + " |")
    out.append(
        "| paper PrimalFormer vs Transformer | " + " | ".join(f"{PAPER[t][0] / PAPER[t][1]:.1f}x" for t in tasks) + " |"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per case first (compilation happens here)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="consecutive timed steps per case per round")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--json", type=Path, default=None, help="write the figures to this file (atomically)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for task in args.tasks:
        rows[task] = time_task(task, args)
        print(task, {n: round(c["s_per_1k"], 1) for n, c in rows[task].items()}, flush=True)
        if args.json:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
            meta = {
                "machine": platform.platform(),
                "torch": torch.__version__,
                "commit": commit or None,
                "command": " ".join(sys.argv),
                "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            }
            atomic_write_json(args.json, {"meta": meta, "rows": rows})
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
