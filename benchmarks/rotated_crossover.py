"""Where the primal layer's rotated evaluation starts to pay: the rotated and the folded path interleaved per length.

The primal layer evaluates long sequences in a rotated basis (``primaldual/functional/primal_rotated.py``) and
short ones on the folded scores; :func:`~primaldual.functional.primal_rotated.use_rotated` picks by length against
module constants measured on 2 CPU threads. The rotated path pays a QR and an eigendecomposition per group (and per
sample for data-dependent weights) that LAPACK runs one after another on one core, so the crossover moves with the
cores that share the rest of the pass: re-measure it on the machine that will train.

Per length, one process times the floor (:func:`~primaldual.bench.layers.projection_floor`), the layer forced onto
the rotated path and the layer forced onto the folded one, interleaved as in ``benchmarks/primal_floor.py`` (same
pass: forward, ``out.square().mean()`` plus the KSVD term, backward). The forcing sets the constant that
``use_rotated`` reads for the chosen mode before each call (1 or never), so a compiled layer keeps one graph per path
(Dynamo guards on the constant). ``rotated_vs_folded`` above 1 means the rotated path is faster.

Run: ``python benchmarks/rotated_crossover.py --lengths 1024 2048 2560 3072 4096 --threads 2 --compile``; add
``--causal`` for the causal layer's shared weights (the choice there goes by rows, batch x tokens).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import primaldual as pd
import primaldual.functional.primal_rotated as pr
from primaldual.bench.interleave import time_interleaved
from primaldual.bench.layers import projection_floor
from primaldual.utils.io import atomic_write_json

NEVER = sys.maxsize


def threshold_name(causal: bool, compiled: bool) -> str:
    """The constant of :mod:`primaldual.functional.primal_rotated` that decides this layer's path."""
    if causal:
        return "MIN_ROWS_SHARED_COMPILED" if compiled else "MIN_ROWS_SHARED_EAGER"
    return "MIN_TOKENS_COMPILED" if compiled else "MIN_TOKENS_EAGER"


def build_cases(args: argparse.Namespace, n: int) -> dict[str, Callable[[], None]]:
    """The floor and the layer on each path, each on its own module and input (same seeds, same values)."""
    name = threshold_name(args.causal, args.compile)

    def make(layer: torch.nn.Module, threshold: int | None) -> Callable[[], None]:
        """A pass of ``layer``; ``threshold`` (the primal layer's forced path) None for the floor."""
        torch.manual_seed(1)
        x = torch.randn(args.batch, n, args.dim, requires_grad=True)

        def call() -> None:
            if threshold is not None:
                setattr(pr, name, threshold)
            out = layer(x)
            aux = pd.collect_aux_loss(layer) if threshold is not None else None  # the floor has no KSVD term
            (out.square().mean() + (aux if aux is not None else 0.0)).backward()
            x.grad = None
            layer.zero_grad(set_to_none=True)

        return call

    torch.manual_seed(0)
    cases = {"floor": make(projection_floor(args.dim, args.heads, s=args.s), None)}
    for path, threshold in (("rotated", 1), ("folded", NEVER)):
        torch.manual_seed(0)
        layer = pd.build_attention("primal", args.dim, args.heads, s=args.s, causal=args.causal, compile=args.compile)
        cases[path] = make(layer, threshold)
    return cases


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per length: each case's median ms over rounds (and its range), and the two ratios."""
    name = threshold_name(args.causal, args.compile)
    kept = getattr(pr, name)
    rows = []
    try:
        for n in args.lengths:
            calls = args.calls or max(1, round(20 * 4096 / n))
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # a compile fallback must not pass as a timing
                per_round = time_interleaved(build_cases(args, n), rounds=args.rounds, calls=calls, warmup=args.warmup)
            ms = {case: statistics.median(v) for case, v in per_round.items()}
            rows.append(
                {
                    "N": n,
                    "rows": args.batch * n,
                    "calls_per_round": calls,
                    "ms": ms,
                    "range_ms": {case: [min(v), max(v)] for case, v in per_round.items()},
                    "over_floor": {case: t / ms["floor"] for case, t in ms.items()},
                    "rotated_vs_folded": ms["folded"] / ms["rotated"],
                }
            )
            r = rows[-1]
            print(
                f"N={n} ({args.batch * n} rows): floor {ms['floor']:.2f} ms  rotated {ms['rotated']:.2f} ms "
                f"({r['over_floor']['rotated']:.2f}x floor)  folded {ms['folded']:.2f} ms "
                f"({r['over_floor']['folded']:.2f}x floor)  rotated vs folded {r['rotated_vs_folded']:.2f}x",
                flush=True,
            )
    finally:
        setattr(pr, name, kept)
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, validated (argparse's error, naming the option, on a bad value)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 2560, 3072, 4096])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--s", type=int, default=20)
    ap.add_argument("--causal", action="store_true", help="the causal layer (shared W_e, W_r; the choice by rows)")
    ap.add_argument("--compile", action="store_true", help="the layer with compile=True (else eager)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed passes per case first (compilation happens here)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=0, help="passes per case per round (0: about 80 ms of work)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    args = ap.parse_args(argv)
    for name in ("batch", "dim", "heads", "s", "rounds", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.calls < 0 or min(args.lengths) < 1:
        ap.error(
            f"need --warmup >= 0, --calls >= 0 and --lengths >= 1; got {args.warmup}, {args.calls}, {args.lengths}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    pd.set_input_checks(False)
    mode = "compiled" if args.compile else "eager"
    kind = "causal (shared weights)" if args.causal else "data-dependent"
    print(f"B={args.batch} dim={args.dim} heads={args.heads} s={args.s} {kind}, {mode}, CPU threads={args.threads}")
    rows = measure(args)
    if args.json:
        meta = {
            "machine": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "command": " ".join(sys.argv),
            "threshold": threshold_name(args.causal, args.compile),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        }
        atomic_write_json(args.json, {"meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
