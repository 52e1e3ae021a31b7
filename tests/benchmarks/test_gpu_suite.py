"""benchmarks/gpu_suite.py at toy sizes on the CPU (``--quick``): every step runs and the output folder holds
``suite.json`` and ``suite.md`` after it; the GPU figures come from a run on a GPU (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_every_step_and_refuses_the_cpu_without_quick(tmp_path):
    script = ROOT / "benchmarks" / "gpu_suite.py"
    out = tmp_path / "suite"
    cmd = [
        sys.executable,
        str(script),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--quick",
        "--steps",
        "tests,layers,profile",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    suite = json.loads((out / "suite.json").read_text())
    assert suite["environment"]["torch"] and suite["steps"]["tests"]["status"] == "passed"
    layers = suite["steps"]["layers"]
    assert layers["status"] == "done"
    by_label = {r["label"]: r for r in layers["records"]}
    assert by_label["primal"]["status"] == "ok" and by_label["floor"]["status"] == "ok"
    assert "| primal | False |" in (out / "suite.md").read_text()
    assert (
        suite["steps"]["profile"]["status"] == "done" and "| `aten::" in (out / "profile_primal_eager.md").read_text()
    )
    bad = subprocess.run([sys.executable, str(script), "--out", str(out), "--device", "cpu"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "only with --quick" in bad.stderr
    for arg, msg in (
        ("--budget=layers=0", "SECONDS > 0"),
        ("--budget=foo=3", "STEP in"),
        ("--layers=flash", "--layers: unknown ['flash']"),
    ):
        bad = subprocess.run([sys.executable, str(script), "--out", str(out), "--device", "cpu", "--quick", arg],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert bad.returncode == 2 and msg in bad.stderr, bad.stderr


def test_failures_and_budget_cuts_are_named():
    """A failing case keeps its ``FAILED`` line whatever the tail shows; a budget cut is not a failure."""
    from tests.benchmarks.scripts import load_script

    suite = load_script("gpu_suite")
    out = "....F\n" + "x" * 5000 + "\nFAILED tests/a.py::test_b[softmax-{}-full] - AssertionError: gradient 0\n1 failed"
    assert suite._failures(out) == ["FAILED tests/a.py::test_b[softmax-{}-full] - AssertionError: gradient 0"]
    assert [suite._status(c) for c in (0, None, 1)] == ["done", "budget spent", "failed"]
