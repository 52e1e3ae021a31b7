"""``primaldual analyze`` on tiny trained runs: a UEA (time-series) and an LRA (token) model, then a comparison."""

from __future__ import annotations

import json
import sys

import pytest

from ..train.helpers import fit_cmd, run


@pytest.mark.parametrize("attention", [["softmax_bn", "linear"], ["softmax_sh", "primal"]])
def test_analyze_a_trained_uea_run(tmp_path, tiny_config, attention):
    pytest.importorskip("matplotlib")
    options = [None, {"s": 4}] if attention[1] == "primal" else None
    cfg = tiny_config(**{"trainer.max_epochs": 1, "model.attention": attention, "model.attention_options": options})
    run_dir = tmp_path / "run"
    run(fit_cmd(cfg, run_dir, "--threads", "1"))
    out = run([sys.executable, "-m", "primaldual.cli", "analyze", str(run_dir), "--samples", "8", "--threads", "1"])
    res = json.loads((run_dir / "analysis" / "analysis.json").read_text())
    assert [layer["mechanism"] for layer in res["layers"]] == attention
    assert res["samples"] == 8 and res["split"] == "test" and res["dataset"] == "JapaneseVowels"
    for layer in res["layers"]:
        assert len(layer["spectrum"]["curve"]) == 2 and layer["spectrum"]["curve_mean"][-1] == pytest.approx(1.0)
    assert (run_dir / "analysis" / "spectra.png").stat().st_size > 1000
    assert attention[1] in out.stdout and "redundancy" in out.stdout


def test_analyze_compares_runs_and_reports_errors(tmp_path, tiny_config, capsys):
    """Two trained runs compared (in-process through ``primaldual.cli.main``, which is what the console script
    calls); each bad input ends with one stderr line and exit code 2."""
    from primaldual.cli import main

    pytest.importorskip("matplotlib")
    dirs = []
    for name in ("softmax", "primal"):
        cfg = tiny_config(
            **{
                "trainer.max_epochs": 1,
                "model.attention": name,
                "model.attention_options": {"s": 4} if name == "primal" else None,
            },
        )
        dirs.append(tmp_path / name)
        run(fit_cmd(cfg, dirs[-1], "--threads", "1"))
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
