"""The plotting scripts of ``benchmarks/``: the SAC curves and the LM context study, on small files of their inputs."""

from __future__ import annotations

import json

import pytest

from .scripts import load_script

pytest.importorskip("matplotlib")


def _entry(step: int, ret: float, sampled: float) -> dict:
    return {"step": step, "return_mean": ret, "sampled_return_mean": sampled, "train_seconds": step / 50.0}


def test_sac_curves_plot_a_run_in_progress(tmp_path):
    work = tmp_path / "hopper-sac300000-seed0"
    work.mkdir()
    hist = [_entry(10_000, 20.0, 10.0), _entry(20_000, 900.0, 1500.0), _entry(30_000, 1200.0, 1100.0)]
    state = {"env": "hopper", "env_id": "Hopper-v4", "seed": 0, "sac_steps": 300_000, "eval_episodes": 10}
    (work / "state.json").write_text(json.dumps({**state, "history": hist}))
    out = tmp_path / "sac.png"
    assert load_script("sac_curves").main([str(work), "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000


def test_lm_context_plot_reads_runs_and_bench_steps(tmp_path):
    runs = []
    for ctx in (256, 1024):
        for model in ("transformer", "primalformer"):
            d = tmp_path / f"{model}_ctx{ctx}"
            d.mkdir()
            summary = {"name": f"{model}_ctx{ctx}", "tokens_per_sample": ctx, "test_ppl": 150.0 + ctx / 100,
                       "train_step_seconds": 0.01}  # fmt: skip
            (d / "summary.json").write_text(json.dumps(summary))
            (d / "history.csv").write_text("step,val/ppl\n250,300.0\n500,200.0\n")
            runs.append(str(d))
    records = [
        {"name": f"{m}_ctx{c}", "config": f"lm/english/ctx{c}/{m}", "ms_per_step": 12.0}
        for c in (256, 1024)
        for m in ("transformer", "primalformer")
    ]
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps({"records": records}))
    out = tmp_path / "ctx.png"
    assert load_script("lm_context_plot").main([*runs, "--steps", str(steps), "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000


def test_rl_curves_plot_seeds_of_runs(tmp_path):
    """Seeds of one config make one curve (a seed that stopped early adds what it reached); the behaviour score
    comes from a finished run's summary.json."""
    runs = []
    for name in ("dt", "primal_plus"):
        for seed, steps in ((0, (2500, 5000)), (1, (2500,))):
            d = tmp_path / f"{name}-s{seed}"
            d.mkdir()
            (d / "config.yaml").write_text(f"name: {name}\nseed: {seed}\ndata: {{name: hopper-medium}}\n")
            rows = "".join(f"{s},0.1,{40 + s / 1000},{30 + s / 1000}\n" for s in steps)
            head = "step,train/loss,target3600/normalized_score_mean,target1800/normalized_score_mean\n"
            (d / "history.csv").write_text(head + rows)
            if len(steps) == 2:
                (d / "summary.json").write_text(json.dumps({"behaviour_policy": {"normalized_score_mean": 42.8}}))
            runs.append(str(d))
    out = tmp_path / "rl.png"
    assert load_script("rl_curves").main([*runs, "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000
    with pytest.raises(SystemExit, match="no history.csv"):
        load_script("rl_curves").main([str(tmp_path), "--out", str(out)])
