"""``time_interleaved``: warm-up first, then rounds whose order rotates by one; bad counts are refused."""

from __future__ import annotations

import pytest

from primaldual.bench.interleave import time_interleaved


def test_rounds_rotate_and_every_case_gets_one_figure_per_round():
    calls: list[str] = []
    cases = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    out = time_interleaved(cases, rounds=3, calls=2, warmup=1)
    assert (
        calls
        == ["a", "b", "c"]
        + ["a"] * 2
        + ["b"] * 2
        + ["c"] * 2
        + ["b"] * 2
        + ["c"] * 2
        + ["a"] * 2
        + ["c"] * 2
        + ["a"] * 2
        + ["b"] * 2
    )
    assert list(out) == ["a", "b", "c"] and all(len(v) == 3 and min(v) >= 0 for v in out.values())


@pytest.mark.parametrize("rounds, calls, warmup", [(0, 1, 0), (1, 0, 0), (1, 1, -1)])
def test_bad_counts_are_refused(rounds, calls, warmup):
    with pytest.raises(ValueError, match="time_interleaved: need rounds >= 1"):
        time_interleaved({"a": lambda: None}, rounds=rounds, calls=calls, warmup=warmup)
