"""Forward+backward time and peak memory of one ``primal`` layer vs one ``softmax`` (SDPA) layer, CPU.

Issue 3's benchmark: B=4, dim 64, 2 heads, s=20, float32, N in 1024 / 4096 / 16384 by default. For each N:

* time: median over ``--repeats`` forward+backward passes after ``--warmup`` passes, in this process,
  interleaved across mechanisms (load from other processes hits all alike), for ``primal``, ``softmax`` and ``proj`` (the primal layer's dense projections alone: the fused Q/K
  Linear(dim -> 2 dim) and the output Linear(dim -> dim) on the same input, forward+backward);
* memory: one fresh subprocess per (mechanism, N) runs one forward+backward and reports its peak resident
  set (``ru_maxrss``) minus the resident set just before the pass, i.e. the pass's own peak activation memory.

Prints a table and, with ``--json``, writes the figures with the machine and library versions.
Run: ``python benchmarks/primal_layer.py`` (add ``--threads 1`` to pin threads, ``--lengths 1024 4096``).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

import primaldual as pd

MECHS = ("primal", "softmax", "proj")


class _Projections(nn.Module):
    """The primal layer's dense projections alone: Q/K Linear(dim -> 2 dim) and output Linear(dim -> dim)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qk = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, -1)  # 2 x (B, N, dim)
        return self.proj(q) + k.sum() * 0  # keep k in the graph so its backward runs too


def _build(mech: str, args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(0)
    if mech == "proj":
        return _Projections(args.dim)
    opts = {"s": args.s} if mech == "primal" else {}
    return pd.build_attention(mech, args.dim, args.heads, **opts)


def _pass(layer: nn.Module, x: torch.Tensor) -> None:
    out = layer(x)
    aux = pd.collect_aux_loss(layer)
    loss = out.square().mean() + (aux if aux is not None else 0.0)
    loss.backward()


def time_cases(n: int, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds of one forward+backward per mechanism.

    The repeats are interleaved (primal, softmax, proj, primal, ...) so that load from other processes on a
    shared machine hits every mechanism alike instead of biasing whichever ran during a burst.
    """
    layers = {m: _build(m, args) for m in MECHS}
    x = torch.randn(args.batch, n, args.dim, requires_grad=True)
    pd.set_input_checks(False)
    long = n >= 16384  # softmax is slow on CPU there: fewer rounds
    rounds = max(1, args.repeats_long) if long else args.repeats
    for m in MECHS:
        for _ in range(min(args.warmup, 1) if long and m == "softmax" else args.warmup):
            _pass(layers[m], x)
    times: dict[str, list[float]] = {m: [] for m in MECHS}
    for _ in range(rounds):
        for m in MECHS:
            # the fast layers get extra timed passes per round (they are cheap): a steadier median
            for _ in range(1 if m == "softmax" else (args.repeats if long else 1)):
                layers[m].zero_grad(set_to_none=True)
                x.grad = None
                t0 = time.perf_counter()
                _pass(layers[m], x)
                times[m].append(time.perf_counter() - t0)
    return {m: statistics.median(v) for m, v in times.items()}


def _memory_child(mech: str, n: int, args: argparse.Namespace) -> None:
    layer = _build(mech, args)
    x = torch.randn(args.batch, n, args.dim, requires_grad=True)
    pd.set_input_checks(False)
    _pass(layer, x[:, :16])  # load kernels / allocator pools outside the measured pass
    before = _rss_now()
    _pass(layer, x)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_bytes": max(peak - before, 0)}))


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def memory_case(mech: str, n: int, args: argparse.Namespace) -> float | str:
    """Peak extra resident memory (MiB) of one forward+backward in a fresh process, or a failure note."""
    cmd = [sys.executable, __file__, "--child", mech, str(n), "--threads", str(args.threads)]
    cmd += ["--batch", str(args.batch), "--dim", str(args.dim), "--heads", str(args.heads), "--s", str(args.s)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return f"failed ({res.returncode}): {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ''}"
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_bytes"] / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--s", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--repeats-long", type=int, default=2, help="softmax repeats at N >= 16384 (slow on CPU)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--no-memory", action="store_true", help="skip the per-case memory subprocesses")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    ap.add_argument("--child", nargs=2, metavar=("MECH", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        _memory_child(args.child[0], int(args.child[1]), args)
        return 0

    # warm every code path once (lazy imports, kernel dispatch, allocator) so the first case is not penalised
    for m in MECHS:
        layer, xw = _build(m, args), torch.randn(args.batch, min(args.lengths), args.dim, requires_grad=True)
        for _ in range(3):
            _pass(layer, xw)
    rows = []
    print(f"B={args.batch} dim={args.dim} heads={args.heads} s={args.s} float32 CPU threads={args.threads}")
    header = "N       primal_ms  softmax_ms  proj_ms  speedup  primal/proj  primal_MiB  softmax_MiB"
    print(header)
    for n in args.lengths:
        t = time_cases(n, args)
        mem = {m: (None if args.no_memory else memory_case(m, n, args)) for m in ("primal", "softmax")}
        row = {
            "N": n,
            **{f"{m}_ms": 1e3 * t[m] for m in MECHS},
            "speedup": t["softmax"] / t["primal"],
            "primal_over_proj": t["primal"] / t["proj"],
            **{f"{m}_peak_MiB": mem[m] for m in mem},
        }
        rows.append(row)

        def fmt(v):
            return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))

        print(
            f"{n:<7} {row['primal_ms']:>9.2f}  {row['softmax_ms']:>10.1f}  {row['proj_ms']:>7.2f}  "
            f"{row['speedup']:>6.1f}x  {row['primal_over_proj']:>11.2f}  {fmt(mem['primal']):>10}  "
            f"{fmt(mem['softmax']):>11}",
            flush=True,
        )
    if args.json:
        meta = {
            "machine": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "settings": {k: v for k, v in vars(args).items() if k not in ("child", "json")},
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
