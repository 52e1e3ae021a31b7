"""The multi-seed runner: the table keeps tasks apart, finished runs are reused, a failure does not cancel the rest."""

from __future__ import annotations

import pytest

from primaldual.train.seeds import format_table, run_seeds


def _summary(dataset: str, name: str, protocol: str, acc: float) -> dict:
    return {"dataset": dataset, "name": name, "protocol": protocol, "test_acc": acc}


def test_table_mean_std_per_protocol():
    rows = [_summary("JapaneseVowels", "transformer", "heldout", a) for a in (0.97, 0.98, 0.99)]
    rows.append(_summary("JapaneseVowels", "transformer", "paper", 0.99))
    table = format_table(rows, "primaldual seeds --configs x")
    assert "| transformer | 98.00 +- 1.00 (n=3) | 99.00 +- 0.00 (n=1) |" in table
    assert "dataset |" not in table  # one dataset: no dataset column
    assert table.endswith("Command: `primaldual seeds --configs x`")


def test_table_never_averages_two_tasks_with_the_same_config_name():
    rows = [_summary("listops", "transformer_reduced", "heldout", 0.3)]
    rows.append(_summary("fashion_mnist", "transformer_reduced", "heldout", 0.8))
    table = format_table(rows)
    assert "| listops | transformer_reduced | 30.00 +- 0.00 (n=1) |" in table
    assert "| fashion_mnist | transformer_reduced | 80.00 +- 0.00 (n=1) |" in table


def test_table_marks_a_missing_protocol():
    rows = [_summary("d", "a", "heldout", 0.5), _summary("d", "b", "paper", 0.6)]
    table = format_table(rows)
    assert "| a | 50.00 +- 0.00 (n=1) | - |" in table and "| b | - | 60.00 +- 0.00 (n=1) |" in table


def test_runs_then_reuses_finished_runs(tmp_path, tiny_config):
    path = tiny_config(**{"trainer.max_epochs": 1})
    base = tmp_path / "runs"
    first = run_seeds([str(path)], [0, 1], ["heldout"], [], base=str(base), jobs=2, threads=1)
    assert [s["seed"] for s in first] == [0, 1] and all(0 <= s["test_acc"] <= 1 for s in first)
    logs = sorted(base.rglob("*.log"))
    assert len(logs) == 2
    stamps = [p.stat().st_mtime_ns for p in logs]
    again = run_seeds([str(path)], [0, 1], ["heldout"], [], base=str(base), jobs=1)
    assert again == first and [p.stat().st_mtime_ns for p in logs] == stamps  # nothing re-run


def test_one_failed_run_does_not_cancel_the_others(tmp_path, tiny_config):
    good = tiny_config(**{"trainer.max_epochs": 1})
    (tmp_path / "b").mkdir()
    # a valid config whose data directory is missing: it fails inside its run, not when the plan is made
    bad = tiny_config(directory=tmp_path / "b", name="bad", **{"data.root": str(tmp_path / "missing")})
    base = tmp_path / "runs"
    with pytest.raises(RuntimeError, match="1 of 2 runs failed"):
        run_seeds([str(bad), str(good)], [0], ["heldout"], [], base=str(base), jobs=1)
    assert [p.parent.name.split("-")[0] for p in base.rglob("summary.json")] == ["tiny"]
