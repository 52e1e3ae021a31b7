"""``primaldual convert`` on classifier runs: a tiny softmax UEA teacher (real JapaneseVowels) and a tiny ViT teacher
(an image folder) turned Primal.+ / PrimalFormer in a run directory (stage 1, then stage 2 by fit), its record, a
second call, and the conversion config's errors."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import yaml

from primaldual.cli import main
from primaldual.tasks.conversion import load_convert_config
from primaldual.tasks.convert_classifier import ClassifierConvertConfig
from primaldual.tasks.convert_configs import convert_config_names
from primaldual.train.checkpoints import load_checkpoint
from primaldual.train.rundir import run_config
from primaldual.utils.errors import ConfigError
from tests.conftest import write_config
from tests.train.helpers import fit_cmd, one_line_error, run_here, tiny_vision, write_image_folder


@pytest.fixture(scope="module")
def uea_teacher(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uea_teacher")
    run_here(fit_cmd(write_config(tmp, **{"trainer.max_epochs": 2}), tmp / "run", "--threads", "1"))
    return tmp / "run"


def _convert(teacher, run_dir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "primaldual.cli", "convert", str(teacher), "--run-dir", str(run_dir), *extra]


TINY_BUDGET = [
    "--options",
    '{"s": 4, "eta": 0.1, "n": 4}',  # n: 4 calibration series x p = 8 >= 8 n
    "--calibration_batches",
    "2",
    "--stage1.steps",
    "4",
    "--stage2.trainer.max_epochs",
    "1",
]


def test_a_uea_run_converts_to_primal_plus_in_a_run_directory_that_a_second_call_reports(tmp_path, uea_teacher):
    run_dir = tmp_path / "conv"
    out = run_here(_convert(uea_teacher, run_dir, *TINY_BUDGET, "--threads", "1")).stdout
    assert "stage 1 step 4/4" in out and "converted: test accuracy" in out
    assert (run_dir / "convert.yaml").is_file() and (run_dir / "convert" / "stage1.pt").is_file()
    assert not (run_dir / "convert" / "stage1.partial.pt").exists()
    cfg = run_config(run_dir)  # the converted model's config: test, validate and analyze read it
    assert cfg.model.attention == ["softmax", "primal"]
    assert cfg.model.attention_options == [None, {"s": 4, "eta": 0.1, "n": 4}]
    assert cfg.trainer.max_epochs == 1 and cfg.name == "tiny-primal_plus"
    summary = json.loads((run_dir / "summary.json").read_text())
    conv = summary["convert"]
    assert conv["config"] == "uea/JapaneseVowels/convert/primal_plus"  # the dataset's shipped default
    teacher_acc = json.loads((uea_teacher / "summary.json").read_text())["test_acc"]
    assert conv["teacher"]["test_acc"] == teacher_acc
    assert conv["test_acc_change"] == pytest.approx(summary["test_acc"] - teacher_acc)
    assert conv["stage1"]["steps"] == 4 and conv["stage1"]["last"]["step"] == 4
    assert abs(conv["stage1"]["init_figures"]["1"]["J"]) < 1e-5
    stage1 = json.loads((run_dir / "convert" / "stage1.json").read_text())
    assert stage1["layers"] == [1] and stage1["init"] == "teacher"
    # stage 2 started from stage 1's weights: the teacher's first block is unchanged in stage1.pt
    s1 = load_checkpoint(run_dir / "convert" / "stage1.pt", weights_key=None)
    t = load_checkpoint(uea_teacher / "checkpoints" / "best.ckpt")["state_dict"]
    key = "encoder.blocks.0.attn.qkv.weight"
    torch.testing.assert_close(s1[key], t[f"model.{key}"])
    # a second call reports the finished run; another conversion in its directory is refused
    again = run_here(_convert(uea_teacher, run_dir, *TINY_BUDGET, "--threads", "1")).stdout
    assert "stage 1" not in again
    assert main(["convert", str(uea_teacher), "--run-dir", str(run_dir), *TINY_BUDGET, "--stage1.steps", "5"]) == 2


def test_classifier_conversion_errors_are_one_line_and_write_nothing(capsys, tmp_path, uea_teacher):
    base = ["convert", str(uea_teacher), "--run-dir", str(tmp_path / "x"), "--options", '{"s": 4}']
    assert "student 'hybrid' is causal only" in one_line_error(capsys, [*base, "--student", "hybrid"])
    assert "--stage1.tokens: not a key of the conversion config" in one_line_error(
        capsys, [*base, "--stage1.tokens", "5"]
    )
    assert "stage1.steps must be" in one_line_error(capsys, [*base, "--stage1.steps", "-1"])
    assert "stage2: model.attention is set by the conversion" in one_line_error(
        capsys, [*base, "--stage2.model.attention", "linear"]
    )
    assert "stage2:" in one_line_error(capsys, [*base, "--stage2.trainer.max_epochs", "'ten'"])
    assert "stage2: expected a mapping" in one_line_error(capsys, [*base, "--stage2", "5"])
    assert "layers:" in one_line_error(capsys, [*base, "--layers", "[true]"])
    assert "would change the teacher's model" in one_line_error(capsys, [*base, "--stage2.model.ffn_dim", "64"])
    assert "s=12 exceeds the teacher's head width 8" in one_line_error(capsys, [*base, "--options", '{"s": 12}'])
    assert "options: causal is the teacher's" in one_line_error(
        capsys, [*base, "--options", '{"s": 4, "causal": true}']
    )
    assert "layers: " in one_line_error(capsys, [*base, "--layers", "[5]"])
    # a student option the layer does not know is named as the student's, not as stage 2's
    assert not one_line_error(capsys, [*base, "--options", '{"s": 4, "foo": 1}']).startswith(
        "primaldual convert: error: stage2"
    )
    # a batch larger than the training split: stage 1 would never get a whole batch (it spun forever)
    assert "data.batch_size: 512 exceeds the" in one_line_error(capsys, [*base, "--stage2.data.batch_size", "512"])
    assert "of the 'lm' family; this teacher takes uea/<dataset>/convert/<name>" in one_line_error(
        capsys, [*base, "-c", "lm/english/convert/primal_plus"]
    )
    assert not (tmp_path / "x").exists()  # nothing written for a bad config


@pytest.fixture(scope="module")
def vision_teacher(tmp_path_factory):
    """A tiny softmax ViT run on an image folder (its training step crops, flips and mixes: DeiT's batch
    augmentation)."""
    pytest.importorskip("PIL.Image")
    tmp = tmp_path_factory.mktemp("vision_teacher")
    folder = write_image_folder(tmp / "img", {"train": 6, "val": 2}, {"a": (200, 0, 0), "b": (0, 0, 200)})
    cfg = tiny_vision(folder, **{"trainer.max_steps": 2, "data.val_fraction": 0.25})
    (tmp / "vit.yaml").write_text(yaml.safe_dump(cfg))
    run_here(fit_cmd(tmp / "vit.yaml", tmp / "teacher", "--threads", "1"))
    return tmp / "teacher"


def test_a_teacher_whose_dataset_has_no_shipped_conversion_names_the_ones_there_are(capsys, tmp_path, vision_teacher):
    err = one_line_error(capsys, ["convert", str(vision_teacher), "--run-dir", str(tmp_path / "x")])
    assert "none shipped for vision/toy" in err and "vision/fashion_mnist/convert/primal_plus" in err
    # a YAML file converts it: every layer, data-dependent students, a step-based stage 2
    conv = tmp_path / "all.yaml"
    conv.write_text(
        yaml.safe_dump(
            {
                "layers": "all",
                "options": {"s": 4, "n": 4},  # 4 calibration images x p = 8 >= 8 n
                "calibration_batches": 1,
                "stage1": {"steps": 2},
                "stage2": {"trainer": {"max_steps": 2}, "schedule": {"total_steps": None}},
            }
        )
    )
    run_here(_convert(vision_teacher, tmp_path / "conv", "-c", str(conv), "--threads", "1"))
    cfg = run_config(tmp_path / "conv")
    assert cfg.model.attention == ["primal", "primal"] and cfg.trainer.max_steps == 2
    assert cfg.model.attention_options[0] == {"s": 4, "n": 4}
    figures = json.loads((tmp_path / "conv" / "convert" / "stage1.json").read_text())["init_figures"]
    assert set(figures) == {"0", "1"} and all("weights_residual" in f for f in figures.values())


def test_shipped_classifier_conversion_configs_load():
    names = [n for n in convert_config_names() if not n.startswith("lm/")]
    assert {"uea/JapaneseVowels/convert/primal_plus", "vision/fashion_mnist/convert/primal_plus"} <= set(names)
    for name in names:
        conv = load_convert_config(name, [], ClassifierConvertConfig)
        assert conv.student == "primal" and conv.stage2, name
    with pytest.raises(ConfigError, match=r"^--stage2s: not a key of the conversion config"):
        load_convert_config(names[0], [("stage2s", 1)], ClassifierConvertConfig)


def test_a_classifiers_stage_1_killed_mid_way_continues_to_the_uninterrupted_result(
    tmp_path, vision_teacher, monkeypatch
):
    """The stage-1 stream of a vision run draws its augmentation from the seeded generator, so a conversion stopped
    after update 3 of 6 continues from ``stage1.partial.pt`` on the same batches to the same ``stage1.pt``."""
    import primaldual.convert as conv_pkg
    from primaldual.tasks.convert_classifier import convert_classifier_run
    from tests.train.helpers import Stage1Killed, stage1_stopper

    conv = tmp_path / "last.yaml"
    conv.write_text(yaml.safe_dump({"options": {"s": 4, "n": 4}, "calibration_batches": 1,
                                    "stage1": {"steps": 6}, "stage2": {"trainer": {"max_steps": 1}}}))  # fmt: skip
    convert_classifier_run(vision_teacher, str(conv), run_dir=tmp_path / "straight", verbose=False)
    starts: list[int] = []
    stopping, recording = stage1_stopper(conv_pkg.attention_transfer, 3, starts)
    monkeypatch.setattr(conv_pkg, "attention_transfer", stopping)
    killed = tmp_path / "killed"
    with pytest.raises(Stage1Killed):
        convert_classifier_run(vision_teacher, str(conv), run_dir=killed, verbose=False)
    assert torch.load(killed / "convert" / "stage1.partial.pt", weights_only=True)["step"] == 3
    monkeypatch.setattr(conv_pkg, "attention_transfer", recording)
    convert_classifier_run(vision_teacher, str(conv), run_dir=killed, verbose=False)
    assert starts == [3]  # continued, not restarted
    a = torch.load(tmp_path / "straight" / "convert" / "stage1.pt", weights_only=True)
    b = torch.load(killed / "convert" / "stage1.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("stage1.csv", "stage1.json"):
        assert (killed / "convert" / name).read_text() == (tmp_path / "straight" / "convert" / name).read_text()
