"""Bad input, table-driven: every case ends with one ``<prog>: error: ...`` line naming what is wrong and exit code 2,
and nothing it would have written (a results file, a run directory) is touched."""

from __future__ import annotations

import errno

import pytest
import torch

from primaldual.cli import main


def _one_error_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and ": error: " in lines[0] and "unexpected" not in lines[0], err
    return lines[0]


CASES = [
    (["smoke", "--batch", "0"], "--batch must be an int >= 1"),
    (["smoke", "--batch", "-1"], "--batch must be an int >= 1"),
    (["smoke", "--length", "0"], "--length must be an int >= 1"),
    (["bench", "layers", "--lengths", "0"], "--lengths: expected a comma list of integers >= 1"),
    (["bench", "layers", "--lengths", "-8"], "--lengths: expected a comma list of integers >= 1"),
    (["bench", "layers", "--attentions", ""], "--attentions: empty"),
    (["test", "-c", "uea/JapaneseVowels/transformer", "--ckpt", ""], "--ckpt: expected best, last or a checkpoint"),
    (["data", "fetch", "english", "--vocab-size", "0"], "--vocab-size must be an int >= 257"),
    (["fit", "-c", "vision/fashion_mnist/reduced/primal_plus", "--trainer.max_epochs", "2"], "trainer.max_epochs"),
    (["fit", "-c", "uea/JapaneseVowels/transformer", "--run-dir", ""], "--run-dir: empty"),
    (["bench", "generate", "--heads", "3", "--dim", "16"], "--heads: 3 heads do not divide --dim 16"),
    (["bench", "generate", "--device", "banana"], "--device: expected a torch device"),
    (["bench", "generate", "--threads", "-1"], "--threads: expected 0"),
    (["bench", "generate", "--mem-limit-gb", "-1"], "--mem-limit-gb: expected a positive"),
    (["fit", "-c", "uea/default", "--optim.lr", "fast"], "optim.lr"),
    (["fit", "-c", "uea/default", "--model.dim", "[unclosed"], "--model.dim: '[unclosed' is not a valid YAML value"),
    (["fit", "-c", "uea/default", "--name", "a\x01b"], "--name: 'a\\x01b' is not a valid YAML value"),
    (["fit", "-c", "uea/default", "--model.dim", "1000000000000"], "model.dim must be an int"),
    (["fit", "-c", "uea/default", "--optim.lr", "1e-3", "--print-config", "--trainer.max_epochs", "x"], "max_epochs"),
    (["convert", "nowhere", "-c", "lm/english/convert/primal_plus"], "TEACHER nowhere: not found"),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_error_line(capsys, tmp_path, monkeypatch, argv, expected):
    monkeypatch.chdir(tmp_path)
    if argv[:2] == ["bench", "layers"]:  # the results file of an earlier sweep stays as it was
        results = tmp_path / "results.json"
        results.write_text("{}")
        argv = [*argv, "--out", str(results)]
    assert expected in _one_error_line(capsys, argv)
    if argv[:2] == ["bench", "layers"]:
        assert results.read_text() == "{}" and not (tmp_path / "results.csv").exists()
    assert not (tmp_path / "runs").exists()


def test_a_file_that_is_not_a_results_file_and_an_empty_config(capsys, tmp_path):
    other = tmp_path / "notes.json"
    other.write_text("not json")
    assert "not a results file of `primaldual bench layers`" in _one_error_line(capsys, ["bench", "plot", str(other)])
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing but a comment\n")
    assert "empty (no keys)" in _one_error_line(capsys, ["fit", "--config", str(empty)])


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/ro/run/config.yaml"), "Permission denied"),
        (OSError(errno.ENOSPC, "No space left on device", "/full/run/checkpoints"), "No space left on device"),
        (OSError(errno.EROFS, "Read-only file system", "/ro/run"), "Read-only file system"),
    ],
)
def test_the_machines_state_is_an_error_line_not_an_unexpected_one(capsys, monkeypatch, error, expected):
    def fail(args):  # as a write deep inside fit fails on a read-only or full file system
        raise error

    monkeypatch.setattr("primaldual.cli.build_parser", _parser_with({"fit": fail}))
    line = _one_error_line(capsys, ["fit"])
    assert expected in line and error.filename in line


def _parser_with(funcs):
    from primaldual import cli

    build = cli.build_parser

    def patched():
        parser = build()
        for p in cli.iter_subparsers(parser):
            name = p.prog.split()[-1]
            if name in funcs:
                p.set_defaults(func=funcs[name])
        return parser

    return patched


def test_hf_convert_layers_must_be_ints():
    pytest.importorskip("transformers")
    from primaldual.integrations import hf

    from .integrations.tiny_models import tiny

    with pytest.raises(TypeError, match=r"layers must be an int, a sequence of ints or 'all', got 1.0 \(float\)"):
        hf.convert(tiny("gpt2"), "softmax", layers=1.0)


def test_an_error_raised_in_a_data_loader_worker_is_one_short_line():
    """torch re-raises a worker's exception with the worker's whole traceback in its message."""
    from primaldual.cli import _message

    text = (
        "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "/x/worker.py", line 349, in _worker_loop\n    data = fetcher.fetch(index)\n'
        "ValueError: /data/train/cat/broken.png: cannot read the image (cannot identify image file)\n"
    )
    assert (
        _message(ValueError(text)) == "/data/train/cat/broken.png: cannot read the image (cannot identify image file)"
    )


def test_a_seed_beyond_the_generators_range_is_named():
    from primaldual.models import CausalLM

    m = CausalLM(50, 16, dim=16, depth=1, num_heads=2, ffn_dim=16, dropout=0.0, attention="softmax").eval()
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 18446744073709551615\]"):
        m.generate(torch.zeros(1, 2, dtype=torch.long), None, 2, seed=10**23)
