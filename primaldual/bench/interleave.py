"""Interleaved timing: several cases warmed up, then timed in rounds whose order rotates by one each round.

Timing case A for a while and then case B folds the machine's drift (other jobs, frequency changes) into their
ratio; rotating rounds spread it over every case alike. Used by ``benchmarks/primal_floor.py`` and
``benchmarks/lra_compile.py`` (``primaldual bench steps`` has its own loop, with garbage collection and progress
lines between rounds).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["time_interleaved"]


def time_interleaved(
    cases: dict[str, Callable[[], object]], *, rounds: int, calls: int, warmup: int
) -> dict[str, list[float]]:
    """Run each case ``warmup`` times, then ``rounds`` rounds of ``calls`` consecutive calls of every case.

    Round ``r`` starts at case ``r mod len(cases)`` (in the given order) and wraps around.

    Returns:
        Per case, in the given order, its mean milliseconds per call in each round (``rounds`` values).
    """
    if rounds < 1 or calls < 1 or warmup < 0:
        raise ValueError(
            f"time_interleaved: need rounds >= 1, calls >= 1, warmup >= 0; got {rounds}, {calls}, {warmup}"
        )
    names = list(cases)
    for name in names:
        for _ in range(warmup):
            cases[name]()
    per_round: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(calls):
                cases[name]()
            per_round[name].append((time.perf_counter() - t0) / calls * 1e3)
    return per_round
