"""``primaldual convert``: a tiny trained softmax LM run converted in a run directory (stage 1, then stage 2 by fit),
its record, resume, the converted model's weights, generation, and the conversion config's errors."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from primaldual.tasks.lm.convert import load_convert_config
from primaldual.train.checkpoints import load_checkpoint
from primaldual.train.rundir import run_config
from primaldual.utils.errors import ConfigError

from .helpers import Stage1Killed, fit_cmd, one_line_error, run_here, stage1_stopper
from .test_lm import _lm_config, english_dir  # noqa: F401  (the tiny corpus fixture)


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, english_dir):  # noqa: F811
    tmp = tmp_path_factory.mktemp("teacher")
    cfg = _lm_config(tmp, english_dir, **{"model.attention": "softmax", "model.attention_options": None})
    run_here(fit_cmd(cfg, tmp / "run", "--threads", "1"))
    return tmp / "run"


def _convert_cmd(teacher, run_dir, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "primaldual.cli",
        "convert",
        str(teacher),
        "--run-dir",
        str(run_dir),
        "--threads",
        "1",
        *extra,
    ]


def _tiny(student: str) -> list[str]:
    opts = {"s": 4, "eta": 0.1} if student == "primal" else {"window": 6, "sinks": 1, "s": 4}
    kl = [] if student == "primal" else ["--stage2.kl", "0.5"]  # the hybrid's stage 2 also distils
    return [
        "-c",
        f"lm/english/convert/{'primal_plus' if student == 'primal' else 'hybrid'}",
        "--calibration_batches",
        "2",
        "--stage1.tokens",
        "640",
        "--stage2.tokens",
        "640",
        "--options",
        json.dumps(opts),
        *kl,
    ]


@pytest.mark.parametrize("student", ["primal", "hybrid"])
def test_convert_writes_a_run_directory_that_resumes_generates_and_loads(tmp_path, teacher_run, student, capsys):
    out = tmp_path / "conv"
    res = run_here(_convert_cmd(teacher_run, out, *_tiny(student)))
    assert "stage 1 step 10/10" in res.stdout and "converted: test ppl" in res.stdout
    for name in (
        "convert.yaml",
        "convert/stage1.pt",
        "convert/stage1.json",
        "convert/stage1.csv",
        "summary.json",
        "checkpoints/best.ckpt",
        "tokenizer.json",
    ):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    conv = summary["convert"]
    assert conv["stage1_tokens"] == 640 and conv["stage2_tokens"] == 640
    assert conv["ppl_ratio_to_teacher"] == pytest.approx(
        summary["test_ppl"] / json.loads((teacher_run / "summary.json").read_text())["test_ppl"]
    )
    first, last = conv["stage1"]["first"], conv["stage1"]["last"]
    assert last["loss"] < first["loss"]
    # the converted model is the one the run's config.yaml builds, with its trained weights
    cfg = run_config(out)
    n = cfg.model.depth
    expect = ["softmax"] * (n - 1) + ["primal"] if student == "primal" else ["hybrid"] * n
    assert cfg.model.attention == expect
    state = load_checkpoint(out / "checkpoints" / "best.ckpt")["state_dict"]
    stage1 = torch.load(out / "convert" / "stage1.pt", weights_only=True)
    key = f"model.decoder.blocks.{n - 1}.attn.w_e"
    assert not torch.equal(state[key], stage1[key.removeprefix("model.")])  # stage 2 trained it further
    from primaldual.tasks.base import get_task

    task = get_task("lm")
    dm = task.datamodule(cfg)
    dm.setup("fit")
    module = task.module(cfg, dm)
    module.load_state_dict(state)  # strict: every trained parameter has its place
    assert torch.equal(module.model.decoder.blocks[n - 1].attn.w_e, state[key])
    if student != "primal":
        return  # the run directory's behaviour below does not depend on the student
    # a second call reports the finished run (no retraining); generate works on it
    again = run_here(_convert_cmd(teacher_run, out, *_tiny(student)))
    assert "stage 1" not in again.stdout and "converted: test ppl" in again.stdout
    gen = run_here(
        [
            sys.executable,
            "-m",
            "primaldual.cli",
            "generate",
            str(out),
            "--prompt",
            "the kernel",
            "--max-new-tokens",
            "5",
            "--temperature",
            "0",
        ]
    )
    assert gen.stdout.startswith("the kernel")
    # another conversion in the same run directory is refused, and nothing there changes
    before = (out / "summary.json").read_text()
    other = [*_tiny(student), "--options", '{"s": 3}']
    msg = one_line_error(capsys, ["convert", str(teacher_run), "--run-dir", str(out), *other])
    assert "holds another conversion" in msg and (out / "summary.json").read_text() == before


def test_stage_two_with_adapters_trains_only_the_converted_layer_and_saves_a_plain_model(tmp_path, teacher_run):
    out = tmp_path / "lora"
    cmd = _convert_cmd(teacher_run, out, *_tiny("primal"), "--stage2.lora", "2")
    res = run_here(cmd)
    assert "converted: test ppl" in res.stdout and "M trained)" in res.stdout  # the frozen teacher is not counted
    cfg = run_config(out)
    n = cfg.model.depth
    teacher = load_checkpoint(teacher_run / "checkpoints" / "best.ckpt")["state_dict"]
    stage1 = torch.load(out / "convert" / "stage1.pt", weights_only=True)
    ckpt = load_checkpoint(out / "checkpoints" / "best.ckpt")
    state = ckpt["state_dict"]
    assert not any("parametrizations" in k or "lora" in k for k in state)  # merged: a plain CausalLM's names
    assert sorted(ckpt["lora"]) == [f"model.decoder.blocks.{n - 1}.attn.{p}" for p in ("proj", "qk")]
    from primaldual.tasks.base import get_task

    task = get_task("lm")
    dm = task.datamodule(cfg)
    dm.setup("fit")
    task.module(cfg, dm).load_state_dict(state)  # strict, into the model config.yaml builds (generate, test, analyze)
    last = f"model.decoder.blocks.{n - 1}.attn."
    for key, value in state.items():
        if key.startswith(last) and key.endswith(("qk.weight", "proj.weight", "w_e")):
            assert not torch.equal(value, stage1[key.removeprefix("model.")]), key  # adapter or new parameter trained
        elif key in teacher and not key.startswith(last):
            assert torch.equal(value, teacher[key]), key  # everything else frozen at the teacher's
    # the finished run started again resumes from its last checkpoint (adapters unfolded) and reports the same
    ppl = json.loads((out / "summary.json").read_text())["test_ppl"]
    again = run_here(cmd)
    assert "stage 1" not in again.stdout and "converted: test ppl" in again.stdout
    assert json.loads((out / "summary.json").read_text())["test_ppl"] == pytest.approx(ppl, rel=1e-6)


def test_window_student_swaps_without_stage_1(tmp_path, teacher_run):
    out = tmp_path / "win"
    res = run_here(
        _convert_cmd(
            teacher_run,
            out,
            "-c",
            "lm/english/convert/window",
            "--stage2.tokens",
            "640",
            "--options",
            '{"window": 6, "sinks": 1}',
        )
    )
    assert "stage 1 step" not in res.stdout
    stage1 = json.loads((out / "convert" / "stage1.json").read_text())
    assert stage1["steps"] == 0 and stage1["init_figures"] == {}


def test_conversion_config_errors_are_one_line(capsys, tmp_path, teacher_run):
    base = ["convert", str(teacher_run), "--run-dir", str(tmp_path / "x")]
    assert "no conversion config 'lm/english/convert/nope'" in one_line_error(
        capsys, [*base, "-c", "lm/english/convert/nope"]
    )
    assert "student: expected one of" in one_line_error(capsys, [*base, "--student", "linear"])
    assert "stage2.tokens must be" in one_line_error(capsys, [*base, "--stage2.tokens", "0"])
    assert "--stage1.epochs: not a key of the conversion config" in one_line_error(
        capsys, [*base, "--stage1.epochs", "3"]
    )
    assert "stage1.lr" in one_line_error(capsys, [*base, "--stage1.lr", "'fast'"])
    assert "stage1.tokens must be 0" in one_line_error(
        capsys, [*base, "-c", "lm/english/convert/window", "--stage1.tokens", "5"]
    )
    assert "no config.yaml" in one_line_error(capsys, ["convert", str(tmp_path), "--run-dir", str(tmp_path / "y")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("student: [unclosed\n")
    assert "not valid YAML" in one_line_error(capsys, [*base, "-c", str(bad)])
    assert not (tmp_path / "x").exists()  # nothing written for a bad config


def test_shipped_conversion_configs_load():
    for name in ("primal_plus", "primalformer", "hybrid", "window"):
        conv = load_convert_config(f"lm/english/convert/{name}")
        assert conv.stage1.tokens + conv.stage2.tokens <= 12_288_000 // 10  # at most 10% of the medium teacher's
        assert conv.data is None  # a primaldual run's own data
        # the keys added later stay out of the record at their defaults: earlier conversions still resume
        assert "data" not in conv.to_dict() and "lora" not in conv.to_dict()["stage2"]
    from primaldual.tasks.lm.convert_hf import HFData

    for name, steps in (("smollm2_primal_plus", (60, 40)), ("smollm2_hybrid", (30, 20))):
        conv = load_convert_config(f"lm/english/convert/{name}")
        data = HFData.build(conv.data)  # the budgets of docs/results.md's SmolLM2 table, in updates
        assert (conv.stage1.tokens, conv.stage2.tokens) == tuple(n * data.batch_size * data.context for n in steps)


def test_an_unknown_override_is_named_as_its_flag():
    """Not as a key of the shipped file: the mistake is on the command line."""
    with pytest.raises(
        ConfigError, match=r"^--stage1\.tokns: not a key of the conversion config; valid: stage1\.tokens"
    ):
        load_convert_config("lm/english/convert/primal_plus", [("stage1.tokns", 5)])
    with pytest.raises(ConfigError, match=r"^--studnet: not a key of the conversion config; valid: student, "):
        load_convert_config("lm/english/convert/primal_plus", [("studnet", "primal")])
    assert load_convert_config("lm/english/convert/primal_plus", [("options.s", 16)]).options["s"] == 16


def test_stage2_kl_to_the_teacher_is_zero_for_an_identical_teacher_and_kept_out_of_the_state():
    import copy

    from primaldual.models import CausalLM
    from primaldual.tasks.lm.training import LanguageModelModule
    from primaldual.train.config import OptimConfig

    torch.manual_seed(0)
    model = CausalLM(40, 16, dim=16, depth=2, num_heads=2, ffn_dim=32, dropout=0.0).double()
    module = LanguageModelModule(model, OptimConfig(name="adamw", lr=1e-3))
    ids = torch.randint(0, 40, (3, 12))
    batch = (ids[:, :-1], ids[:, 1:])
    plain, task, _, _ = module.training_loss(batch, 0)
    module.distill_from(copy.deepcopy(model), 0.5)
    same, _, _, _ = module.training_loss(batch, 0)
    assert float(module.aux_parts["kl"]) == pytest.approx(0.0, abs=1e-12)
    torch.testing.assert_close(same, plain)
    other = CausalLM(40, 16, dim=16, depth=2, num_heads=2, ffn_dim=32, dropout=0.0).double()
    module.distill_from(other, 0.5)
    loss, _, _, _ = module.training_loss(batch, 0)
    kl = float(module.aux_parts["kl"].detach())
    assert kl > 0 and float(loss.detach()) == pytest.approx(float(task.detach()) + 0.5 * kl)
    assert set(module.state_dict()) == {f"model.{k}" for k in model.state_dict()}  # the teacher is not saved
    assert not any(p is q for p in module.parameters() for q in other.parameters())
    with pytest.raises(ValueError, match="kl weight"):
        module.distill_from(other, 0.0)


def test_a_stage_1_killed_mid_way_continues_to_the_uninterrupted_result(tmp_path, teacher_run, monkeypatch):
    """Stage 1 writes ``convert/stage1.partial.pt`` as it goes; a conversion stopped after step 4 of 10 continues from
    it (same batches, Adam state and random state) to the same ``stage1.pt``, history and report as a straight one,
    and the partial file is gone once stage 1 has finished."""
    import primaldual.convert as conv_pkg
    from primaldual.tasks.lm.convert import convert_run

    overrides = [("calibration_batches", 2), ("stage1.tokens", 640), ("stage2.tokens", 640),
                 ("options", {"s": 4, "eta": 0.1})]  # fmt: skip
    args = ("lm/english/convert/primal_plus",)
    convert_run(teacher_run, *args, overrides=overrides, run_dir=tmp_path / "straight", verbose=False)

    starts: list[int] = []
    stopping, recording = stage1_stopper(conv_pkg.attention_transfer, 4, starts)
    monkeypatch.setattr(conv_pkg, "attention_transfer", stopping)
    killed = tmp_path / "killed"
    with pytest.raises(Stage1Killed):
        convert_run(teacher_run, *args, overrides=overrides, run_dir=killed, verbose=False)
    assert torch.load(killed / "convert" / "stage1.partial.pt", weights_only=True)["step"] == 4
    assert not (killed / "convert" / "stage1.pt").exists()
    monkeypatch.setattr(conv_pkg, "attention_transfer", recording)
    convert_run(teacher_run, *args, overrides=overrides, run_dir=killed, verbose=False)
    assert starts == [4]  # continued, not restarted
    a = torch.load(tmp_path / "straight" / "convert" / "stage1.pt", weights_only=True)
    b = torch.load(killed / "convert" / "stage1.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("stage1.csv", "stage1.json"):
        assert (killed / "convert" / name).read_text() == (tmp_path / "straight" / "convert" / name).read_text()
    assert not (killed / "convert" / "stage1.partial.pt").exists()
