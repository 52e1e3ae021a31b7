"""benchmarks/convert_init.py on a tiny trained teacher: teacher vs random initialisation, per layer."""

from __future__ import annotations

import json

from tests.train.test_convert import teacher_run  # noqa: F401  (fixtures)
from tests.train.test_lm import english_dir  # noqa: F401

from .scripts import load_script


def test_convert_init_reports_both_initialisations_per_layer(tmp_path, teacher_run, capsys):  # noqa: F811
    bench = load_script("convert_init")
    out = tmp_path / "init.json"
    args = [
        str(teacher_run),
        "--options",
        '{"s": 4}',
        "--steps",
        "3",
        "--val-batches",
        "2",
        "--calibration-batches",
        "2",
        "--out",
        str(out),
    ]
    assert bench.main(args) == 0
    table = capsys.readouterr().out
    assert "| layer | teacher init, step 0 |" in table and table.count("\n| ") >= 3
    record = json.loads(out.read_text())
    t, r = record["results"]["teacher"], record["results"]["random"]
    assert t["layers"] == r["layers"] == [0, 1]
    assert all(a < b for a, b in zip(t["step0"], r["step0"]))  # the fit starts below the random layer
