"""The run directory: primaldual marks what it creates, and deletes or replaces files only there; a directory with
anything else in it is refused before anything in it is touched."""

from __future__ import annotations

import json

import pytest

from primaldual.cli import main
from primaldual.train.config import load_config
from primaldual.train.run import fit
from primaldual.train.rundir import MARK, check_run_dir, prepare_run_dir

ARGS = ["--trainer.max_epochs", "1", "--model.dim", "16", "--model.num_heads", "2", "--model.ffn_dim", "16"]


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_the_reproducer_leaves_a_project_folder_alone(capsys, tmp_path):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "config.yaml").write_text("lr: 0.1\n")
    (proj / "src" / "main.py").write_text("x\n")
    err = _error(capsys, ["fit", "-c", "uea/JapaneseVowels/transformer", *ARGS, "--run-dir", str(proj)])
    assert "not a primaldual run directory (it holds src)" in err and "nothing in it was touched" in err
    assert (proj / "src" / "main.py").read_text() == "x\n" and (proj / "config.yaml").read_text() == "lr: 0.1\n"
    assert sorted(p.name for p in proj.iterdir()) == ["config.yaml", "src"]  # no lock, no mark
    # a foreign config.yaml alone is not replaced either
    (proj / "src" / "main.py").unlink()
    (proj / "src").rmdir()
    err = _error(capsys, ["fit", "-c", "uea/JapaneseVowels/transformer", *ARGS, "--run-dir", str(proj)])
    assert "holds a config.yaml that primaldual did not write" in err
    assert (proj / "config.yaml").read_text() == "lr: 0.1\n" and sorted(p.name for p in proj.iterdir()) == [
        "config.yaml"
    ]


def test_an_empty_run_dir_and_fresh_on_a_foreign_directory_are_refused(capsys, tmp_path):
    assert "--run-dir: empty" in _error(capsys, ["fit", "-c", "uea/JapaneseVowels/transformer", "--run-dir", ""])
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    err = _error(capsys, ["fit", "-c", "uea/JapaneseVowels/transformer", "--run-dir", str(other), "--fresh"])
    assert "not a primaldual run directory" in err and (other / "notes.txt").read_text() == "keep"
    with pytest.raises(Exception, match="is a file"):
        check_run_dir(other / "notes.txt")


def test_a_run_directory_is_marked_and_fresh_deletes_only_its_own_entries(tmp_path, tiny_config):
    cfg = load_config(tiny_config(**{"trainer.max_epochs": 1}))
    run_dir = tmp_path / "run"
    fit(cfg, run_dir, verbose=False)
    mark = json.loads((run_dir / MARK).read_text())
    assert mark["primaldual"] and {"config.yaml", "checkpoints", "summary.json", "history.csv"} <= {
        p.name for p in run_dir.iterdir()
    }
    fit(cfg, run_dir, fresh=True, verbose=False)  # a marked directory: --fresh starts over
    assert (run_dir / "summary.json").is_file()
    (run_dir / "mine.txt").write_text("keep")  # something of the user's dropped in later: never deleted
    with pytest.raises(Exception, match="not a primaldual run directory"):
        fit(cfg, run_dir, fresh=True, verbose=False)
    assert (run_dir / "mine.txt").read_text() == "keep" and (run_dir / "summary.json").is_file()


def _own_tree(run_dir, config_text: str) -> None:
    """A run directory holding everything primaldual and its loggers write (no user file)."""
    for rel in (
        "checkpoints/last.ckpt",
        "checkpoints/last.ckpt.corrupt.1",
        "checkpoints/.last.ckpt.123.tmp",
        "logs/version_0/metrics.csv",
        "logs/version_1/hparams.yaml",
        "logs/tensorboard/version_0/events.out.tfevents.1764.host.1.0",
        "logs/wandb/offline-run-20261126_1-abc/files/config.yaml",
        "convert/stage1.pt",
        "analysis/spectra.png",
    ):
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_bytes(b"x")
    (run_dir / "config.yaml").write_text(config_text)
    (run_dir / MARK).write_text("{}\n")


@pytest.mark.parametrize(
    "user_file", ["logs/notes.txt", "checkpoints/my_model.pt", "analysis/figure.pdf", "logs/version_0/mine.txt"]
)
def test_fresh_never_deletes_a_user_file_inside_its_folders(tmp_path, tiny_config, user_file):
    """Reproducer 1b: ``--fresh`` read only the top-level names and removed ``checkpoints/`` and ``logs/`` whole."""
    from primaldual.train.config import ConfigError

    cfg = load_config(tiny_config())
    run_dir = tmp_path / "run"
    _own_tree(run_dir, tiny_config().read_text())
    (run_dir / user_file).write_text("keep")
    with pytest.raises(ConfigError, match="files primaldual did not write") as e:
        prepare_run_dir(cfg, run_dir, fresh=True, verbose=False)
    assert user_file in str(e.value)
    assert (run_dir / user_file).read_text() == "keep" and (run_dir / "checkpoints" / "last.ckpt").is_file()
    (run_dir / user_file).unlink()  # without it, --fresh clears the whole tree (loggers' folders included)
    prepare_run_dir(cfg, run_dir, fresh=True, verbose=False)
    assert sorted(p.name for p in run_dir.iterdir()) == [MARK, "config.yaml"]


def test_fresh_neither_follows_nor_keeps_a_symlink_it_did_not_make(tmp_path, tiny_config):
    from primaldual.train.config import ConfigError

    cfg = load_config(tiny_config())
    run_dir = tmp_path / "run"
    _own_tree(run_dir, tiny_config().read_text())
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.ckpt").write_text("keep")
    (run_dir / "checkpoints" / "best.ckpt").symlink_to(data / "x.ckpt")
    with pytest.raises(ConfigError, match="checkpoints/best.ckpt"):
        prepare_run_dir(cfg, run_dir, fresh=True, verbose=False)
    assert (data / "x.ckpt").read_text() == "keep" and (run_dir / "checkpoints" / "best.ckpt").is_symlink()


def test_a_run_directory_from_before_the_mark_is_adopted(tmp_path, tiny_config):
    cfg = load_config(tiny_config())
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(tiny_config().read_text())
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"progress")  # a full record: a config and a checkpoint
    prepare_run_dir(cfg, run_dir, fresh=True, verbose=False)
    assert (run_dir / MARK).is_file() and (run_dir / "config.yaml").is_file()


def test_a_run_written_before_a_key_existed_resumes_with_it_at_its_default(tmp_path):
    """An offline-RL run directory from before ``model.init`` (and the other DT block keys) holds a config.yaml
    without them; the same run continues there (the record gains the keys), a non-default value is refused: the
    shipped config's ``init: gpt2`` too (that run trained with PyTorch's, then the default: ``--model.init pytorch``
    continues it)."""
    import yaml

    from primaldual.train.config import ConfigError, dump_config

    cfg = load_config("rl/hopper-medium/dt", ["--model.init", "pytorch"])
    old = yaml.safe_load(dump_config(cfg))
    for key in ("activation", "attn_drop", "ffn_drop", "init"):
        old["model"].pop(key)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"progress")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    prepare_run_dir(cfg, run_dir, fresh=False, verbose=False)
    assert (run_dir / "config.yaml").read_text() == dump_config(cfg)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    with pytest.raises(ConfigError, match="different config"):
        prepare_run_dir(load_config("rl/hopper-medium/dt"), run_dir, False, False)


def test_a_config_yaml_listing_other_tasks_keys_at_their_defaults_resumes(tmp_path):
    """Before ``model.pooling`` (and the other LRA / LM keys) were task-exclusive, every config.yaml listed them."""
    import yaml

    from primaldual.train.config import dump_config

    cfg = load_config("uea/JapaneseVowels/primalformer")
    old = yaml.safe_load(dump_config(cfg))
    old["data"].update(tokenisation="brackets", stand_in=None, train_pairs=10000, eval_pairs=2000)
    old["model"]["pooling"] = "mean"
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"progress")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    prepare_run_dir(cfg, run_dir, fresh=False, verbose=False)
    assert (run_dir / "config.yaml").read_text() == dump_config(cfg)


@pytest.mark.parametrize("kind", ["symlink", "dangling", "fifo"])
def test_a_run_lock_that_is_not_a_regular_file_is_refused_and_never_followed(tmp_path, tiny_config, capsys, kind):
    import os

    from primaldual.cli import main

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / "run.lock"
    if kind == "symlink":
        lock.symlink_to(notes)
    elif kind == "dangling":
        lock.symlink_to(tmp_path / "made_by_the_lock")
    else:
        os.mkfifo(lock)
    rc = main(["fit", "--config", str(tiny_config()), "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is not a regular file" in err[0], err
    assert notes.read_text() == "my notes\n" and not (tmp_path / "made_by_the_lock").exists()
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.lock"]


def test_a_killed_writes_temporary_files_and_analysis_are_the_runs_own(tmp_path, tiny_config, capsys):
    from primaldual.cli import main

    cfg = str(tiny_config())
    run_dir = tmp_path / "run"
    assert main(["fit", "--config", cfg, "--run-dir", str(run_dir)]) == 0
    left = [
        run_dir / ".history.csv.k3j_x9a1.tmp",
        run_dir / ".config.yaml.ab12cd34.tmp",
        run_dir / "checkpoints" / ".last.ckpt.q1w2e3r4.tmp",
        run_dir / "checkpoints" / ".last.prev.ckpt.4242.tmp",
    ]
    for p in left:
        p.write_bytes(b"partial")
    (run_dir / "analysis").mkdir()
    (run_dir / "analysis" / "analysis.json").write_text("{}")
    capsys.readouterr()
    assert main(["fit", "--config", cfg, "--run-dir", str(run_dir)]) == 0
    assert not any(p.exists() for p in left)
    assert (run_dir / "analysis" / "analysis.json").read_text() == "{}"
    mine = run_dir / ".notes.tmp"  # a user's file that only looks temporary is foreign: refused, kept
    mine.write_text("mine")
    assert main(["fit", "--config", cfg, "--run-dir", str(run_dir)]) == 2
    assert "not a primaldual run directory" in capsys.readouterr().err and mine.read_text() == "mine"


@pytest.mark.parametrize("files", [["history.csv"], ["summary.json"], ["config.yaml", "logs/mine.txt"]])
def test_an_unmarked_folder_without_a_full_run_record_is_never_adopted(tmp_path, tiny_config, capsys, files):
    from primaldual.cli import main

    cfg = tiny_config()
    run_dir = tmp_path / "e"
    for name in files:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(cfg.read_text() if name == "config.yaml" else "mine\n")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for extra in ([], ["--fresh"]):
        assert main(["fit", "--config", str(cfg), "--run-dir", str(run_dir), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "nothing in it" in err[0], err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_resume_may_switch_how_the_run_compiles(tmp_path):
    """trainer.compile / compile_mode change how a run executes, not what it computes: the run directory resumes with
    them switched either way (and an older config.yaml, without compile_mode, reads as the default)."""
    from primaldual.train.config import dump_config

    eager = load_config("uea/JapaneseVowels/primalformer")
    graphs = load_config(
        "uea/JapaneseVowels/primalformer", ["--trainer.compile", "true", "--trainer.compile_mode", "reduce-overhead"]
    )
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"progress")
    for stored, resumed in ((eager, graphs), (graphs, eager)):
        (run_dir / "config.yaml").write_text(dump_config(stored))
        prepare_run_dir(resumed, run_dir, fresh=False, verbose=False)
        assert (run_dir / "config.yaml").read_text() == dump_config(resumed)
        assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == b"progress"


def test_a_run_dir_under_a_file_is_named_as_the_flag(tmp_path):
    from primaldual.utils.errors import ConfigError

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"--run-dir: .*notes.txt/run cannot be made: .*notes.txt is a file"):
        check_run_dir(tmp_path / "notes.txt" / "run")
    assert check_run_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"  # made when the run starts


def test_a_temporary_file_renamed_away_while_the_directory_is_read_is_not_foreign(tmp_path, monkeypatch):
    """A live run renames its atomic writes into place: a temporary file listed, then gone before it is looked at,
    is still primaldual's (a second ``fit`` must be refused for the lock, not for a foreign file); a folder by that
    name is not."""
    from pathlib import Path

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / MARK).write_text("")
    listed = [run_dir / MARK, run_dir / ".history.csv.v6enla_p.tmp"]  # the second: already renamed away
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(listed) if self == run_dir else iter(()))
    assert check_run_dir(run_dir) == run_dir
    monkeypatch.undo()
    (run_dir / ".history.csv.v6enla_p.tmp").mkdir()
    with pytest.raises(Exception, match=r"is not a primaldual run directory \(it holds .history.csv.v6enla_p.tmp\)"):
        check_run_dir(run_dir)
