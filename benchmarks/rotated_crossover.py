"""Where the primal layer's rotated evaluation starts to pay: the rotated and the score paths interleaved per length.

The primal layer evaluates long sequences in a rotated basis (``primaldual/functional/primal_rotated.py``) and
short ones on the score paths; with ``path="auto"``,
:func:`~primaldual.functional.primal_rotated.use_rotated` picks by length against a
:class:`~primaldual.functional.primal_rotated.RotatedThresholds` whose defaults were measured on 2 CPU threads. The
rotated path pays a QR and an eigendecomposition per group (and per sample for data-dependent weights) that LAPACK
runs one after another on one core, so the crossover moves with the cores that share the rest of the pass:
re-measure it on the machine that will train and pass the result to the layer (``thresholds=``).

Per length, one process times the floor (:func:`~primaldual.bench.layers.projection_floor`), the layer built with
``path="rotated"`` and the layer built with ``path="scores"`` (folded or per-head scores by cost: folded at the
default shape), interleaved as in ``benchmarks/primal_floor.py`` (same pass: forward, ``out.square().mean()`` plus
the KSVD term, backward). ``rotated_vs_scores`` above 1 means the rotated path is faster. The script then names the
threshold this mode decides by and suggests a value: the shortest measured length from which the rotated path is
faster at every longer measured length (rows, batch x tokens, for ``--causal``), as a ``RotatedThresholds``.

Run: ``python benchmarks/rotated_crossover.py --lengths 1024 2048 2560 3072 4096 --threads 2 --compile``; add
``--causal`` for the causal layer's shared weights (the choice there goes by rows, batch x tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import primaldual as pd
from primaldual.bench.interleave import time_interleaved
from primaldual.bench.layers import projection_floor
from primaldual.functional.primal import fold_scores
from primaldual.functional.primal_rotated import DEFAULT_THRESHOLDS, RotatedThresholds
from primaldual.utils.io import atomic_write_json

PATHS = ("rotated", "scores")  # the layer's forced paths, one case each


def threshold_name(causal: bool, compiled: bool) -> str:
    """The field of :class:`RotatedThresholds` that decides this layer's path (with a backward pass to follow)."""
    if causal:
        return "min_rows_shared_compiled" if compiled else "min_rows_shared_eager"
    return "min_tokens_compiled" if compiled else "min_tokens_eager"


def build_cases(args: argparse.Namespace, n: int) -> dict[str, Callable[[], None]]:
    """The floor and the layer forced onto each path, each on its own module and input (same seeds, same values)."""

    def make(layer: torch.nn.Module, primal: bool) -> Callable[[], None]:
        """A pass of ``layer``; ``primal``: the layer has a KSVD term (the floor has none)."""
        torch.manual_seed(1)
        x = torch.randn(args.batch, n, args.dim, requires_grad=True)

        def call() -> None:
            out = layer(x)
            aux = pd.collect_aux_loss(layer) if primal else None
            (out.square().mean() + (aux if aux is not None else 0.0)).backward()
            x.grad = None
            layer.zero_grad(set_to_none=True)

        return call

    torch.manual_seed(0)
    cases = {"floor": make(projection_floor(args.dim, args.heads, s=args.s), False)}
    for path in PATHS:
        torch.manual_seed(0)
        layer = pd.build_attention(
            "primal", args.dim, args.heads, s=args.s, causal=args.causal, compile=args.compile, path=path
        )
        cases[path] = make(layer, True)
    return cases


def suggest(rows: list[dict[str, Any]], causal: bool, compiled: bool) -> RotatedThresholds | None:
    """The default thresholds with this mode's field set to the shortest measured length (rows for ``causal``) from
    which the rotated path is faster at every longer one; None when it is not faster at the longest."""
    key = "rows" if causal else "N"
    start = None
    for row in sorted(rows, key=lambda r: r[key], reverse=True):
        if row["rotated_vs_scores"] <= 1.0:
            break
        start = row[key]
    if start is None:
        return None
    return dataclasses.replace(DEFAULT_THRESHOLDS, **{threshold_name(causal, compiled): start})


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per length: each case's median ms over rounds (and its range), and the two ratios."""
    rows = []
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
                "scores_folded": fold_scores(args.batch, n, args.dim, args.heads, args.s),
                "calls_per_round": calls,
                "ms": ms,
                "range_ms": {case: [min(v), max(v)] for case, v in per_round.items()},
                "over_floor": {case: t / ms["floor"] for case, t in ms.items()},
                "rotated_vs_scores": ms["scores"] / ms["rotated"],
            }
        )
        r = rows[-1]
        scores = "folded" if r["scores_folded"] else "per-head"
        print(
            f"N={n} ({args.batch * n} rows): floor {ms['floor']:.2f} ms  rotated {ms['rotated']:.2f} ms "
            f"({r['over_floor']['rotated']:.2f}x floor)  scores ({scores}) {ms['scores']:.2f} ms "
            f"({r['over_floor']['scores']:.2f}x floor)  rotated vs scores {r['rotated_vs_scores']:.2f}x",
            flush=True,
        )
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
    name = threshold_name(args.causal, args.compile)
    suggested = suggest(rows, args.causal, args.compile)
    if suggested is None:
        print(f"{name}: the rotated path is not faster at the longest length measured; measure longer ones")
    else:
        value = getattr(suggested, name)
        print(f"{name}: the rotated path is faster from {value:,} {'rows' if args.causal else 'tokens'} on")
        print(f"  pass: thresholds=RotatedThresholds({name}={value}) (default {getattr(DEFAULT_THRESHOLDS, name)})")
    if args.json:
        meta = {
            "machine": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "command": " ".join(sys.argv),
            "threshold": name,
            "default_thresholds": dataclasses.asdict(DEFAULT_THRESHOLDS),
            "suggested_thresholds": None if suggested is None else dataclasses.asdict(suggested),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        }
        atomic_write_json(args.json, {"meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
