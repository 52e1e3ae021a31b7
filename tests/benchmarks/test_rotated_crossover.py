"""benchmarks/rotated_crossover.py: each case takes the path it names (through the layer's ``path`` option), the
suggested thresholds, bad options."""

from __future__ import annotations

import dataclasses
import json

import pytest

from primaldual.functional.primal_rotated import DEFAULT_THRESHOLDS, RotatedThresholds
from tests.attention.test_primal import LinalgCalls

from .scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("rotated_crossover")


def _tiny(*extra: str) -> list[str]:
    return ["--rounds", "1", "--calls", "1", "--threads", "1", "--warmup", "0", "--dim", "16", "--s", "4", *extra]


def test_threshold_names_are_fields(script):
    names = {f.name for f in dataclasses.fields(RotatedThresholds)}
    for causal in (False, True):
        for compiled in (False, True):
            assert script.threshold_name(causal, compiled) in names


@pytest.mark.parametrize("causal", [False, True])
def test_each_case_takes_its_path(script, tmp_path, causal):
    cases = script.build_cases(script.parse(_tiny(*(["--causal"] if causal else []))), 8)
    assert list(cases) == ["floor", "rotated", "scores"]
    for case, taken in (("scores", []), ("floor", []), ("rotated", ["qr", "eigh"])):
        with LinalgCalls() as calls:
            cases[case]()
        assert calls.seen == taken, case

    out = tmp_path / "crossover.json"
    flags = ["--lengths", "8", "12", "--json", str(out), *(["--causal"] if causal else [])]
    assert script.main(_tiny(*flags)) == 0
    data = json.loads(out.read_text())
    name = script.threshold_name(causal, False)
    assert data["meta"]["threshold"] == name
    assert data["meta"]["default_thresholds"] == dataclasses.asdict(DEFAULT_THRESHOLDS)
    suggested = data["meta"]["suggested_thresholds"]
    assert suggested is None or RotatedThresholds(**suggested) == script.suggest(data["rows"], causal, False)
    assert [row["N"] for row in data["rows"]] == [8, 12]
    for row in data["rows"]:
        assert set(row["ms"]) == {"floor", "rotated", "scores"} and row["over_floor"]["floor"] == 1.0
        assert row["rotated_vs_scores"] == pytest.approx(row["ms"]["scores"] / row["ms"]["rotated"])


@pytest.mark.parametrize("causal", [False, True])
def test_suggestion_is_where_the_rotated_path_stays_faster(script, causal):
    key = "rows" if causal else "N"
    ratios = {1024: 0.9, 2048: 1.05, 3072: 0.98, 4096: 1.1, 8192: 1.2}
    rows = [{key: n, "rotated_vs_scores": r} for n, r in ratios.items()]
    got = script.suggest(rows, causal, True)
    assert isinstance(got, RotatedThresholds)
    assert got == dataclasses.replace(DEFAULT_THRESHOLDS, **{script.threshold_name(causal, True): 4096})
    rows[-1]["rotated_vs_scores"] = 0.99  # slower at the longest length: no crossover measured
    assert script.suggest(rows, causal, True) is None


def test_bad_options_are_named(script, capsys):
    with pytest.raises(SystemExit):
        script.main(_tiny("--lengths", "0"))
    assert "--lengths >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
