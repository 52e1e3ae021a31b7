"""The primal layer against its floor: forward+backward time of ``primal`` eager, ``primal`` with ``compile=True``,
the floor, and optionally an older version of the library, interleaved in one process.

The floor is :func:`primaldual.bench.layers.projection_floor` (the row ``projections`` of ``primaldual bench
layers``): the dense maps the primal layer cannot avoid, its Q/K projection ``dim -> 2 dim`` and its fused output
map ``H 2s -> dim``, with nothing between them. ``--baseline-tree PATH`` imports a second copy of the library from a
source tree (e.g. ``git worktree add /tmp/base <commit>``) under the name ``primaldual_baseline`` and times its
``primal`` layer beside the others, so "faster than before" is measured in the same process and rounds.

Every case runs the same pass: forward of ``(B, N, dim)`` float32 input, ``out.square().mean()`` plus the layer's
KSVD term, backward, gradients cleared. After ``--warmup`` passes of each case (the compiled case compiles there),
``--rounds`` rounds each time ``--calls`` consecutive passes of every case, the order rotated by one per round; a
case's figure is the median over rounds of its mean pass time, with the min-max over rounds. Interleaving cancels
slow drift on a shared machine, not contention: run it with nothing else on the machine.

The allocator is part of the measurement. glibc's default hands freed memory back to the kernel between passes, so
each pass first-touches fresh pages and the page faults per pass vary up to 10x from run to run (the floor at
N = 4,096 moved 12-16 ms). Run it as well with glibc's trimming off, PyTorch's usual advice for CPU timing (or
with jemalloc / tcmalloc preloaded), which times the arithmetic; the JSON records the setting:
``GLIBC_TUNABLES=glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=33554432`` (nothing given
back; blocks up to 32 MiB, glibc's most, from the heap instead of their own mmap).

One process's verdict is not the machine's: the floor's own time can move more from process to process than
within one (2.6-4.4 ms at N = 1,024 on a 2-core CPU, the command unchanged), and the layer's moves less, so the
ratio of a single process can land on either side of a limit. ``--processes P`` runs the whole measurement in P
fresh processes one after another (each its own interleaved rounds; environment variables such as
``GLIBC_TUNABLES`` pass to every one) and reports each process's ratios and their median.

Run: ``python benchmarks/primal_floor.py --lengths 1024 4096 16384 --threads 2 --json runs/bench/floor.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import primaldual as pd
from primaldual.bench.interleave import time_interleaved
from primaldual.bench.layers import projection_floor
from primaldual.utils.io import atomic_write_json


def _package_init(tree: Path) -> Path:
    """``tree``'s ``primaldual/__init__.py``, or FileNotFoundError naming ``--baseline-tree``."""
    init = tree / "primaldual" / "__init__.py"
    if not init.is_file():
        raise FileNotFoundError(f"--baseline-tree: no primaldual/__init__.py under {tree}")
    return init


def load_tree(tree: Path, name: str = "primaldual_baseline") -> Any:
    """Import the ``primaldual`` package of source tree ``tree`` as a separate package called ``name``."""
    init = _package_init(tree)
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _commit(tree: Path) -> str | None:
    res = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    return res.stdout.strip() or None


def build_cases(args: argparse.Namespace, n: int, baseline: Any | None) -> dict[str, Callable[[], None]]:
    """One forward+backward pass per case, each on its own layer and input (same seed, same values)."""

    def make(layer: torch.nn.Module, collect: Callable | None) -> Callable[[], None]:
        torch.manual_seed(1)
        x = torch.randn(args.batch, n, args.dim, requires_grad=True)

        def call() -> None:
            out = layer(x)
            aux = collect(layer) if collect is not None else None
            (out.square().mean() + (aux if aux is not None else 0.0)).backward()
            x.grad = None
            layer.zero_grad(set_to_none=True)

        return call

    opts = {"s": args.s}
    torch.manual_seed(0)
    cases = {"floor": make(projection_floor(args.dim, args.heads, s=args.s), None)}
    torch.manual_seed(0)
    cases["primal"] = make(pd.build_attention("primal", args.dim, args.heads, **opts), pd.collect_aux_loss)
    if not args.skip_compiled:
        torch.manual_seed(0)
        compiled = pd.build_attention("primal", args.dim, args.heads, compile=True, **opts)
        cases["primal_compiled"] = make(compiled, pd.collect_aux_loss)
    if baseline is not None:
        torch.manual_seed(0)
        layer = baseline.build_attention("primal", args.dim, args.heads, **opts)
        cases["baseline"] = make(layer, baseline.collect_aux_loss)
    return cases


def time_cases(cases: dict[str, Callable[[], None]], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    per_round = time_interleaved(cases, rounds=args.rounds, calls=args.calls, warmup=args.warmup)
    return {
        m: {"ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v), "rounds_ms": v}
        for m, v in per_round.items()
    }


def summarize(processes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per length, every case's ratio to the floor (and the baseline's to every case) over processes.

    Args:
        processes: each process's ``rows`` (as written by one process's ``--json``), all over the same lengths.

    Returns:
        One row per length: ``{"N", "over_floor": {case: {"median", "min", "max", "per_process"}},
        "baseline_over": ...}`` (``baseline_over`` only when the processes timed a baseline).
    """
    if not processes:
        raise ValueError("summarize: no process results")
    lengths = [row["N"] for row in processes[0]]
    if any([row["N"] for row in rows] != lengths for rows in processes):
        raise ValueError(f"summarize: the processes measured different lengths, expected {lengths} in each")

    def spread(values: list[float]) -> dict[str, Any]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values), "per_process": values}

    summary = []
    for i, n in enumerate(lengths):
        rows = [p[i] for p in processes]
        out: dict[str, Any] = {"N": n}
        for key in ("over_floor", "baseline_over"):
            if key in rows[0]:
                out[key] = {m: spread([r[key][m] for r in rows]) for m in rows[0][key]}
        summary.append(out)
    return summary


def run_processes(args: argparse.Namespace) -> int:
    """``--processes P``: the measurement in P fresh processes, one after another, then their summary."""
    child = [sys.executable, str(Path(__file__).resolve()), "--lengths", *map(str, args.lengths)]
    for flag in ("batch", "dim", "heads", "s", "warmup", "rounds", "calls", "threads"):
        child += [f"--{flag}", str(getattr(args, flag))]
    if args.baseline_tree:
        child += ["--baseline-tree", str(args.baseline_tree)]
    if args.skip_compiled:
        child.append("--skip-compiled")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            path = Path(tmp) / f"process{i}.json"
            print(f"process {i + 1}/{args.processes}", flush=True)
            done = subprocess.run([*child, "--json", str(path)], stdout=None, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                tail = "\n".join(done.stderr.strip().splitlines()[-15:])
                raise RuntimeError(f"process {i + 1} of {args.processes} failed (exit {done.returncode}):\n{tail}")
            results.append(json.loads(path.read_text()))
    summary = summarize([r["rows"] for r in results])
    for row in summary:
        cells = "  ".join(
            f"{m} {v['median']:.2f}x ({v['min']:.2f}-{v['max']:.2f})"
            for m, v in row["over_floor"].items()
            if m != "floor"
        )
        print(f"N={row['N']} over {args.processes} processes, median (min-max) of the ratio to the floor: {cells}")
    if args.json:
        meta = {**results[0]["meta"], "command": " ".join(sys.argv), "processes": args.processes}
        atomic_write_json(args.json, {"meta": meta, "summary": summary, "processes": results})
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--s", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="untimed passes per case first (compilation happens here)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=0, help="passes per case per round (0: about 80 ms of work)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--baseline-tree", type=Path, default=None, help="source tree of an older primaldual to time too")
    ap.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    ap.add_argument("--processes", type=int, default=1, help="repeat the whole measurement in this many processes")
    ap.add_argument("--skip-compiled", action="store_true", help="leave out the compiled layer (no C++ compiler)")
    args = ap.parse_args(argv)
    for name in ("batch", "dim", "heads", "s", "rounds", "processes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.calls < 0 or args.threads < 1 or min(args.lengths) < 1:
        ap.error(
            f"need --warmup >= 0, --calls >= 0, --threads >= 1 and --lengths >= 1; got {args.warmup}, {args.calls}, "
            f"{args.threads}, {args.lengths}"
        )
    if args.baseline_tree is not None:
        try:  # checked here too, so that --processes fails before its first process
            _package_init(args.baseline_tree)
        except FileNotFoundError as err:
            ap.error(str(err))
    if args.processes > 1:
        return run_processes(args)
    torch.set_num_threads(args.threads)
    pd.set_input_checks(False)
    baseline = load_tree(args.baseline_tree) if args.baseline_tree else None
    if baseline is not None:
        baseline.set_input_checks(False)
    print(f"B={args.batch} dim={args.dim} heads={args.heads} s={args.s} float32 CPU threads={args.threads}")
    rows = []
    for n in args.lengths:
        calls = args.calls or max(1, round(20 * 4096 / n))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a compile fallback must not pass as a timing
            cases = build_cases(args, n, baseline)
            res = time_cases(cases, argparse.Namespace(**{**vars(args), "calls": calls}))
        floor = res["floor"]["ms"]
        row = {
            "N": n,
            "calls_per_round": calls,
            "cases": res,
            "over_floor": {m: r["ms"] / floor for m, r in res.items()},
        }
        if "baseline" in res:
            row["baseline_over"] = {m: res["baseline"]["ms"] / r["ms"] for m, r in res.items()}
        rows.append(row)
        cells = "  ".join(
            f"{m} {r['ms']:.2f} ms ({r['min_ms']:.2f}-{r['max_ms']:.2f}, {r['ms'] / floor:.2f}x floor)"
            for m, r in res.items()
        )
        print(f"N={n}: {cells}", flush=True)
    if args.json:
        meta = {
            "machine": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "commit": _commit(Path(__file__).resolve().parent.parent),
            "baseline_commit": _commit(args.baseline_tree) if args.baseline_tree else None,
            "command": " ".join(sys.argv),
            # the allocator settings change the page faults per pass, so they belong to the figures
            "allocator_env": {k: os.environ[k] for k in ("GLIBC_TUNABLES", "LD_PRELOAD") if k in os.environ},
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        }
        atomic_write_json(args.json, {"meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
