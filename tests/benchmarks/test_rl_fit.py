"""benchmarks/rl_fit.py on tiny runs: it rebuilds each run's model (ours with GPT-2's block options, and the
Hugging Face peer) from its directory and scores its last checkpoint on the same windows, in evaluation mode."""

from __future__ import annotations

import pytest
import torch

from tests.rl.test_train import _fit, hopper_dir  # noqa: F401  (hopper_dir: a fixture)

from .scripts import load_script

pytest.importorskip("h5py")
pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")


def test_rl_fit_scores_runs_on_the_same_windows(tmp_path, hopper_dir, capsys):  # noqa: F811
    gpt2 = {"init": "gpt2", "activation": "relu", "attn_drop": 0.1, "ffn_drop": 0.0}
    runs = [tmp_path / "dt", tmp_path / "dt_gpt2"]
    assert _fit(tmp_path, hopper_dir, runs[0], model={"init": "pytorch"}) == 0  # the DT's default before GPT-2's
    assert _fit(tmp_path, hopper_dir, runs[1], model=gpt2) == 0
    bench = load_script("rl_fit")
    a, b = (bench.fit_mse(r, windows=16, seed=0, batch=5) for r in runs)
    assert (a["step"], b["step"]) == (2, 2) and a["options"] == "pytorch, gelu, attn 0.0, ffn None"
    assert b["options"] == "gpt2, relu, attn 0.1, ffn 0.0"
    assert 0 < a["mse"] < 4 and 0 < b["mse"] < 4 and a["mse"] != b["mse"]
    # evaluation mode and fixed windows: the same number twice, whatever the batching
    assert bench.fit_mse(runs[0], windows=16, seed=0, batch=16)["mse"] == pytest.approx(a["mse"], rel=1e-6)
    assert bench.main([str(r) for r in runs] + ["--windows", "16", "--threads", str(torch.get_num_threads())]) == 0
    out = capsys.readouterr().out
    assert out.count("| hopper-medium | tiny |") == 2
    with pytest.raises(FileNotFoundError, match="no config.yaml"):
        bench.fit_mse(tmp_path, windows=16, seed=0)
    with pytest.raises(ValueError, match="--windows 100000"):
        bench.fit_mse(runs[0], windows=100000, seed=0)
