"""docs/integrations.md runs as written: its python blocks are executed in order in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def test_integrations_doc_runs_as_written(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer snippet
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 8
    namespace: dict = {"__name__": "integrations_doc"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{DOC.name}[block {i}]", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message names the failing block
            raise AssertionError(f"python block {i} of {DOC.name} failed: {err!r}") from err
