"""LRA tasks through ``primaldual fit``: step-based training, the LRA protocol, resume mid-epoch, data errors."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

from primaldual.data.cache import MissingDataError
from primaldual.tasks.lra.task import build_lra_splits
from primaldual.train.config import ConfigError, list_configs, load_config
from primaldual.train.module import lr_factor

from .helpers import env, fit_cmd, history_rows, kill_after_rows, run_here


@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory):
    from primaldual.recipes.listops import ListOpsConfig, write_listops

    out = tmp_path_factory.mktemp("data") / "listops"
    rules = ListOpsConfig(min_length=10, max_length=60, max_depth=4)
    write_listops(out, {"train": 300, "val": 60, "test": 60}, seed=0, config=rules)
    return out


def _config(tiny_config, root, **changes):
    base = {
        "name": "tiny_lra",
        "task": "lra_listops",
        "seed": 1,
        "data": {"name": "listops", "root": str(root), "max_len": 64, "batch_size": 16, "eval_batch_size": 64},
        "model": {
            "dim": 16,
            "depth": 2,
            "num_heads": 2,
            "ffn_dim": 32,
            "dropout": 0.1,
            "attention": ["softmax", "primal"],
            "attention_options": [None, {"s": 4, "eta": 0.1, "rank_multi": 2, "max_len": 64}],
        },
        "optim": {"name": "adamw", "lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-6},
        "schedule": {"warmup_steps": 5, "decay": "linear"},
        "trainer": {"max_steps": 40, "val_check_interval": 8, "accelerator": "cpu", "enable_progress_bar": False},
    }
    return tiny_config(base=base, **changes)


def test_every_lra_config_loads_with_the_lra_protocol():
    names = list_configs("lra/")
    assert len(names) == 80  # 5 tasks x 8 models, reference and reduced
    for name in names:
        cfg = load_config(name)
        assert cfg.step_based and cfg.protocol == "heldout" and cfg.trainer.val_check_interval
        assert cfg.model.resolved_kind(cfg.task) == ("retrieval" if cfg.task == "lra_retrieval" else "sequence")
        assert cfg.schedule.decay == "linear" and cfg.schedule.total_steps == cfg.trainer.max_steps


def test_fit_listops_step_based(tmp_path, tiny_config, listops_dir):
    run_dir = tmp_path / "run"
    out = run_here(fit_cmd(_config(tiny_config, listops_dir), run_dir, "--threads", "1")).stdout
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["steps"] == 40 and s["evaluations"] == 5 and s["best_step"] in (8, 16, 24, 32, 40)
    assert s["data"]["tokenisation"] == "brackets" and s["data"]["source"] == "generated"
    assert 0 < s["majority_class_test_acc"] < 1 and 0 <= s["test_acc"] <= 1
    assert "step 8/40" in out and "majority class" in out
    assert [int(r["step"]) for r in history_rows(run_dir)] == [8, 16, 24, 32, 40]


def test_lra_resume_mid_epoch_matches_uninterrupted(tmp_path, tiny_config, listops_dir):
    # 300 / 16 = 19 batches per epoch, evaluation + checkpoint every 8 steps: checkpoints land mid-epoch.
    cfg = _config(tiny_config, listops_dir)
    ref_dir, dir_ = tmp_path / "uninterrupted", tmp_path / "killed"
    run_here(fit_cmd(cfg, ref_dir, "--threads", "1"))
    assert 2 <= kill_after_rows(fit_cmd(cfg, dir_, "--threads", "1"), dir_, 2) < 5
    assert not (dir_ / "summary.json").exists()
    assert "resuming from" in run_here(fit_cmd(cfg, dir_, "--threads", "1")).stdout
    ref, got = json.loads((ref_dir / "summary.json").read_text()), json.loads((dir_ / "summary.json").read_text())
    for key in ("steps", "best_step", "test_acc", "test_loss", "val_acc"):
        assert got[key] == ref[key], key
    assert history_rows(dir_) == history_rows(ref_dir)
    a = torch.load(ref_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(dir_ / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_missing_lra_data_names_the_fix_and_the_stand_in(tmp_path):
    cfg = load_config("lra/text/reduced/primalformer", ["--data.root", str(tmp_path / "nowhere")])
    with pytest.raises(MissingDataError, match=r"--data.name shakespeare_genre"):
        build_lra_splits(cfg.data, cfg.task)
    cfg = load_config("lra/retrieval/primalformer")
    with pytest.raises(MissingDataError, match="data.root"):
        build_lra_splits(cfg.data, cfg.task)
    cfg = load_config("lra/listops/primalformer", ["--data.root", str(tmp_path)])
    with pytest.raises(MissingDataError, match="primaldual data generate listops"):
        build_lra_splits(cfg.data, cfg.task)


def test_cli_reports_missing_data_in_one_line(tmp_path, tiny_config):
    res = subprocess.run(
        fit_cmd(_config(tiny_config, tmp_path / "empty"), tmp_path / "run"), capture_output=True, text=True, env=env()
    )
    assert res.returncode == 2 and "error:" in res.stderr and "Traceback" not in res.stderr


def test_bad_lra_configs_name_the_key(tmp_path, tiny_config, listops_dir):
    with pytest.raises(ConfigError, match="data.name"):
        build_lra_splits(load_config("lra/listops/transformer", ["--data.name", "imdb"]).data, "lra_listops")
    with pytest.raises(ConfigError, match="protocol"):
        load_config("lra/listops/transformer", ["--protocol", "paper"])
    with pytest.raises(ConfigError, match="schedule.decay"):
        load_config("lra/listops/transformer", ["--schedule.decay", "step"])
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        load_config("lra/listops/transformer", ["--trainer.max_steps", "-1"])
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config("lra/listops/transformer", ["--trainer.select", "best_val"])
    res = subprocess.run(
        fit_cmd(_config(tiny_config, listops_dir, **{"model.num_classes": 3}), tmp_path / "run"),
        capture_output=True,
        text=True,
        env=env(),
    )
    assert res.returncode == 2 and "model.num_classes" in res.stderr


def test_lr_factor_warmup_then_linear_or_cosine_decay():
    f = [lr_factor(s, warmup=4, decay="linear", total=12) for s in range(13)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0] and f[8] == pytest.approx(0.5) and f[12] == 0.0
    assert lr_factor(8, warmup=4, decay="cosine", total=12) == pytest.approx(0.5)
    assert lr_factor(100, warmup=0, decay="constant", total=0) == 1.0


def test_real_format_text_and_retrieval_files(tmp_path):
    """IMDb TSV (label<TAB>text) and AAN pair files in the LRA release layout, through the LRA data module."""
    rng = np.random.default_rng(0)
    imdb = tmp_path / "imdb"
    imdb.mkdir()
    for split, n in (("train", 40), ("test", 10)):
        lines = [
            f"{i % 2}\treview {i} {'great' if i % 2 else 'awful'} " + "x" * int(rng.integers(5, 50)) for i in range(n)
        ]
        (imdb / f"{split}.tsv").write_text("label\ttext\n" + "\n".join(lines) + "\n")
    cfg = load_config("lra/text/transformer", ["--data.root", str(imdb), "--data.max_len", "64"])
    splits = build_lra_splits(cfg.data, cfg.task)
    assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == (32, 8, 10)
    tokens, mask, y = splits["test"][1]
    text = (imdb / "test.tsv").read_text().splitlines()[2].split("\t", 1)[1].encode()
    assert tokens.shape == (64,) and int(mask.sum()) == min(len(text), 64)
    assert int(y) == 1 and tokens[0] == ord("r") + 1 and not mask[min(len(text), 64) :].any()

    aan = tmp_path / "tsv_data"
    aan.mkdir()
    for name in ("train", "eval", "test"):
        rows = [f"{i % 2}\tid{i}a\tid{i}b\tpaper {i} text a\tpaper {i} text b" for i in range(6)]
        (aan / f"new_aan_pairs.{name}.tsv").write_text("\n".join(rows) + "\n")
    cfg = load_config("lra/retrieval/transformer", ["--data.root", str(aan), "--data.max_len", "32"])
    splits = build_lra_splits(cfg.data, cfg.task)
    ta, tb, ma, mb, y = splits["val"][3]
    assert ta.shape == tb.shape == (32,) and ma.dtype == torch.bool and int(y) == 1
    assert int(ma.sum()) == len(b"paper 3 text a")
