"""``primaldual bench {layers,lra,steps,decode,generate,profile,plot}`` and ``primaldual smoke``: the benchmark subcommands."""

from __future__ import annotations

import argparse

from ..utils.cli import FORMATTER, add_deprecated_alias, examples

__all__ = ["register"]


def _smoke(args: argparse.Namespace) -> int:
    from .smoke import format_rows, smoke

    rows = smoke(batch=args.batch, length=args.length, dim=args.dim, heads=args.heads)
    print(format_rows(rows))
    return 0 if all(r["finite"] for r in rows) else 1


def _plot(args: argparse.Namespace) -> int:
    from .plot import plot_layers

    for p in plot_layers(args.file, args.out, args.min_length):
        print(f"wrote {p}")
    return 0


def _lra(args: argparse.Namespace) -> int:
    from . import lra

    if args.worker is None:  # check the lists here so that a typo is a one-line error before any case runs
        for flag, given, known in (
            ("--tasks", args.tasks, list(lra.TASKS)),
            ("--models", args.models, lra.BENCH_MODELS),
        ):
            bad = [v.strip() for v in given.split(",") if v.strip() and v.strip() not in known]
            if bad:
                raise ValueError(f"{flag}: unknown {bad}; choose from {list(known)}")
    return lra.run_from_args(args)


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
        from ..utils.io import atomic_write_text

        atomic_write_text(args.out, text + "\n")
        print(f"wrote {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` (with its sub-subcommands) and ``smoke`` to the ``primaldual`` parser."""
    from . import decode, generate, layers, lra, steps

    p = subparsers.add_parser(
        "smoke",
        help="forward + backward through every registered attention, with timings",
        description="Forward + backward through every registered attention on random padded input, with timings.",
        formatter_class=FORMATTER,
        epilog=examples("primaldual smoke", "primaldual smoke --batch 2 --length 1024 --dim 64 --heads 4"),
    )
    p.add_argument("--batch", type=int, default=4, help="batch size")
    p.add_argument("--length", type=int, default=512, help="sequence length N")
    p.add_argument("--dim", type=int, default=64, help="width")
    p.add_argument("--heads", type=int, default=4, help="heads")
    p.set_defaults(func=_smoke)

    bench = subparsers.add_parser(
        "bench",
        help="efficiency benchmarks (layer sweeps, LRA steps, config training steps, profiles, plots)",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual bench layers --attentions softmax,primal --lengths 256,1024 --out runs/bench/layers.json",
            "primaldual bench plot runs/bench/layers.json --out docs/figures",
        ),
    )
    sub = bench.add_subparsers(dest="bench_command", required=True)
    p = sub.add_parser(
        "layers",
        help="time / peak-memory sweep over N for every attention",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual bench layers --attentions softmax,primal,linear --lengths 256,1024,4096 --threads 2",
            "primaldual bench layers --attentions all --peers --quadratic-max 16384 --out runs/bench/layers.json",
        ),
    )
    layers.add_arguments(p)
    p.set_defaults(func=layers.run_from_args)
    p = sub.add_parser(
        "lra",
        help="time per 1K training steps and peak memory on LRA task shapes",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual bench lra --tasks listops --models transformer,primalformer --batch 4 --steps 5",
            "primaldual bench lra --device cuda --amp --out runs/bench/lra_cuda.json",
        ),
    )
    lra.add_arguments(p)
    p.set_defaults(func=_lra)
    p = sub.add_parser(
        "steps",
        help="ms per full training step of training configs, interleaved in one process, with ratios",
        description=(
            "Time the full training step (training_loss forward incl. batch augmentation, backward, optimiser step,\n"
            "zero_grad) of each training config on one fixed batch, interleaved in one process so that the ratios\n"
            "hold on a noisy machine. No data loading, evaluation or Lightning loop; float32 on the CPU. Take\n"
            "timings with nothing else running."
        ),
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual bench steps vision/fashion_mnist/deit vision/fashion_mnist/primal_plus --threads 2",
            "primaldual bench steps uea/JapaneseVowels/transformer uea/JapaneseVowels/primalformer --rounds 9",
            "primaldual bench steps lra/listops/transformer lra/listops/primal_plus --batch 8 --set model.dropout=0.0",
            note="Writes OUT/steps.json and OUT/steps.md; the ratio column is relative to the first CONFIG.",
        ),
    )
    steps.add_arguments(p)
    p.set_defaults(func=steps.run_from_args)
    p = sub.add_parser(
        "decode",
        help="per-token latency and memory of generation against context length (KV cache vs constant state)",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual bench decode --attentions softmax,primal,linear --batches 1,8 --contexts 1024,4096,16384,65536",
            'primaldual bench decode --attentions primal --contexts 1024,65536 --options \'{"primal": {"s": 30}}\'',
        ),
    )
    decode.add_arguments(p)
    p.set_defaults(func=decode.run_from_args)
    p = sub.add_parser(
        "generate",
        help="tokens/s and peak memory of generation (prefill + greedy decoding) against Hugging Face GPT-2",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual bench generate --batches 1,8 --prompts 32,512,4096 --out runs/bench/generate.json",
            "primaldual bench generate --models softmax,hf_gpt2 --prompts 512 --new 64 --threads 2",
            note="softmax, primal (PrimalFormer) and primal_plus (last layer primal) are CausalLM; hf_gpt2 needs the hf extra.",
        ),
    )
    generate.add_arguments(p)
    p.set_defaults(func=generate.run_from_args)
    p = sub.add_parser(
        "profile",
        help="torch.profiler tables (time, memory): LRA training steps of one model, or one --layer",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual bench profile --task listops --model primalformer --batch 4 --threads 2",
            "primaldual bench profile --layer primal --length 4096 --mode fwd_bwd --out runs/bench/primal_profile.txt",
        ),
    )
    p.add_argument("--layer", default=None, help="profile this attention layer alone (as the layer sweep does)")
    p.add_argument("--length", type=int, default=16384, help="--layer: sequence length N")
    p.add_argument("--mode", default="fwd_bwd", choices=["fwd", "fwd_bwd"], help="--layer: what one call does")
    p.add_argument("--dim", type=int, default=64, help="--layer: width")
    p.add_argument("--heads", type=int, default=2, help="--layer: heads")
    p.add_argument("--task", default="listops", choices=list(lra.TASKS))
    p.add_argument("--model", default="transformer", choices=list(lra.BENCH_MODELS))
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the paper's batch for the task, 4)")
    p.add_argument("--steps", type=int, default=2, help="profiled training steps (or layer calls)")
    p.add_argument("--rows", type=int, default=12, help="rows per table")
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", action="store_true", help="fp16 autocast on CUDA")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    p.add_argument("--out", default=None, help="also write the tables to this file")
    p.set_defaults(func=_profile)
    p = sub.add_parser(
        "plot",
        help="log-log plots with fitted slopes from a bench JSON file",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual bench plot runs/bench/layers.json",
            "primaldual bench plot runs/bench/layers.json --out docs/figures --min-length 4096",
        ),
    )
    p.add_argument("file", help="a JSON file written by `primaldual bench layers`")
    p.add_argument("--out", default=None, help="output folder (default: the JSON file's folder)")
    add_deprecated_alias(p, "--out-dir", "--out")
    p.add_argument("--min-length", type=int, default=4096, help="fit the slopes from this N on")
    p.set_defaults(func=_plot)
