"""``primaldual data`` subcommands on small sizes in a temporary cache."""

from __future__ import annotations

import argparse
import json

from primaldual.data.cli import register


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="primaldual")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", *argv])
    return args.func(args)


def test_generate_list_show(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMALDUAL_DATA", str(tmp_path))
    assert _run(["list"]) == 0
    out = capsys.readouterr().out
    assert "missing: primaldual data generate listops" in out and str(tmp_path) in out
    assert _run(["generate", "listops", "--train", "6", "--val", "2", "--test", "2", "--seed", "1"]) == 0
    assert _run(["generate", "pathfinder", "--train", "8", "--val", "2", "--test", "2", "--contour-length", "6"]) == 0
    out = capsys.readouterr().out
    assert "contact sheet" in out and (tmp_path / "pathfinder32_L6" / "contact_sheet.png").is_file()
    meta = json.loads((tmp_path / "listops" / "metadata.json").read_text())
    assert meta["seed"] == 1 and meta["splits"]["train"]["size"] == 6
    assert _run(["list"]) == 0
    out = capsys.readouterr().out
    assert "generated, seed 1, 6/2/2" in out and "pathfinder32_L6" in out
    assert _run(["show", "listops"]) == 0 and '"seed": 1' in capsys.readouterr().out


def test_fetch_missing_idx_prints_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMALDUAL_DATA", str(tmp_path))
    assert _run(["fetch", "mnist"]) == 1
    assert "copy the four MNIST idx files" in capsys.readouterr().out
