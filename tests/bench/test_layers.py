"""The layer sweep runs end to end on a tiny case and the plot command draws from its file."""

from __future__ import annotations

import json

import pytest

from primaldual.bench.layers import SweepConfig, fit_slope, run_sweep, summary_table


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One tiny sweep (a process per case), shared by the file and plot tests: ``(records, out)``."""
    cfg = SweepConfig(attentions=["softmax", "linear"], lengths=[32, 64], modes=["fwd", "fwd_bwd"], repeats=1, warmup=0)
    out = tmp_path_factory.mktemp("sweep") / "layers.json"
    return run_sweep(cfg, out, progress=False), out


def test_sweep_writes_json_and_csv(sweep):
    records, out = sweep
    assert len(records) == 8 and all(r["status"] == "ok" for r in records), records
    data = json.loads(out.read_text())
    assert data["machine"]["torch"] and data["settings"]["batch"] == 4
    assert out.with_suffix(".csv").read_text().count("\n") == 9
    assert all(r["time_ms"] > 0 and r["peak_mem_mb"] >= 0 for r in records)
    assert "softmax" in summary_table(records, min_length=32)


def test_oom_is_recorded_not_raised(tmp_path):
    cfg = SweepConfig(
        attentions=["softmax"],
        lengths=[4096, 8192],
        modes=["fwd"],
        repeats=1,
        warmup=0,
        batch=64,
        mem_limit_gb=1.5,
        options={"softmax": {"backend": "eager"}},
    )
    records = run_sweep(cfg, tmp_path / "oom.json", progress=False)
    assert records[0]["status"] == "oom" and records[1]["status"] == "skipped"


def test_quadratic_mechanisms_skip_lengths_above_the_cap(tmp_path):
    cfg = SweepConfig(
        attentions=["softmax", "linear"], lengths=[32, 64], modes=["fwd"], repeats=1, warmup=0, quadratic_max=32
    )
    records = run_sweep(cfg, tmp_path / "q.json", progress=False)
    status = {(r["attention"], r["length"]): r["status"] for r in records}
    assert status == {("softmax", 32): "ok", ("softmax", 64): "skipped", ("linear", 32): "ok", ("linear", 64): "ok"}


def test_fit_slope():
    assert abs(fit_slope([1, 2, 4, 8], [3, 6, 12, 24]) - 1.0) < 1e-9
    assert fit_slope([1], [1]) is None


def test_plot_from_file(sweep, tmp_path):
    pytest.importorskip("matplotlib")
    from primaldual.bench.plot import plot_layers

    (tmp_path / "l.json").write_bytes(sweep[1].read_bytes())  # the plots are written beside the file
    paths = plot_layers(tmp_path / "l.json", min_length=32)
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths)


def test_primal_sweep_records_its_projection_floor(tmp_path):
    from primaldual.bench.layers import FLOOR, projection_floor
    from primaldual.cli import main

    out = tmp_path / "floor.json"
    args = ["bench", "layers", "--attentions", "primal", "--lengths", "64", "--modes", "fwd_bwd", "--repeats", "1"]
    assert main([*args, "--warmup", "0", "--options", '{"primal": {"s": 4}}', "--out", str(out)]) == 0
    recs = json.loads(out.read_text())["records"]
    assert {r["attention"] for r in recs} == {"primal", FLOOR}
    assert all(r["status"] == "ok" for r in recs)
    assert next(r for r in recs if r["attention"] == FLOOR)["options"] == {"s": 4}
    floor = projection_floor(64, 2, s=20)
    assert [tuple(p.shape) for p in floor.parameters()] == [(128, 64), (128,), (64, 80), (64,)]


def test_tokens_per_call_sets_each_lengths_batch(tmp_path):
    cfg = SweepConfig(attentions=["linear"], lengths=[16, 64], modes=["fwd"], repeats=1, warmup=0, tokens=128)
    records = run_sweep(cfg, tmp_path / "t.json", progress=False)
    assert [(r["length"], r["batch"], r["status"]) for r in records] == [(16, 8, "ok"), (64, 2, "ok")]


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--batch", "2", "--tokens", "64"], "--batch and --tokens: give one"),
        (["--tokens", "0"], "--tokens: expected an integer >= 1, got 0"),
        (["--batch", "0"], "--batch: expected an integer >= 1, got 0"),
    ],
)
def test_batch_and_tokens_are_checked(tmp_path, argv, match):
    from primaldual.bench.layers import main

    with pytest.raises(ValueError, match=match):
        main(["--attentions", "linear", "--lengths", "16", "--out", str(tmp_path / "x.json"), *argv])
