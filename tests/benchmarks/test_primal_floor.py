"""benchmarks/primal_floor.py: one process beside a baseline tree, several processes and their summary, bad options."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from .scripts import load_script

REPO = Path(__file__).resolve().parents[2]
needs_cxx = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler for Inductor"
)


@pytest.fixture(scope="module")
def script():
    return load_script("primal_floor")


@pytest.fixture
def forget_baseline():
    """The baseline tree is imported as ``primaldual_baseline``; drop it afterwards."""
    yield
    for name in [m for m in sys.modules if m == "primaldual_baseline" or m.startswith("primaldual_baseline.")]:
        del sys.modules[name]


def _tiny(*extra: str) -> list[str]:
    return ["--rounds", "1", "--calls", "1", "--threads", "1", *extra]


@needs_cxx
def test_one_process_times_the_floor_the_layer_compiled_and_a_baseline(script, tmp_path, forget_baseline):
    out = tmp_path / "floor.json"
    args = _tiny("--lengths", "32", "--warmup", "1", "--baseline-tree", str(REPO), "--json", str(out))
    assert script.main(args) == 0
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["N"] == 32 and list(row["cases"]) == ["floor", "primal", "primal_compiled", "baseline"]
    assert row["over_floor"]["floor"] == 1.0 and row["baseline_over"]["baseline"] == 1.0
    for case in row["cases"].values():
        assert len(case["rounds_ms"]) == 1 and case["min_ms"] <= case["ms"] <= case["max_ms"]
    assert data["meta"]["settings"]["baseline_tree"] == str(REPO)


def test_processes_run_apart_and_are_summarised(script, tmp_path, capsys):
    out = tmp_path / "floor.json"
    args = _tiny("--lengths", "16", "24", "--warmup", "0", "--skip-compiled", "--processes", "2", "--json", str(out))
    assert script.main(args) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["processes"] == 2 and len(data["processes"]) == 2
    assert all(list(p["rows"][0]["cases"]) == ["floor", "primal"] for p in data["processes"])
    assert [row["N"] for row in data["summary"]] == [16, 24]
    for row in data["summary"]:
        ratio = row["over_floor"]["primal"]
        assert len(ratio["per_process"]) == 2 and ratio["min"] <= ratio["median"] <= ratio["max"]
        assert "baseline_over" not in row
    assert "N=24 over 2 processes" in capsys.readouterr().out


def test_a_failing_process_is_reported_with_its_error(script, tmp_path):
    broken = tmp_path / "tree" / "primaldual"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this tree does not import')\n")
    args = _tiny("--lengths", "16", "--warmup", "0", "--skip-compiled", "--processes", "2")
    with pytest.raises(RuntimeError, match=r"process 1 of 2 failed(.|\n)*this tree does not import"):
        script.main([*args, "--baseline-tree", str(tmp_path / "tree")])


def test_summary_is_the_median_and_range_of_each_ratio(script):
    def rows(n: int, ratio: float, baseline: float) -> list[dict]:
        return [{"N": n, "over_floor": {"floor": 1.0, "primal": ratio}, "baseline_over": {"primal": baseline}}]

    (row,) = script.summarize([rows(8, 2.0, 1.5), rows(8, 1.0, 1.1), rows(8, 4.0, 1.3)])
    assert row["over_floor"]["primal"] == {"median": 2.0, "min": 1.0, "max": 4.0, "per_process": [2.0, 1.0, 4.0]}
    assert row["over_floor"]["floor"]["median"] == 1.0 and row["baseline_over"]["primal"]["median"] == 1.3
    with pytest.raises(ValueError, match="different lengths"):
        script.summarize([rows(8, 2.0, 1.5), rows(16, 2.0, 1.5)])
    with pytest.raises(ValueError, match="no process results"):
        script.summarize([])


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--processes", "0"], "--processes must be at least 1"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--lengths", "0"], "--lengths >= 1"),
        (["--warmup", "-1"], "--warmup >= 0"),
        (["--baseline-tree", "/no/such/tree"], "no primaldual/__init__.py under /no/such/tree"),
    ],
)
def test_rejects_bad_options(script, capsys, bad, message):
    with pytest.raises(SystemExit):
        script.main(bad)
    assert message in capsys.readouterr().err
