"""Image classification on the harness (task ``vision``): an image-folder tree written in tmp_path trains and tests
end to end with the whole DeiT augmentation recipe, resumes exactly after a kill, refuses bad configs and data with
clear errors; the vision config family composes."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from primaldual.train.config import ConfigError, list_configs, load_config

from .helpers import fit_cmd, history_rows, kill_after_rows, run_here, tiny_vision, write_image_folder

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """root/{train,val}/<class>/*.png: 3 classes told apart by colour, images of different sizes."""
    colours = {"cat": (200, 40, 40), "dog": (40, 200, 40), "fish": (40, 40, 200)}
    root = write_image_folder(tmp_path_factory.mktemp("images"), {"train": 10, "val": 4}, colours, sizes=(14, 23))
    (root / "train" / "cat" / "notes.txt").write_text("not an image")  # skipped, counted
    return root


def _config(tmp_path, root, **changes) -> str:
    recipe = {"crop_scale": [0.08, 1.0], "hflip": 0.5, "randaugment_ops": 2, "erasing": 0.25, "mixup_alpha": 0.8}
    recipe.update(cutmix_alpha=1.0, label_smoothing=0.1)
    base = {
        "seed": 2,
        "data.crop_pct": 0.8,
        "data.batch_size": 6,
        "data.eval_batch_size": 8,
        "data.val_fraction": 0.2,
        "model.drop_path": 0.1,
        "model.patch_kernel": 6,  # overlapping patches through the harness
        "model.attention": ["softmax", "primal"],
        "model.attention_options": [None, {"s": 4, "eta": 0.05, "max_len": 17}],
        "trainer.val_check_interval": 4,
        "augment": recipe,
    }
    cfg = tiny_vision(root, **{**base, **changes})
    path = tmp_path / "vit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_image_folder_run_trains_and_tests_end_to_end_with_the_deit_recipe(tmp_path, folder):
    out = tmp_path / "run"
    run_here(fit_cmd(_config(tmp_path, folder), out, "--threads", "1"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "vision" and summary["steps"] == 8 and summary["evaluations"] == 2
    assert 0.0 <= summary["test_acc"] <= 1.0
    # held-out validation from train/ (20% of 30, stratified), val/ is the test split
    assert "val/ is the test split" in summary["data"]["splits"]
    rows = history_rows(out)
    assert len(rows) == 2
    # the primal layer's KSVD term is logged, as for every task (it was added to the loss, but never logged)
    assert {"ksvd_J2", "ksvd_rms_J", "ksvd_eta"} <= set(summary) and all(r.get("train/ksvd_J2_step") for r in rows)


def test_a_killed_vision_run_resumes_to_the_same_result(tmp_path, folder):
    # the conv stem's BatchNorm statistics must come back with the checkpoint too
    changes = {
        "trainer.max_steps": 12,
        "trainer.val_check_interval": 3,
        "model.stem": "conv",
        "model.patch_kernel": None,
    }
    cfg = _config(tmp_path, folder, **changes)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_here(fit_cmd(cfg, whole, "--threads", "1"))
    assert 1 <= kill_after_rows(fit_cmd(cfg, killed, "--threads", "1"), killed, 2) < 4
    run_here(fit_cmd(cfg, killed, "--threads", "1"))
    a, b = history_rows(whole), history_rows(killed)
    assert [r["val/loss"] for r in a] == [r["val/loss"] for r in b]  # the same augmentations were drawn
    sa = json.loads((whole / "summary.json").read_text())
    sb = json.loads((killed / "summary.json").read_text())
    assert sa["test_acc"] == sb["test_acc"] and sa["test_loss"] == sb["test_loss"]


def test_a_corrupt_image_is_named(tmp_path, folder):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(folder, root)
    (root / "val" / "dog" / "broken.png").write_bytes(b"\x89PNG not really")
    res = _fit_fails(tmp_path, _config(tmp_path, root))
    assert "broken.png" in res


def test_an_image_folder_without_root_says_how_to_give_it(tmp_path, folder):
    assert "set data.root" in _fit_fails(tmp_path, _config(tmp_path, folder, **{"data.root": None}))


def _fit_fails(tmp_path, cfg: str) -> str:
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "primaldual.cli", "fit", "--config", cfg, "--run-dir", str(tmp_path / "bad")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode != 0
    return res.stdout + res.stderr


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"data.image_size": None}, "data.image_size"),
        ({"model.patch_size": 5}, "model.patch_size"),
        ({"augment.hflip": 1.5}, "hflip"),
        ({"augment.randaugment_ops": "2"}, "randaugment_ops"),
        ({"augment.mixup_alpha": -1}, "mixup_alpha"),
        ({"model.kind": "sequence"}, "model.kind"),
        ({"data.crop_pct": 0}, "data.crop_pct"),
        ({"model.patch_kernel": 7}, "model.patch_kernel: expected model.patch_size"),
        ({"model.patch_kernel": 2}, "model.patch_kernel"),
        ({"model.patch_kernel": "8"}, "model.patch_kernel"),
        ({"model.stem": "Conv"}, "model.stem: expected 'patch' or 'conv'"),
        ({"model.stem": "conv"}, "model.stem: 'conv' needs .* model.patch_kernel null"),
        ({"model.stem": True}, "model.stem"),
    ],
)
def test_bad_vision_configs_are_refused_naming_the_key(tmp_path, folder, changes, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_config(tmp_path, folder, **changes))


def test_the_augment_section_and_vision_keys_belong_to_vision_only():
    with pytest.raises(ConfigError, match="augment"):
        load_config("lra/listops/transformer", ["--augment.hflip", "0.5"])
    for key, value in (
        ("model.patch_size", "4"),
        ("model.drop_path", "0.1"),
        ("data.image_size", "32"),
        ("model.patch_kernel", "24"),
        ("model.stem", "conv"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_config("uea/JapaneseVowels/transformer", [f"--{key}", value])


def test_vision_family_composes_every_model_and_builds_the_reference_architectures():
    from primaldual.models import VisionClassifier

    names = [n for n in list_configs("vision/")]
    models = ("deit", "primal_plus", "attention_bn", "attention_sh", "attention_bn_sh")
    for task in ("imagenet100", "imagenet1k", "fashion_mnist"):
        for m in models:
            assert f"vision/{task}/{m}" in names and f"vision/{task}/reduced/{m}" in names
    cfg = load_config("vision/imagenet100/primal_plus")
    m = cfg.model
    assert (m.dim, m.depth, m.num_heads, m.patch_size, m.drop_path) == (384, 12, 6, 16, 0.1)
    assert m.attention == ["softmax"] * 11 + ["primal"]
    assert m.attention_options[-1]["s"] == 96 and m.attention_options[-1]["eta"] == 0.05
    assert cfg.optim.lr == 0.001 and cfg.augment.mixup_alpha == 0.8 and cfg.augment.randaugment_ops == 2
    sh = load_config("vision/fashion_mnist/reduced/attention_bn_sh").model
    assert sh.attention == "softmax_bn_sh" and sh.attention_options["grid"] == [7, 7]
    with torch.device("meta"):
        model = VisionClassifier(
            224,
            16,
            100,
            dim=m.dim,
            depth=m.depth,
            num_heads=m.num_heads,
            ffn_dim=m.ffn_dim,
            attention=m.attention,
            attention_options=m.attention_options,
        )
    assert 21e6 < sum(p.numel() for p in model.parameters()) < 23e6  # DeiT-S: 22M
