"""``trainer.compile``: a run trains compiled (checked against eager first), falls back to eager with one line when
compilation fails or disagrees, and leaves the stored config of uncompiled runs as it was."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import nn

from primaldual.models import SequenceClassifier
from primaldual.train.compile import compile_model, compile_options
from primaldual.train.config import ConfigError, RunConfig, dump_config, load_config

from .helpers import fit_cmd, run


def _model_and_inputs():
    torch.manual_seed(0)
    model = SequenceClassifier(16, 3, 12, dim=16, depth=2, num_heads=2, ffn_dim=32, attention=["softmax", "primal"])
    tokens = torch.randint(0, 16, (4, 12))
    return model, (tokens, torch.ones(4, 12, dtype=torch.bool))


def test_a_compiler_failure_leaves_the_model_eager_with_one_line(monkeypatch):
    model, inputs = _model_and_inputs()
    ref = model.eval()(*inputs)

    def broken(self, *args, **kwargs):
        raise RuntimeError("no C++ compiler\nsecond line")

    monkeypatch.setattr(nn.Module, "compile", broken)
    notes: list[str] = []
    assert compile_model(model, inputs, notes.append) is False
    assert notes == ["trainer.compile: compilation failed (RuntimeError: no C++ compiler); training eagerly"]
    assert torch.equal(model(*inputs), ref)


def test_a_compiled_model_that_disagrees_with_eager_is_not_used(monkeypatch):
    model, inputs = _model_and_inputs()
    ref = model.eval()(*inputs)

    def wrong(self, *args, **kwargs):  # a "compiled" call that returns another result
        self._compiled_call_impl = lambda *a, **k: self._call_impl(*a, **k) + 1.0

    monkeypatch.setattr(nn.Module, "compile", wrong)
    notes: list[str] = []
    assert compile_model(model, inputs, notes.append) is False
    assert "disagrees with eager" in notes[0] and "training eagerly" in notes[0]
    assert torch.equal(model(*inputs), ref)  # the wrong compiled call was removed


def test_cpu_models_compile_with_aten_random_numbers(monkeypatch):
    # Inductor's in-kernel Philox on CPU made a dropout-heavy step 1.5x slower than eager; ATen's generator is used
    model, inputs = _model_and_inputs()
    assert compile_options(model) == {"fallback_random": True}
    assert compile_options(nn.Identity()) == {"fallback_random": True}  # no parameters: nothing to put elsewhere
    seen: list[dict] = []

    def record(self, *args, **kwargs):
        seen.append(kwargs)

    monkeypatch.setattr(nn.Module, "compile", record)
    compile_model(model, inputs, lambda _: None)
    assert seen == [{"options": {"fallback_random": True}}]


def test_compile_model_swaps_dropout_for_counter_dropout(monkeypatch):
    from primaldual import CounterDropout

    model, inputs = _model_and_inputs()
    plain = [n for n, m in model.named_modules() if type(m) is nn.Dropout]
    assert plain
    monkeypatch.setattr(nn.Module, "compile", lambda self, *a, **k: None)
    assert compile_model(model, inputs, lambda _: None)
    assert [n for n, m in model.named_modules() if type(m) is CounterDropout] == plain


def test_the_compile_mode_reaches_torch_compile(monkeypatch):
    """trainer.compile_mode: torch.compile's ``mode`` on a GPU; on a CPU, whose options torch.compile will not take
    beside a mode, the options that mode sets, merged with the CPU's own."""
    model, inputs = _model_and_inputs()
    seen: list[dict] = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, *a, **k: seen.append(k))
    notes: list[str] = []
    compile_model(model, inputs, notes.append, "reduce-overhead")
    assert seen[-1] == {"options": {"triton.cudagraphs": True, "fallback_random": True}}
    assert "compiled with torch.compile (mode reduce-overhead)" in notes[-1]
    monkeypatch.setattr("primaldual.train.compile.compile_options", lambda model: {})  # as on a GPU
    compile_model(model, inputs, notes.append, "max-autotune")
    compile_model(model, inputs, notes.append)
    assert seen[-2:] == [{"mode": "max-autotune"}, {"options": {}}]


def test_the_compile_mode_is_validated_and_leaves_the_fingerprint():
    base = load_config("lra/listops/transformer", ["--trainer.compile", "true"])
    graphs = load_config(
        "lra/listops/transformer", ["--trainer.compile", "true", "--trainer.compile_mode", "reduce-overhead"]
    )
    assert graphs.fingerprint() == base.fingerprint()  # how the run executes, not what it computes
    assert "compile_mode: reduce-overhead" in dump_config(graphs) and "compile_mode" not in dump_config(base)
    with pytest.raises(ConfigError, match=r"trainer.compile_mode: 'reduce-overhead' applies only with trainer.compile"):
        load_config("lra/listops/transformer", ["--trainer.compile_mode", "reduce-overhead"])
    with pytest.raises(ConfigError, match="trainer.compile_mode"):
        load_config("lra/listops/transformer", ["--trainer.compile", "true", "--trainer.compile_mode", "fast"])


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler for Inductor")
def test_a_model_compiles_in_a_mode_on_the_cpu():
    model, inputs = _model_and_inputs()
    notes: list[str] = []
    assert compile_model(model, inputs, notes.append, "reduce-overhead"), notes  # CUDA graphs: none on a CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_models_keep_inductors_random_numbers():
    model, _ = _model_and_inputs()
    assert compile_options(model.cuda()) == {}


def test_compile_option_is_validated_and_absent_from_uncompiled_configs():
    with pytest.raises(ConfigError, match="trainer.compile"):
        load_config("lra/listops/transformer", ["--trainer.compile", "'true'"])
    assert load_config("rl/hopper-medium/dt", ["--trainer.compile", "true"]).trainer.compile  # its own loop compiles
    assert "compile" not in dump_config(RunConfig())
    on = load_config("lra/listops/transformer", ["--trainer.compile", "true"])
    assert "compile: true" in dump_config(on)
    assert on.fingerprint() == load_config("lra/listops/transformer").fingerprint()  # the same run, compiled


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler for Inductor")
def test_a_run_trains_compiled(tmp_path, tiny_config):
    cfg = tiny_config(**{"trainer.max_epochs": 1, "trainer.compile": True})
    out = tmp_path / "run"
    res = run(fit_cmd(cfg, out, "--threads", "1"), timeout=600)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("trainer.compile: compiled with torch.compile"))
    assert "dropout modules draw counter-based masks; matches eager on the first validation batch" in line
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["test_acc"] <= 1.0


def test_a_resume_may_switch_compilation(tmp_path):
    from primaldual.train.run import prepare_run_dir

    on = load_config("lra/listops/transformer", ["--trainer.compile", "true"])
    off = load_config("lra/listops/transformer")
    prepare_run_dir(on, tmp_path, fresh=False, verbose=False)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"progress")
    prepare_run_dir(off, tmp_path, fresh=False, verbose=False)  # not refused: the same run
    assert (tmp_path / "config.yaml").read_text() == dump_config(off)
    with pytest.raises(ConfigError, match="different config"):
        prepare_run_dir(load_config("lra/listops/transformer", ["--seed", "5"]), tmp_path, fresh=False, verbose=False)
