"""Offline RL through the shared runner (task ``offline_rl``): a tiny D4RL-layout HDF5 written here, a tiny Decision
Transformer, 2 steps, one short rollout per evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from primaldual.cli import main
from primaldual.train.config import ConfigError, load_config

h5py = pytest.importorskip("h5py")
pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")


@pytest.fixture(scope="module")
def hopper_dir(tmp_path_factory):
    """200 transitions of Hopper's sizes (11 / 3) in 4 trajectories, and a metadata.json with a behaviour score."""
    root = tmp_path_factory.mktemp("hopper-medium")
    rng = np.random.default_rng(0)
    n = 200
    terminals = np.zeros(n, bool)
    timeouts = np.zeros(n, bool)
    terminals[[39, 99]] = True
    timeouts[[149, 199]] = True
    with h5py.File(root / "hopper-medium.hdf5", "w") as f:
        f["observations"] = rng.normal(size=(n, 11)).astype(np.float32)
        f["actions"] = rng.uniform(-1, 1, size=(n, 3)).astype(np.float32)
        f["rewards"] = rng.uniform(0, 1, size=n).astype(np.float32)
        f["terminals"] = terminals
        f["timeouts"] = timeouts
    meta = {"label": "test data", "behaviour_policy": {"medium": {"normalized_score_mean": 6.5, "episodes": 10}}}
    (root / "metadata.json").write_text(json.dumps(meta))
    return root


def _config(tmp_path, root, attention="softmax", **changes) -> str:
    cfg = {
        "defaults": ["rl/hopper-medium/dt"],
        "name": "tiny",
        "data": {"root": str(root), "max_len": 4, "batch_size": 4},
        "model": {"dim": 16, "num_heads": 1, "ffn_dim": 32, "depth": 2, "attention": attention},
        "schedule": {"warmup_steps": 1},
        "trainer": {"max_steps": 2, "val_check_interval": 1},
        "rl": {"max_ep_len": 20, "eval_episodes": 1, "target_returns": [3600]},
    }
    for k, v in changes.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _fit(tmp_path, root, run_dir, fresh=False, **kw) -> int:
    argv = ["fit", "--threads", "1", "--config", _config(tmp_path, root, **kw), "--run-dir", str(run_dir)]
    return main(argv + (["--fresh"] if fresh else []))


def test_fit_writes_summary_with_scores_and_behaviour(tmp_path, hopper_dir):
    run = tmp_path / "run"
    assert _fit(tmp_path, hopper_dir, run) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["task"] == "offline_rl" and s["protocol"] == "heldout" and s["steps"] == 2 and s["evaluations"] == 2
    assert s["reported_checkpoint"].startswith("final")
    assert np.isfinite(s["normalized_score_mean"]) and s["normalized_score_std"] >= 0
    assert "target3600/return_mean" in s["final"]
    assert s["behaviour_policy"]["normalized_score_mean"] == 6.5
    assert len(s["state_mean"]) == 11 and len(s["state_std"]) == 11
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 2 and state["state_mean"].shape == (11,)
    assert len(state["last_scores"]["target3600"]) == 1
    assert (run / "history.csv").read_text().count("\n") == 3  # header + 2 evaluations
    assert not (run / "checkpoints" / "best.ckpt").exists() or s["best_step"] == 2  # nothing selected: the last
    assert main(["test", "--run-dir", str(run), "--ckpt", "last"]) == 0  # the rollouts of a checkpoint, again


def test_resume_continues_from_last_checkpoint(tmp_path, hopper_dir):
    run = tmp_path / "run"
    assert _fit(tmp_path, hopper_dir, run, trainer={"max_steps": 1}) == 0
    # the same run carried on to 2 steps must equal a 2-step run from scratch (config differs: a new directory)
    cfg_path = run / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["trainer"]["max_steps"] = 2
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # as if the run had been started with 2 steps
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 1
    assert main(["fit", "--threads", "1", "--config", str(cfg_path), "--run-dir", str(run)]) == 0
    resumed = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    fresh = tmp_path / "fresh"
    assert _fit(tmp_path, hopper_dir, fresh) == 0
    straight = torch.load(fresh / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 2 and (run / "history.csv").read_text().count("\n") == 3
    for k, v in straight["state_dict"].items():  # dropout 0.1: the per-step reseeding continues the same masks
        torch.testing.assert_close(resumed["state_dict"][k], v, rtol=0, atol=0)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (run, fresh))
    assert a["final"] == b["final"]


def test_primal_plus_trains_with_the_ksvd_term(tmp_path, hopper_dir):
    run = tmp_path / "run"
    opts = [None, {"s": 4, "eta": 0.05, "ksvd_reduction": "sample"}]
    rc = _fit(tmp_path, hopper_dir, run, model={"attention": ["softmax", "primal"], "attention_options": opts})
    assert rc == 0
    assert json.loads((run / "summary.json").read_text())["attention"] == ["softmax", "primal"]


def test_bundled_configs_compose():
    for name, attn in (("dt", "softmax"), ("primal_plus", ["softmax", "softmax", "primal"])):
        cfg = load_config(f"rl/hopper-medium/{name}")
        assert cfg.task == "offline_rl" and cfg.model.kind == "dt" and cfg.model.attention == attn
        assert cfg.data.max_len == 20 and cfg.data.batch_size == 64 and cfg.trainer.gradient_clip_val == 0.25
    assert load_config("rl/hopper-medium/primal_plus").model.attention_options[-1]["s"] == 96


def _one_error_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("primaldual fit: error: "), err
    return lines[0]


def test_missing_data_is_one_line_naming_the_generate_command(capsys, tmp_path):
    cfg = _config(tmp_path, tmp_path / "nowhere")
    line = _one_error_line(capsys, ["fit", "--config", cfg, "--run-dir", str(tmp_path / "run")])
    assert "primaldual data generate d4rl" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, key",
    [
        (["--rl.eval_episodes", "0"], "rl.eval_episodes"),
        (["--rl.target_returns", "abc"], "rl.target_returns"),
        (["--data.max_len", "null"], "data.max_len"),
        (["--model.kind", "lm"], "model.kind"),
        (["--data.name", "pong-medium"], "data.name"),
    ],
)
def test_bad_inputs_are_one_error_line(capsys, tmp_path, hopper_dir, override, key):
    argv = ["fit", "--config", _config(tmp_path, hopper_dir), "--run-dir", str(tmp_path / "run"), *override]
    assert key in _one_error_line(capsys, argv)
    assert not (tmp_path / "run").exists()


def _bad_data(root, case: str) -> None:
    """A Hopper-sized D4RL file (or its metadata.json) broken in one way."""
    rows = {"one_row": 1}.get(case, 40)
    root.mkdir(parents=True)
    with h5py.File(root / "hopper-medium.hdf5", "w") as f:
        if case == "huge":  # declares 1e11 rows: a few KiB on disk (chunks of the fill value), 8 TiB to read
            f.create_dataset("observations", shape=(10**11, 11), dtype="f4", chunks=(1024, 11))
        else:
            f["observations"] = np.zeros((rows, 11), np.float32)
        f["actions"] = np.zeros((rows, 3), np.float32)
        f["rewards"] = np.zeros(rows, np.float32)
        f["terminals"] = np.zeros(rows, bool)
        f["timeouts"] = np.eye(1, rows, rows - 1, dtype=bool)[0]
    if case in ("metadata_not_json", "metadata_list"):
        (root / "metadata.json").write_text("{nope" if case == "metadata_not_json" else "[1, 2]")


@pytest.mark.parametrize(
    "case, expected",
    [
        ("huge", "'observations' declares shape (100000000000, 11)"),
        ("one_row", "data.batch_size: "),
        ("metadata_not_json", "metadata.json: not a readable JSON file"),
        ("metadata_list", "metadata.json: expected a JSON object, got a JSON list"),
    ],
)
def test_bad_data_files_are_one_error_line(capsys, tmp_path, case, expected):
    """Issue 46, item 13: each was a MemoryError, an IndexError, a raw parser error or an AttributeError."""
    _bad_data(tmp_path / case, case)
    argv = ["fit", "--config", _config(tmp_path, tmp_path / case), "--run-dir", str(tmp_path / "run")]
    assert expected in _one_error_line(capsys, argv)


@pytest.mark.parametrize("case", ["missing_key", "wrong_shape"])
def test_a_checkpoint_of_another_model_is_one_error_line_and_kept(capsys, tmp_path, hopper_dir, case):
    import torch

    run = tmp_path / "run"
    assert _fit(tmp_path, hopper_dir, run, trainer={"max_steps": 1}) == 0
    ck = run / "checkpoints" / "last.ckpt"
    state = torch.load(ck, weights_only=True)
    if case == "missing_key":
        del state["state_dict"][next(iter(state["state_dict"]))]
    else:
        state["state_dict"][next(iter(state["state_dict"]))] = torch.zeros(3, 3)
    torch.save(state, ck)
    (run / "summary.json").unlink()
    (run / "checkpoints" / "last.prev.ckpt").unlink(missing_ok=True)
    before = ck.read_bytes()
    capsys.readouterr()
    line = _one_error_line(
        capsys, ["fit", "--config", _config(tmp_path, hopper_dir, trainer={"max_steps": 1}), "--run-dir", str(run)]
    )
    assert "last.ckpt" in line and "--fresh" in line, line
    assert ck.read_bytes() == before


def test_rl_section_leaves_other_configs_alone():
    from primaldual.train.config import RunConfig, dump_config

    assert "rl:" not in dump_config(RunConfig())
    with pytest.raises(ConfigError, match="model.kind"):
        load_config(None, ["--task", "offline_rl", "--data.max_len", "20", "--model.kind", "timeseries"])


def test_seeds_table_reports_final_scores_beside_the_behaviour_policy():
    from primaldual.train.seeds import format_table

    b = {"normalized_score_mean": 6.5}
    runs = [
        {
            "task": "offline_rl",
            "dataset": "hopper-medium",
            "name": "dt",
            "protocol": "heldout",
            "seed": k,
            "normalized_score_mean": v,
            "behaviour_policy": b,
        }
        for k, v in enumerate((6.0, 7.0))
    ]
    table = format_table(runs)
    assert "final checkpoint" in table and "6.50 +- 0.71 (n=2)" in table
    assert "behaviour policy normalised score 6.50" in table


def _copy_data(src, dst, name: str):
    dst.mkdir(parents=True, exist_ok=True)
    (dst / f"{name}.hdf5").write_bytes((src / "hopper-medium.hdf5").read_bytes())


def test_data_name_chooses_the_file_and_data_root_may_be_the_file(capsys, tmp_path, hopper_dir):
    from primaldual.tasks.offline_rl.data import data_file

    both = tmp_path / "both"
    _copy_data(hopper_dir, both, "hopper-expert")  # alphabetically first: once trained on instead of the named one
    _copy_data(hopper_dir, both, "hopper-medium")
    cfg = load_config(_config(tmp_path, both))
    assert data_file(cfg).name == "hopper-medium.hdf5"
    expert = load_config(_config(tmp_path, both), ["--data.name", "hopper-expert"])
    assert data_file(expert).name == "hopper-expert.hdf5"
    with pytest.raises(Exception, match=r"expected hopper-random.hdf5 \(it holds hopper-expert.hdf5, hopper-medium"):
        data_file(load_config(_config(tmp_path, both), ["--data.name", "hopper-random"]))
    the_file = load_config(_config(tmp_path, both / "hopper-medium.hdf5"))
    assert data_file(the_file) == both / "hopper-medium.hdf5"
    assert _fit(tmp_path, both / "hopper-medium.hdf5", tmp_path / "run") == 0  # data.root the file itself
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["data_file"].endswith("both/hopper-medium.hdf5")


def test_unreadable_checkpoints_stop_the_run_and_are_kept(capsys, tmp_path, hopper_dir):
    run = tmp_path / "run"
    assert _fit(tmp_path, hopper_dir, run, trainer={"max_steps": 1}) == 0
    ck = run / "checkpoints"
    (ck / "last.ckpt").write_bytes(b"not a checkpoint")
    (ck / "last.prev.ckpt").write_bytes(b"nor this")
    capsys.readouterr()
    assert _fit(tmp_path, hopper_dir, run, trainer={"max_steps": 1}) == 2
    err = capsys.readouterr().err
    assert "--fresh" in err and len(err.strip().splitlines()) == 1
    assert (ck / "last.ckpt").read_bytes() == b"not a checkpoint" and (
        ck / "last.prev.ckpt"
    ).read_bytes() == b"nor this"
    # a good previous checkpoint: resumed from, the bad one kept as last.ckpt.corrupt
    assert _fit(tmp_path, hopper_dir, run, trainer={"max_steps": 1}, fresh=True) == 0


def test_a_width_mismatch_is_caught_before_training(capsys, tmp_path):
    root = tmp_path / "wide"
    root.mkdir()
    n = 40
    with h5py.File(root / "hopper-medium.hdf5", "w") as f:
        f["observations"] = np.zeros((n, 17), np.float32)  # HalfCheetah's width, not Hopper's 11
        f["actions"] = np.zeros((n, 3), np.float32)
        f["rewards"] = np.zeros(n, np.float32)
        f["terminals"] = np.zeros(n, bool)
        f["timeouts"] = np.eye(1, n, n - 1, dtype=bool)[0]
    assert _fit(tmp_path, root, tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert "observations of width 17" in err and "Hopper-v4 has 11 and 3" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "trainer",
    [{"precision": "bf16-mixed"}, {"compile": True}],
    ids=["bf16-mixed", "compiled"],
)
def test_faster_variants_train_primal_plus_and_match_the_plain_loss_at_the_start(tmp_path, hopper_dir, trainer):
    """trainer.compile / bf16-mixed train the same model: the first logged loss is the float32 one (bf16: within
    bfloat16's precision); the primal layer's KSVD term is in the loss under autocast too."""
    opts = [None, {"s": 4, "eta": 0.05, "ksvd_reduction": "sample"}]
    model = {"attention": ["softmax", "primal"], "attention_options": opts, "dropout": 0.0}
    one = {"max_steps": 1, "val_check_interval": 1}
    assert _fit(tmp_path, hopper_dir, tmp_path / "plain", model=model, trainer=one) == 0
    assert _fit(tmp_path, hopper_dir, tmp_path / "fast", model=model, trainer={**one, **trainer}) == 0
    rows = [(tmp_path / r / "history.csv").read_text().splitlines() for r in ("plain", "fast")]
    head = rows[0][0].split(",")
    first = [float(r[1].split(",")[head.index("train/loss_step")]) for r in rows]
    tol = 2e-2 if "precision" in trainer else 1e-4
    assert first[1] == pytest.approx(first[0], rel=tol)


def test_accumulation_and_bf16_options_are_the_runner_s(tmp_path, hopper_dir):
    """What the shared runner implements applies to offline RL too (the old loop refused accumulation)."""
    cfg = load_config("rl/hopper-medium/dt", ["--trainer.accumulate_grad_batches", "2"])
    assert cfg.trainer.accumulate_grad_batches == 2
    run = tmp_path / "acc"
    assert _fit(tmp_path, hopper_dir, run, trainer={"max_steps": 2, "accumulate_grad_batches": 2}) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_validate_reruns_the_rollouts_of_a_checkpoint(tmp_path, hopper_dir, capsys):
    run = tmp_path / "run"
    assert _fit(tmp_path, hopper_dir, run, trainer={"max_steps": 1}) == 0
    s = json.loads((run / "summary.json").read_text())
    capsys.readouterr()
    assert main(["validate", "--run-dir", str(run), "--ckpt", "last"]) == 0
    out = capsys.readouterr().out
    assert f"{s['final']['target3600/normalized_score_mean']:.4g}"[:4] in out


def test_analyze_and_bench_steps_say_why_they_do_not_apply(tmp_path, hopper_dir):
    from primaldual.bench.steps import build_case

    with pytest.raises(ValueError, match="no split of examples"):
        build_case("rl/hopper-medium/dt", ["--data.root", str(hopper_dir)])


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(tmp_path, hopper_dir):
    """2-process gloo DDP through the shared runner: each rank takes half of every global batch and half of the
    rollouts; without dropout the weights and scores equal a 1-process run with the whole batch."""
    import csv
    import io

    from tests.train.helpers import fit_cmd, run

    no_drop = {"model": {"dropout": 0.0}, "rl": {"max_ep_len": 20, "eval_episodes": 2, "target_returns": [3600]}}
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    cfg = _config(tmp_path, hopper_dir, **no_drop)
    assert main(["fit", "--threads", "1", "--config", cfg, "--run-dir", str(single), "--data.batch_size", "8"]) == 0
    ddp_flags = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu"]
    run(fit_cmd(cfg, ddp, "--threads", "1", "--data.batch_size", "4", *ddp_flags), timeout=400)
    a = torch.load(single / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(ddp / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 2
    for k in a["state_dict"]:
        torch.testing.assert_close(b["state_dict"][k], a["state_dict"][k], rtol=1e-3, atol=1e-5, msg=k)
    assert len(b["last_scores"]["target3600"]) == 2  # both episodes, gathered from the two ranks
    s, d = (json.loads((r / "summary.json").read_text()) for r in (single, ddp))
    assert d["normalized_score_mean"] == pytest.approx(s["normalized_score_mean"], rel=1e-3)
    rows = [list(csv.DictReader(io.StringIO((r / "history.csv").read_text()))) for r in (single, ddp)]
    assert [r["step"] for r in rows[1]] == [r["step"] for r in rows[0]] == ["1", "2"]


def test_a_corrupt_last_checkpoint_resumes_from_the_previous_one(tmp_path, hopper_dir, capsys):
    run = tmp_path / "run"
    assert _fit(tmp_path, hopper_dir, run) == 0  # evaluations at steps 1 and 2: last.prev.ckpt holds step 1
    ck = run / "checkpoints"
    assert torch.load(ck / "last.prev.ckpt", weights_only=True)["global_step"] == 1
    (ck / "last.ckpt").write_bytes(b"cut off by a crash")
    capsys.readouterr()
    assert _fit(tmp_path, hopper_dir, run) == 0  # the same config: steps 2 again, from step 1
    assert (ck / "last.ckpt.corrupt").read_bytes() == b"cut off by a crash"
    assert "last.prev.ckpt" in capsys.readouterr().out
    fresh = tmp_path / "fresh"
    assert _fit(tmp_path, hopper_dir, fresh) == 0
    a, b = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for d in (run, fresh))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
