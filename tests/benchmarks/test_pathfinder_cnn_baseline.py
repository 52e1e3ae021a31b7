"""The Pathfinder CNN data check runs end to end on a tiny generated split and writes its JSON."""

from __future__ import annotations

import json

import pytest

from primaldual.recipes.pathfinder import write_pathfinder

from .scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("pathfinder_cnn_baseline")


def test_runs_and_writes_curve(script, tmp_path):
    root = write_pathfinder(tmp_path / "pf", {"train": 16, "test": 8}, seed=3)
    out = tmp_path / "cnn.json"
    record = script.main(
        ["--root", str(root), "--steps", "3", "--batch-size", "4", "--eval-every", "2", "--out", str(out)]
    )
    assert [r["step"] for r in record["curve"]] == [2, 3]
    assert all(0.0 <= r["test_acc"] <= 1.0 for r in record["curve"])
    assert json.loads(out.read_text())["source"] == "generated"


def test_rejects_bad_steps(script, tmp_path):
    with pytest.raises(SystemExit):
        script.main(["--root", str(tmp_path), "--steps", "0"])
