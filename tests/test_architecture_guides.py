"""docs/architecture.md's three guides run as written: each guide's files (the blocks whose first line names a file)
are written into a temporary folder, and its other Python blocks run there in a fresh process, so that nothing the
guides register reaches the registries of this test session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
BLOCK = re.compile(r"```(python|yaml)\n(.*?)```", re.S)


def _guide(title: str) -> tuple[dict[str, str], list[str]]:
    """(file name -> text, code to run) of the section ``## <title>``."""
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    files, scripts = {}, []
    for lang, body in BLOCK.findall(text[start : end if end > 0 else None]):
        first = body.splitlines()[0]
        if first.startswith("# ") and first[2:].strip().endswith((".py", ".yaml")):
            files[first[2:].strip()] = body
        elif lang == "python":
            scripts.append(body)
    return files, scripts


@pytest.mark.parametrize(
    ("title", "files"),
    [
        ("Add an attention", {"my_attention.py"}),
        ("Add a task", {"mytask.py", "toy.yaml"}),
        ("Add a dataset", {"my_source.py"}),
    ],
)
def test_guide_runs_as_written(title, files, tmp_path):
    written, scripts = _guide(title)
    assert set(written) == files and scripts
    for name, body in written.items():
        (tmp_path / name).write_text(body)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PRIMALDUAL_DATA=str(tmp_path / "cache"))
    for script in scripts:
        r = subprocess.run(
            [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, f"{title}:\n{script}\n--- stderr:\n{r.stderr[-3000:]}"
