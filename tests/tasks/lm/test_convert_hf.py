"""``primaldual convert`` with a Hugging Face teacher: a tiny Llama saved with ``save_pretrained`` and a word-level
tokenizer, converted end to end on a text file; resume from the Trainer's checkpoint; the refusals."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tests.integrations.tiny_models import tiny

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from primaldual.cli import main  # noqa: E402
from primaldual.tasks.lm.convert_hf import is_hf_teacher, perplexity, token_stream  # noqa: E402

WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A saved tiny Llama (vocabulary 50) with a word-level tokenizer, and a text file of its words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("hf")
    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    model = tiny("llama", num_hidden_layers=2)
    model.save_pretrained(root / "teacher")
    fast.save_pretrained(root / "teacher")
    rng = random.Random(0)
    # a little structure to learn: each word is usually followed by the next one
    words, w = [], 0
    for _ in range(3000):
        w = (w + 1) % 40 if rng.random() < 0.8 else rng.randrange(40)
        words.append(WORDS[w])
    (root / "text.txt").write_text(" ".join(words))
    config = {
        "student": "primal",
        "layers": [-1],
        "options": {"s": 4, "eta": 0.1},
        "calibration_batches": 1,
        "stage1": {"tokens": 64, "lr": 3e-3},
        "stage2": {"tokens": 128, "lr": 1e-3, "warmup_steps": 1, "decay": "cosine"},
        "data": {"text": str(root / "text.txt"), "context": 16, "batch_size": 2, "eval_windows": 3},
    }
    (root / "conv.yaml").write_text(json.dumps(config))  # JSON is YAML
    return root


def test_a_saved_llama_converts_loads_and_resumes(teacher, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from primaldual.integrations.hf import converted_layers, from_pretrained

    run = teacher / "run"
    argv = ["convert", str(teacher / "teacher"), "-c", str(teacher / "conv.yaml"), "--run-dir", str(run)]
    assert is_hf_teacher(teacher / "teacher") and main(argv) == 0
    out = capsys.readouterr().out
    assert "stage 1: 2 updates" in out and "stage 2: 4 updates" in out and "converted: test ppl" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stage1_tokens"] == 64 and summary["stage2_tokens"] == 128 and summary["layers"] == [1]
    assert summary["ppl_ratio"] == pytest.approx(summary["ppl"] / summary["teacher_ppl"])
    # the saved model is the converted one, and evaluates to the summary's figure
    model = from_pretrained(AutoModelForCausalLM, run / "model")
    assert converted_layers(model)
    tok = AutoTokenizer.from_pretrained(run / "model")
    text = (teacher / "text.txt").read_text()
    test = token_stream(tok, text[int(len(text) * 0.9) :])
    assert perplexity(model, test, 16, 3)["ppl"] == pytest.approx(summary["ppl"], rel=1e-5)
    # a run killed after its last checkpoint and its model's save, before the summary: resumes and ends the same
    (run / "summary.json").unlink()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "stage 1: done earlier" in out and "resuming from" in out
    again = json.loads((run / "summary.json").read_text())
    assert again["ppl"] == pytest.approx(summary["ppl"], rel=1e-6)
    assert main(argv) == 0 and "finished earlier" in capsys.readouterr().out
    # the same conversion, its config spelled another way, is the same run
    import os

    here = os.getcwd()
    try:
        os.chdir(teacher)
        assert main(["convert", "teacher", "-c", "./conv.yaml", "--run-dir", str(run)]) == 0
        assert "finished earlier" in capsys.readouterr().out
    finally:
        os.chdir(here)
    # a converted model is not a teacher (its layers would load as the original's, re-initialised)
    assert main(["convert", str(run / "model"), "-c", str(teacher / "conv.yaml"), "--run-dir", str(run) + "x"]) == 2
    assert "already converted by primaldual" in capsys.readouterr().err and not Path(str(run) + "x").exists()
    with torch.no_grad():  # the teacher's file is unchanged
        t = AutoModelForCausalLM.from_pretrained(teacher / "teacher")
        assert not converted_layers(t)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--fresh"], "--fresh: a Hugging Face conversion does not delete"),
        (["--data.text", "/nonexistent/x.txt"], "data.text: /nonexistent/x.txt is not a file"),
        (["--data.contxt", "8"], "data: unknown key(s) contxt"),
        (["--data.context", "1"], "data.context"),
        (["--stage2.decay", "inverse_sqrt"], "stage2.decay: a Hugging Face conversion takes"),
        (["--layers", "[5]"], "out of range"),
        (["--options.s", "0"], "s must be an int >= 1"),
        (["--data.context", "80"], "data.context: 80 tokens, more than the teacher's 64 positions"),
        (["--data.eval_fraction", "0.999"], "the training text has"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(teacher, tmp_path, capsys, extra, message):
    argv = ["convert", str(teacher / "teacher"), "-c", str(teacher / "conv.yaml"), "--run-dir", str(tmp_path / "r")]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "r").exists()
    assert main(["convert", str(teacher / "teacher"), "-c", str(teacher / "conv.yaml"), "--run-dir", ""]) == 2
    assert "--run-dir: empty" in capsys.readouterr().err


def test_a_foreign_directory_and_a_run_teacher_with_data_are_refused(teacher, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    argv = ["convert", str(teacher / "teacher"), "-c", str(teacher / "conv.yaml"), "--run-dir", str(mine)]
    assert main(argv) == 2 and "not a primaldual conversion directory" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    # a primaldual run as the teacher brings its own data: a data section is an error, before the run is read
    fake_run = tmp_path / "run"
    fake_run.mkdir()
    (fake_run / "config.yaml").write_text("task: lm\n")
    assert main(["convert", str(fake_run), "-c", str(teacher / "conv.yaml")]) == 2
    assert "only a Hugging Face teacher takes a data section" in capsys.readouterr().err


def test_stage_two_with_adapters_saves_a_merged_model(teacher, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from primaldual.integrations.hf import converted_layers, from_pretrained

    run = tmp_path / "lora"
    argv = ["convert", str(teacher / "teacher"), "-c", str(teacher / "conv.yaml"), "--run-dir", str(run)]
    assert main([*argv, "--stage2.lora", "2"]) == 0
    model = from_pretrained(AutoModelForCausalLM, run / "model")
    assert converted_layers(model) and not any("lora" in k or "parametrizations" in k for k in model.state_dict())
    summary = json.loads((run / "summary.json").read_text())
    text = (teacher / "text.txt").read_text()
    from transformers import AutoTokenizer

    test = token_stream(AutoTokenizer.from_pretrained(run / "model"), text[int(len(text) * 0.9) :])
    assert perplexity(model, test, 16, 3)["ppl"] == pytest.approx(summary["ppl"], rel=1e-5)  # merged = trained


def test_the_kl_term_is_zero_for_the_teacher_itself_and_positive_for_another(tmp_path):
    import copy

    from transformers import TrainingArguments

    from primaldual.tasks.lm.convert_hf import _stage2_trainer

    model = tiny("llama")
    other = copy.deepcopy(model)
    torch.nn.init.normal_(other.lm_head.weight)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    ids = torch.randint(2, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "labels": ids}
    plain = model(**inputs).loss
    same = _stage2_trainer(model, 1.0)(model=model, args=args).compute_loss(model, inputs)
    assert float(same) == pytest.approx(float(plain), abs=1e-6)
    more = _stage2_trainer(other, 0.5)(model=model, args=args).compute_loss(model, inputs)
    assert float(more) > float(plain) + 1e-3


def test_a_missing_teacher_or_tokenizer_is_one_line_and_writes_nothing(teacher, tmp_path, capsys):
    conf = str(teacher / "conv.yaml")
    assert main(["convert", str(tmp_path / "nothere"), "-c", conf]) == 2
    assert "not found (a primaldual run directory, a save_pretrained directory" in capsys.readouterr().err
    tiny("llama").save_pretrained(tmp_path / "notok")
    assert main(["convert", str(tmp_path / "notok"), "-c", conf, "--run-dir", str(tmp_path / "r")]) == 2
    assert "no tokenizer could be read" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_stage_1_killed_mid_way_continues_to_the_uninterrupted_result(teacher, tmp_path, capsys, monkeypatch):
    """Every tenth of stage 1 writes ``convert/stage1.partial.pt`` (the new parameters, Adam, progress, random
    state); a conversion stopped after update 4 of 10 continues there, to the same stage-1 model and history."""
    from safetensors.torch import load_file

    import primaldual.convert.external as external

    from ...train.helpers import stage1_stopper

    def argv(run):
        return ["convert", str(teacher / "teacher"), "-c", str(teacher / "conv.yaml"), "--run-dir", str(run),
                "--stage1.tokens", "320", "--stage2.tokens", "32"]  # fmt: skip

    assert main(argv(tmp_path / "straight")) == 0

    starts: list[int] = []
    stopping, recording = stage1_stopper(external.attention_transfer, 4, starts)

    killed = tmp_path / "killed"
    monkeypatch.setattr(external, "attention_transfer", stopping)
    assert main(argv(killed)) == 1  # the command reports the "crash" as unexpected
    capsys.readouterr()
    assert torch.load(killed / "convert" / "stage1.partial.pt", weights_only=True)["step"] == 4
    monkeypatch.setattr(external, "attention_transfer", recording)
    import primaldual.tasks.lm.convert_hf as task_conv

    measured: list[object] = []
    real = task_conv.perplexity
    monkeypatch.setattr(task_conv, "perplexity", lambda model, *a, **k: measured.append(model) or real(model, *a, **k))
    assert main(argv(killed)) == 0 and starts == [4]  # continued, not restarted
    assert len(measured) == 2  # after stage 1 and at the end: the teacher's, measured before the kill, is kept
    assert "stage 1: resuming at step 4/10" in capsys.readouterr().out
    a, b = (json.loads((d / "convert" / "stage1.json").read_text()) for d in (tmp_path / "straight", killed))
    assert a == b
    wa, wb = (load_file(d / "convert" / "stage1" / "model.safetensors") for d in (tmp_path / "straight", killed))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not (killed / "convert" / "stage1.partial.pt").exists()


@pytest.mark.parametrize("name", ["phi3", "opt", "qwen3", "gpt_neox"])
def test_other_saved_model_types_convert_end_to_end(teacher, tmp_path, capsys, name):
    """`primaldual convert DIR` on a saved Phi-3 (Llama's layout, one fused qkv_proj), OPT, Qwen3 (query / key
    norms) and GPT-NeoX (partial rotary): both stages, the saved model reloads converted and evaluates to the
    summary's figure."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from primaldual.integrations.hf import converted_layers, from_pretrained

    src = tmp_path / name
    tiny(name).save_pretrained(src)
    AutoTokenizer.from_pretrained(teacher / "teacher").save_pretrained(src)
    run = tmp_path / "run"
    assert main(["convert", str(src), "-c", str(teacher / "conv.yaml"), "--run-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    model = from_pretrained(AutoModelForCausalLM, run / "model")
    assert list(converted_layers(model)) and summary["layers"] == [1]
    tok = AutoTokenizer.from_pretrained(run / "model")
    text = (teacher / "text.txt").read_text()
    test = token_stream(tok, text[int(len(text) * 0.9) :])
    assert perplexity(model, test, 16, 3)["ppl"] == pytest.approx(summary["ppl"], rel=1e-5)
    capsys.readouterr()


def test_a_sliding_window_teacher_converts_and_a_wider_student_window_is_refused_first(teacher, tmp_path, capsys):
    """A saved Mistral whose layers slide a 4-key window: the primal student converts end to end (said to see past
    the window); a hybrid student with its default 64-key window is refused before anything is written."""
    from transformers import AutoTokenizer

    src = tmp_path / "mistral"
    tiny("mistral", sliding_window=4).save_pretrained(src)
    AutoTokenizer.from_pretrained(teacher / "teacher").save_pretrained(src)
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match=r"layers \[1\]: the model's sliding window \(4 keys\) is not kept"):
        assert main(["convert", str(src), "-c", str(teacher / "conv.yaml"), "--run-dir", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["layers"] == [1]
    capsys.readouterr()
    refused = tmp_path / "refused"
    argv = ["convert", str(src), "-c", str(teacher / "conv.yaml"), "--run-dir", str(refused), "--student", "hybrid",
            "--options", "{}"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "window: layer 1 of the teacher slides a window of 4 keys" in err[0], err
    assert not refused.exists()
