"""``primaldual bench ...`` subcommands: ``layers`` (sweep), ``lra`` (training steps), ``plot`` (figures)."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _plot(args: argparse.Namespace) -> int:
    from .plot import plot_layers

    for p in plot_layers(args.file, args.out_dir, args.min_length):
        print(f"wrote {p}")
    return 0


def register(subparsers) -> None:
    from . import layers, lra

    bench = subparsers.add_parser("bench", help="efficiency benchmarks (layer sweeps, LRA steps, plots)")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    p = sub.add_parser("layers", help="time / peak-memory sweep over N for every attention")
    layers.add_arguments(p)
    p.set_defaults(func=layers.run_from_args)
    p = sub.add_parser("lra", help="time per 1K training steps and peak memory on LRA task shapes")
    lra.add_arguments(p)
    p.set_defaults(func=lra.run_from_args)
    p = sub.add_parser("plot", help="log-log plots with fitted slopes from a bench JSON file")
    p.add_argument("file")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--min-length", type=int, default=4096)
    p.set_defaults(func=_plot)
