"""Prefill of one long prompt: ``CausalLM.prefill`` (one causal forward) against stepping through it token by token.

Before :meth:`~primaldual.models.CausalLM.prefill` existed, :meth:`~primaldual.models.CausalLM.generate` fed the
prompt through :meth:`~primaldual.models.CausalLM.step` one token at a time: N small calls, each paying the Python
and kernel-launch overhead of every layer. ``prefill`` runs the prompt as one causal forward and returns the same
decoding state. This script times both on one prompt (batch 1, no gradients, float32), checks that their
next-token logits agree, and prints the times and the ratio::

    python benchmarks/prefill_speed.py --prompt 4096 --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch

from primaldual.models import CausalLM
from primaldual.options import check_int


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=4096, help="prompt length N")
    p.add_argument("--attentions", default="softmax,primal", help="comma list of causal attentions (every layer)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (0: torch's default)")
    args = p.parse_args(argv)
    for name in ("prompt", "dim", "depth", "heads", "vocab"):
        check_int(f"--{name}", getattr(args, name), low=1)
    check_int("--threads", args.threads, low=0)
    return args


def time_case(attention: str, args: argparse.Namespace) -> dict[str, float]:
    """Seconds of ``prefill`` and of the token-by-token loop over one random prompt, and their logits' gap."""
    torch.manual_seed(0)
    model = CausalLM(
        args.vocab,
        args.prompt,
        dim=args.dim,
        depth=args.depth,
        num_heads=args.heads,
        ffn_dim=4 * args.dim,
        dropout=0.0,
        attention=attention,
    ).eval()
    ids = torch.randint(0, args.vocab, (1, args.prompt))
    with torch.no_grad():
        model.prefill(ids[:, :16])  # warm-up: first-call allocations and dispatch
        t0 = time.perf_counter()
        logits, _ = model.prefill(ids)
        prefill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        state = model.init_state(1)
        for t in range(args.prompt):
            last, state = model.step(ids[:, t], state)
        loop_s = time.perf_counter() - t0
    gap = (logits[:, -1] - last).abs().max().item()
    return {"prefill_s": prefill_s, "loop_s": loop_s, "ratio": loop_s / prefill_s, "max_logit_gap": gap}


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"CausalLM dim={args.dim} depth={args.depth} heads={args.heads} vocab={args.vocab}, batch 1, "
        f"prompt {args.prompt} tokens, {torch.get_num_threads()} threads, float32"
    )
    rows = []
    for attention in [a.strip() for a in args.attentions.split(",") if a.strip()]:
        r = time_case(attention, args)
        rows.append(r)
        print(
            f"{attention:<10} prefill {r['prefill_s']:8.3f} s   token by token {r['loop_s']:8.3f} s   "
            f"{r['ratio']:6.1f}x faster   (next-token logits differ by {r['max_logit_gap']:.1e})"
        )
    return rows


if __name__ == "__main__":
    main()
