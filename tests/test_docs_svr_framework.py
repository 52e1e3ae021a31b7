"""docs/svr_framework.md runs as written: its python blocks are executed in order in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "svr_framework.md"


def test_svr_framework_doc_runs_as_written():
    pytest.importorskip("clarabel")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 6
    namespace: dict = {"__name__": "svr_framework_doc"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{DOC.name}[block {i}]", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message names the failing block
            raise AssertionError(f"python block {i} of {DOC.name} failed: {err!r}") from err
