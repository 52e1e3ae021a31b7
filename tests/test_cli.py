"""The ``primaldual`` command line: one error line and exit code 2 for bad input in every subcommand, ``--debug``,
deprecated spellings, ``--print-config`` and the examples in every ``--help``. Nothing here trains or benchmarks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from primaldual.cli import build_parser, main
from primaldual.utils.cli import iter_subparsers

from .train.helpers import env


def _one_error_line(capsys, argv: list[str], prog: str) -> str:
    """Run ``primaldual argv`` in-process; assert exit code 2 and exactly one stderr line ``<prog>: error: ...``."""
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


@pytest.fixture
def tiny(tmp_path, tiny_config):
    return str(tiny_config())


def test_smoke_and_bench_bad_input(capsys, tmp_path):
    line = _one_error_line(capsys, ["smoke", "--dim", "10", "--heads", "3", "--length", "8"], "primaldual smoke")
    assert "divisible" in line
    line = _one_error_line(capsys, ["bench", "layers", "--attentions", "nope"], "primaldual bench layers")
    assert "--attentions" in line and "nope" in line
    line = _one_error_line(capsys, ["bench", "layers", "--lengths", "256,x"], "primaldual bench layers")
    assert "--lengths" in line
    line = _one_error_line(capsys, ["bench", "layers", "--options", "{bad"], "primaldual bench layers")
    assert "--options" in line
    line = _one_error_line(capsys, ["bench", "lra", "--tasks", "listops,nope"], "primaldual bench lra")
    assert "--tasks" in line and "nope" in line
    line = _one_error_line(capsys, ["bench", "lra", "--models", "nope"], "primaldual bench lra")
    assert "--models" in line
    line = _one_error_line(capsys, ["bench", "profile", "--layer", "nope", "--length", "8"], "primaldual bench profile")
    assert "nope" in line
    missing = tmp_path / "missing.json"
    line = _one_error_line(capsys, ["bench", "plot", str(missing)], "primaldual bench plot")
    assert str(missing) in line and "Errno" not in line
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_error_line(capsys, ["bench", "plot", str(bad)], "primaldual bench plot")


def test_training_subcommands_bad_input(capsys, tmp_path, tiny):
    for sub in ("fit", "validate", "test"):
        line = _one_error_line(capsys, [sub, "--config", "no/such/config"], f"primaldual {sub}")
        assert "no/such/config" in line
        line = _one_error_line(capsys, [sub, "--config", tiny, "--model.atention", "x"], f"primaldual {sub}")
        assert "model.atention" in line
    (tmp_path / "empty_run").mkdir()
    for sub in ("validate", "test"):
        run_dir = tmp_path / "no_run"
        line = _one_error_line(capsys, [sub, "--config", tiny, "--run-dir", str(run_dir)], f"primaldual {sub}")
        assert f"run directory {run_dir} not found" in line
        run_dir = tmp_path / "empty_run"
        line = _one_error_line(
            capsys, [sub, "--config", tiny, "--run-dir", str(run_dir), "--ckpt", "last"], f"primaldual {sub}"
        )
        assert f"checkpoint {run_dir / 'checkpoints' / 'last.ckpt'} not found" in line
    ckpt = tmp_path / "none.ckpt"
    line = _one_error_line(capsys, ["test", "--config", tiny, "--ckpt", str(ckpt)], "primaldual test")
    assert str(ckpt) in line
    line = _one_error_line(capsys, ["seeds", "--configs", tiny, "no/such/config"], "primaldual seeds")
    assert "no/such/config" in line
    line = _one_error_line(capsys, ["seeds", "--configs", tiny, "--trainer.max_epoch", "1"], "primaldual seeds")
    assert "trainer.max_epoch" in line


def test_data_show_finds_what_data_list_lists(capsys, tmp_path, monkeypatch):
    """A UEA set (under uea/, its release files, no metadata.json) and `pathfinder` (the generated set's folder)."""
    monkeypatch.setenv("PRIMALDUAL_DATA", str(tmp_path))
    (tmp_path / "uea" / "JapaneseVowels").mkdir(parents=True)
    (tmp_path / "uea" / "JapaneseVowels" / "JapaneseVowels_TRAIN.ts").write_text("@problemName x\n")
    assert main(["data", "show", "JapaneseVowels"]) == 0
    out = capsys.readouterr().out
    assert "uea/JapaneseVowels (no metadata.json" in out and "JapaneseVowels_TRAIN.ts  15 bytes" in out
    (tmp_path / "pathfinder32_L9").mkdir()
    (tmp_path / "pathfinder32_L9" / "metadata.json").write_text('{"seed": 4, "splits": {"train": {"size": 3}}}')
    assert main(["data", "show", "pathfinder"]) == 0 and '"seed": 4' in capsys.readouterr().out


def test_a_missing_optional_package_names_its_extra(capsys, monkeypatch):
    """Not "unexpected" (exit 1): the package and the extra that brings it, exit 2."""
    import primaldual.train.cli as train_cli

    def needs_pil(args):
        raise ModuleNotFoundError("No module named 'PIL'", name="PIL")

    monkeypatch.setattr(train_cli, "_cmd_fit", needs_pil)
    monkeypatch.setattr(train_cli, "_cmd_eval", needs_pil)
    line = _one_error_line(capsys, ["test"], "primaldual test")
    assert "needs pillow, which is not installed: pip install 'pillow' (or 'primaldual[data]')" in line

    def broken(args):
        raise ImportError("cannot import name 'x' from 'primaldual.y'")

    monkeypatch.setattr(train_cli, "_cmd_eval", broken)
    assert main(["test"]) == 1 and "unexpected" in capsys.readouterr().err  # a broken install stays unexpected


def test_seeds_refuses_seed_and_protocol_overrides(capsys):
    """They would collapse the grid (and --seed, as a prefix of --seeds, once replaced it silently)."""
    line = _one_error_line(capsys, ["seeds", "--configs", "uea/default", "--seeds", "0", "1", "--seed", "5"],
                           "primaldual seeds")  # fmt: skip
    assert "--seed: `primaldual seeds` sets each run's seed; give them with --seeds" in line
    line = _one_error_line(capsys, ["seeds", "--configs", "uea/default", "--protocol", "paper"], "primaldual seeds")
    assert "--protocol: `primaldual seeds` sets each run's protocol" in line


def test_data_subcommands_bad_input(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMALDUAL_DATA", str(tmp_path))
    line = _one_error_line(capsys, ["data", "show", "listops"], "primaldual data show")
    assert "primaldual data list" in line
    line = _one_error_line(capsys, ["data", "show", "x", "--dir", str(tmp_path / "nowhere")], "primaldual data show")
    assert "nowhere" in line
    line = _one_error_line(capsys, ["data", "generate", "listops", "--train", "-1"], "primaldual data generate")
    assert "--train -1" in line
    line = _one_error_line(capsys, ["data", "fetch", "uea"], "primaldual data fetch")
    assert "JapaneseVowels" in line
    line = _one_error_line(capsys, ["data", "fetch", "uea", "Heartbeat"], "primaldual data fetch")
    assert "timeseriesclassification.com" in line
    line = _one_error_line(capsys, ["data", "fetch", "mnist", "JapaneseVowels"], "primaldual data fetch")
    assert "only `uea`" in line
    line = _one_error_line(capsys, ["data", "fetch", "fashion_mnist", "--out", str(tmp_path)], "primaldual data fetch")
    assert "apt-get" in line
    # a corrupt copy is refused (checksums), not reported as fetched
    for split in ("TRAIN", "TEST"):
        (tmp_path / f"JapaneseVowels_{split}.ts").write_text("@problemName JapaneseVowels\n")
    line = _one_error_line(
        capsys, ["data", "fetch", "uea", "JapaneseVowels", "--out", str(tmp_path)], "primaldual data fetch"
    )
    assert "SHA-256" in line


def test_analyze_bad_input(capsys, tmp_path):
    line = _one_error_line(capsys, ["analyze", str(tmp_path / "nowhere")], "primaldual analyze")
    assert "nowhere" in line
    line = _one_error_line(capsys, ["analyze", str(tmp_path), "--labels", "A", "B"], "primaldual analyze")
    assert "--labels" in line
    line = _one_error_line(
        capsys, ["analyze", str(tmp_path), str(tmp_path), "--labels", "A", "A"], "primaldual analyze"
    )
    assert "distinct" in line
    line = _one_error_line(capsys, ["analyze", str(tmp_path)], "primaldual analyze")
    assert "config.yaml" in line


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["attentions", "--bogus"], "primaldual attentions"),
        (["configs", "x"], "primaldual configs"),
        (["data", "list", "--bogus"], "primaldual data list"),
        (["bench", "plot"], "primaldual bench plot"),
    ],
)
def test_usage_errors_exit_2_naming_the_subcommand(capsys, argv, prog):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"{prog}: error: ")


def test_debug_reraises_in_process(tiny):
    from primaldual.train.config import ConfigError

    with pytest.raises(ConfigError, match="no/such/config"):
        main(["fit", "--config", "no/such/config", "--debug"])
    with pytest.raises(ValueError, match="--attentions"):
        main(["--debug", "bench", "layers", "--attentions", "nope"])


def test_debug_reraises_so_the_traceback_shows():
    """With --debug the error is not turned into one line: it propagates (Python prints the traceback)."""
    from primaldual.train.config import ConfigError

    with pytest.raises(ConfigError, match="config 'no/such/config' not found"):
        main(["--debug", "fit", "--config", "no/such/config"])


def test_deprecated_fetch_uea_still_works(tmp_path):
    from primaldual.data.uea_fetch import fetch_japanese_vowels

    cached = fetch_japanese_vowels(quiet=True)  # cached after the first call (shared with tests/data/test_uea.py)
    dest = tmp_path / "jv"
    dest.mkdir()
    for split in ("TRAIN", "TEST"):
        name = f"JapaneseVowels_{split}.ts"
        (dest / name).write_bytes((cached / name).read_bytes())
    cmd = [sys.executable, "-m", "primaldual.cli", "fetch-uea", "--dest", str(dest)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(dest)
    notices = res.stderr.strip().splitlines()
    assert any("fetch-uea: deprecated" in n and "primaldual data fetch uea JapaneseVowels" in n for n in notices)
    assert any("--dest is deprecated, use --out" in n for n in notices)
    assert "Traceback" not in res.stderr


def test_old_flag_spellings_are_hidden_aliases(capsys):
    parser = build_parser()
    args = parser.parse_args(["bench", "plot", "layers.json", "--out-dir", "figs"])
    assert args.out == "figs"
    assert "--out-dir is deprecated, use --out" in capsys.readouterr().err
    assert parser.parse_args(["fetch-uea", "--dest", "d"]).out == "d"
    for p in iter_subparsers(parser):
        assert "--out-dir" not in p.format_help() and "--dest" not in p.format_help()


def test_print_config_prints_the_resolved_config_and_exits(capsys, tiny):
    for sub in ("fit", "validate", "test"):
        assert main([sub, "--config", tiny, "--print-config", "--model.dim", "32", "--seed", "5"]) == 0
        out = capsys.readouterr().out
        assert "# overrides: --model.dim 32 --seed 5" in out
        cfg = yaml.safe_load(out)
        assert cfg["model"]["dim"] == 32 and cfg["seed"] == 5 and cfg["name"] == "tiny"


def test_every_subcommand_help_shows_examples():
    parser = build_parser()
    assert "Examples:" in parser.format_help()
    names = []
    for p in iter_subparsers(parser):
        names.append(p.prog)
        text = p.format_help()
        assert "Examples:\n  primaldual " in text, p.prog
        assert "--debug" in text, p.prog
    expected = ["attentions", "smoke", "bench layers", "bench lra", "bench profile", "bench plot", "fit", "validate"]
    expected += ["test", "seeds", "configs", "data list", "data show", "data generate", "data fetch", "analyze"]
    assert {f"primaldual {n}" for n in [*expected, "fetch-uea"]} <= set(names)


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        main(["data", "fetch", "--help"])
    assert e.value.code == 0 and "primaldual data fetch uea JapaneseVowels" in capsys.readouterr().out


@pytest.mark.parametrize(
    "typo,flag", [("--confg", "--config"), ("--run_dir", "--run-dir"), ("--print_config", "--print-config")]
)
def test_a_misspelt_flag_is_not_read_as_a_config_key(capsys, typo, flag):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", typo, "x"])
    assert exit_.value.code == 2 and f"unrecognized argument {typo}; did you mean {flag}?" in capsys.readouterr().err
