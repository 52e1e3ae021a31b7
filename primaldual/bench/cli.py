"""``primaldual bench ...`` subcommands: ``layers`` (sweep), ``lra`` (training steps), ``plot`` (figures)."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _plot(args: argparse.Namespace) -> int:
    from .plot import plot_layers

    for p in plot_layers(args.file, args.out_dir, args.min_length):
        print(f"wrote {p}")
    return 0


def _profile(args: argparse.Namespace) -> int:
    from .layers import profile_layer
    from .lra import TASKS, profile_case

    if args.layer:
        case = {"attention": args.layer, "length": args.length, "mode": args.mode, "batch": args.batch or 4}
        case.update(dim=args.dim, heads=args.heads, dtype="float32", device=args.device, threads=args.threads)
        text = profile_layer(case, calls=args.steps, rows=args.rows)
    else:
        case = {"task": args.task, "model": args.model, "batch": args.batch or TASKS[args.task]["batch"]}
        case.update(device=args.device, threads=args.threads, amp=args.amp)
        text = profile_case(case, steps=args.steps, rows=args.rows)
    print(text)
    if args.out:
        from ..data.cache import atomic_write_bytes

        atomic_write_bytes(args.out, (text + "\n").encode())
        print(f"wrote {args.out}")
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
    p = sub.add_parser(
        "profile", help="torch.profiler tables (time, memory): LRA training steps of one model, or one --layer"
    )
    p.add_argument("--layer", default=None, help="profile this attention layer alone (as the layer sweep does)")
    p.add_argument("--length", type=int, default=16384, help="--layer: sequence length N")
    p.add_argument("--mode", default="fwd_bwd", choices=["fwd", "fwd_bwd"], help="--layer: what one call does")
    p.add_argument("--dim", type=int, default=64, help="--layer: width")
    p.add_argument("--heads", type=int, default=2, help="--layer: heads")
    p.add_argument("--task", default="listops", choices=list(lra.TASKS))
    p.add_argument("--model", default="transformer", choices=list(lra.MODELS))
    p.add_argument("--batch", type=int, default=None, help="default: the paper's batch for the task")
    p.add_argument("--steps", type=int, default=2, help="profiled training steps (or layer calls)")
    p.add_argument("--rows", type=int, default=12)
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the tables to this file")
    p.set_defaults(func=_profile)
    p = sub.add_parser("plot", help="log-log plots with fitted slopes from a bench JSON file")
    p.add_argument("file")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--min-length", type=int, default=4096)
    p.set_defaults(func=_plot)
