"""``primaldual data`` subcommands on small sizes in a temporary cache."""

from __future__ import annotations

import json

from primaldual.cli import main


def test_generate_list_show(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMALDUAL_DATA", str(tmp_path))
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "missing: primaldual data generate listops" in out and str(tmp_path) in out
    assert "missing: primaldual data fetch uea JapaneseVowels" in out
    assert main(["data", "generate", "listops", "--train", "6", "--val", "2", "--test", "2", "--seed", "1"]) == 0
    argv = ["data", "generate", "pathfinder", "--train", "8", "--val", "2", "--test", "2", "--contour-length", "6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "contact sheet" in out and (tmp_path / "pathfinder32_L6" / "contact_sheet.png").is_file()
    meta = json.loads((tmp_path / "listops" / "metadata.json").read_text())
    assert meta["seed"] == 1 and meta["splits"]["train"]["size"] == 6
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "generated, seed 1, 6/2/2" in out and "pathfinder32_L6" in out
    assert main(["data", "show", "listops"]) == 0 and '"seed": 1' in capsys.readouterr().out


def test_fetch_missing_idx_is_one_error_line_with_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMALDUAL_DATA", str(tmp_path))
    assert main(["data", "fetch", "mnist", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1
    assert lines[0].startswith("primaldual data fetch: error: ") and "copy the four MNIST idx files" in lines[0]
