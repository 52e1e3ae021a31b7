"""``primaldual analyze`` on tiny trained runs: a UEA (time-series) and an LRA (token) model, then a comparison."""

from __future__ import annotations

import json

import pytest

RUNS = {"softmax": ["softmax_bn", "linear"], "primal": ["softmax_sh", "primal"]}  # run directory -> attention


def test_analyze_trained_runs_then_compare_them_and_report_errors(tmp_path, capsys):
    """Two tiny UEA runs (one epoch each; one test, so that they train once whatever the test distribution), each
    analysed on its own; then compared; each bad input ends with one stderr line and exit code 2. In-process, through
    ``primaldual.cli.main``, which is what the console script calls: a process start costs more than the work here
    (the harness tests run the console script itself)."""
    from primaldual.cli import main

    from ..conftest import write_config

    pytest.importorskip("matplotlib")
    for name, attention in RUNS.items():
        options = [None, {"s": 4}] if attention[1] == "primal" else None
        cfg = write_config(tmp_path / f"cfg_{name}", None, **{"trainer.max_epochs": 1, "model.attention": attention,
                                                               "model.attention_options": options})  # fmt: skip
        run_dir = tmp_path / name
        assert main(["fit", "--config", str(cfg), "--run-dir", str(run_dir)]) == 0
        capsys.readouterr()
        assert main(["analyze", str(run_dir), "--samples", "8"]) == 0
        out = capsys.readouterr().out
        res = json.loads((run_dir / "analysis" / "analysis.json").read_text())
        assert [layer["mechanism"] for layer in res["layers"]] == attention
        assert res["samples"] == 8 and res["split"] == "test" and res["dataset"] == "JapaneseVowels"
        for layer in res["layers"]:
            assert len(layer["spectrum"]["curve"]) == 2 and layer["spectrum"]["curve_mean"][-1] == pytest.approx(1.0)
        assert (run_dir / "analysis" / "spectra.png").stat().st_size > 1000
        assert attention[1] in out and "redundancy" in out

    dirs = [tmp_path / "softmax", tmp_path / "primal"]
    out = tmp_path / "cmp"
    cmd = ["analyze", *map(str, dirs), "--samples", "4", "--ckpt", "last"]
    assert main([*cmd, "--out", str(out), "--labels", "Transformer", "PrimalFormer", "--split", "val"]) == 0
    assert (out / "compare_spectra.png").is_file() and (out / "Transformer" / "spectra.png").is_file()
    assert "| PrimalFormer | 1 | primal |" in (out / "summary.md").read_text()
    # both runs come from the config "tiny": without --labels they are told apart by directory, none overwritten
    assert main([*cmd, "--out", str(tmp_path / "plain")]) == 0
    assert sorted(p.name for p in (tmp_path / "plain").iterdir() if p.is_dir()) == ["tiny", "tiny_primal"]
    assert "| tiny (primal) | 1 | primal |" in (tmp_path / "plain" / "summary.md").read_text()
    capsys.readouterr()
    for args, needle in (
        ([*cmd, "--labels", "A", "A"], "distinct"),
        (["analyze", str(tmp_path / "nowhere")], "no such run directory"),
        (["analyze", str(tmp_path)], "config.yaml"),
        ([*cmd, "--split", "unlabelled"], "split"),
    ):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("primaldual analyze") and needle in err[0], err
