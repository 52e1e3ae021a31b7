"""Dropout's mask sampling on CPU, eager and compiled: ATen's Bernoulli sampler against ``counter_dropout``.

Times ``dropout(relu(x @ w))`` for ``x`` ``(rows, 64)`` and ``w`` ``(64, 128)`` (default 8,192 rows: 1M masked
elements, an LRA FFN activation at batch 4) five ways: the matmul and ReLU alone, ``F.dropout`` eager and compiled
(with ``fallback_random``, as ``trainer.compile`` on CPU), and :func:`primaldual.functional.dropout.counter_dropout`
eager and compiled. Median of ``--calls`` calls after warm-up (the compiled cases compile there).

Run: ``python benchmarks/dropout_sampler.py --threads 2``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from primaldual.functional.dropout import counter_dropout


def _median_ms(f: Callable[[], torch.Tensor], calls: int, warmup: int) -> float:
    for _ in range(warmup):
        f()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    x, w = torch.randn(args.rows, 64), torch.randn(64, 128)

    def plain() -> torch.Tensor:
        return torch.relu(x @ w)

    def aten() -> torch.Tensor:
        return F.dropout(torch.relu(x @ w), args.p)

    def counter() -> torch.Tensor:
        return counter_dropout(torch.relu(x @ w), args.p)

    opts = {"fallback_random": True}
    cases = {
        "matmul + relu only": plain,
        "F.dropout eager": aten,
        "F.dropout compiled": torch.compile(aten, options=opts),
        "counter_dropout eager": counter,
        "counter_dropout compiled": torch.compile(counter, options=opts),
    }
    print(f"{args.rows} x 128 masked elements, p = {args.p}, {args.threads} threads, median of {args.calls} calls")
    for name, f in cases.items():
        print(f"{name:28s} {_median_ms(f, args.calls, args.warmup):8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
