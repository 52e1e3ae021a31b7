"""Does the teacher initialisation (KSVD + least squares) help stage 1? Per layer, teacher vs random initialisation.

For a trained softmax ``CausalLM`` run, converts the chosen layers twice, once with ``init="teacher"`` and once with
``init="random"`` (the layers' own initialisation), trains each with the same stage-1 batches, and reports each
layer's normalised output error (:func:`primaldual.convert.layer_losses`) on held-out validation batches at step 0
and after stage 1, as a Markdown table (and JSON with ``--out``)::

    python benchmarks/convert_init.py runs/lm/english/transformer_medium-heldout-seed0-* --student primal \\
        --layers all --steps 100 --out runs/bench/convert_init.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from primaldual.convert import attention_transfer, find_blocks, initialise_students, swap_attention
from primaldual.convert import teacher_attention_io as teacher_io
from primaldual.tasks.lm.convert import load_teacher, train_batches
from primaldual.utils.io import atomic_write_json


def held_out(dm, batch_size: int, batches: int) -> list[torch.Tensor]:
    """The first ``batches`` validation chunks, ``batch_size`` at a time (full chunks only)."""
    ds = dm.datasets["val"]
    n = min(len(ds) // batch_size, batches)
    return [torch.stack([ds[b * batch_size + i][0] for i in range(batch_size)]) for b in range(n)]


def evaluate(teacher, student, layers, val) -> list[float]:
    """Per-layer normalised error, summed over the validation batches (numerator and denominator apart)."""
    blocks = find_blocks(student)
    num = torch.zeros(len(layers), dtype=torch.float64)
    den = torch.zeros(len(layers), dtype=torch.float64)
    with torch.no_grad():
        for ids in val:
            for j, (i, (x, y)) in enumerate(zip(layers, teacher_io(teacher, ids, None, layers))):
                out = blocks[i].attn(x)
                num[j] += (out - y).double().square().sum()
                den[j] += y.double().square().sum()
    return (num / den).tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("teacher", type=Path, help="a finished softmax CausalLM run directory")
    ap.add_argument("--student", default="primal", choices=["primal", "hybrid"])
    ap.add_argument("--layers", default="all", help="'all' or comma-separated indices (default all)")
    ap.add_argument("--options", default='{"s": 30, "eta": 0.1, "ksvd_reduction": "sample"}', help="JSON options")
    ap.add_argument("--steps", type=int, default=100, help="stage-1 updates (default 100)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--calibration-batches", type=int, default=4)
    ap.add_argument("--val-batches", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    layers = "all" if args.layers == "all" else [int(i) for i in args.layers.split(",")]
    options = json.loads(args.options)
    tcfg, dm, module, _ = load_teacher(args.teacher)
    teacher = module.model.eval()
    B = tcfg.data.batch_size
    val = held_out(dm, B, args.val_batches)
    results = {}
    for init in ("teacher", "random"):
        torch.manual_seed(args.seed)
        student, chosen = swap_attention(teacher, args.student, layers, **options)
        batches = train_batches(dm, B, args.seed)
        calib = [next(batches)[0] for _ in range(args.calibration_batches)]
        if init == "teacher":
            initialise_students(teacher, student, chosen, torch.cat(calib))
        before = evaluate(teacher, student, chosen, val)
        attention_transfer(teacher, student, chosen, batches, args.steps, lr=args.lr)
        after = evaluate(teacher, student, chosen, val)
        results[init] = {"layers": chosen, "step0": before, "after": after}
        print(f"{init}: step 0 {[round(v, 4) for v in before]}, after {args.steps} {[round(v, 4) for v in after]}")
    print(
        f"\n| layer | teacher init, step 0 | random init, step 0 | teacher init, after {args.steps} | random init, "
        f"after {args.steps} |\n|---|---|---|---|---|"
    )
    for j, i in enumerate(results["teacher"]["layers"]):
        t, r = results["teacher"], results["random"]
        print(f"| {i} | {t['step0'][j]:.4f} | {r['step0'][j]:.4f} | {t['after'][j]:.4f} | {r['after'][j]:.4f} |")
    record = {
        "teacher": str(args.teacher),
        "student": args.student,
        "options": options,
        "steps": args.steps,
        "tokens_per_step": B * tcfg.data.max_len,
        "results": results,
    }
    if args.out:
        atomic_write_json(args.out, record)
    if not all(math.isfinite(v) for r in results.values() for v in r["after"]):
        raise SystemExit("non-finite stage-1 error: lower --lr")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
