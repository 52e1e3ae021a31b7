"""docs/configs.md's table of the keys only some tasks read is the task registry's (``exclusive_keys``)."""

from __future__ import annotations

import re
from pathlib import Path

from primaldual.tasks import list_tasks
from primaldual.tasks.base import exclusive_keys

DOC = Path(__file__).resolve().parents[1] / "docs" / "configs.md"


def table() -> str:
    """The Markdown rows: ``| `section.key` | tasks |``, the five LRA tasks written ``lra_*`` when all read it."""
    lra = {t for t in list_tasks() if t.startswith("lra_")}
    rows = []
    for (section, key), owners in sorted(exclusive_keys().items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        rest = set(owners)
        names = []
        if lra <= rest:
            names, rest = ["lra_*"], rest - lra
        rows.append(f"| `{section}{'.' + key if key else ''}` | {', '.join(names + sorted(rest))} |")
    return "\n".join(rows)


def test_the_docs_table_is_the_registry():
    text = DOC.read_text()
    body = re.search(
        r"<!-- task-keys:start -->\n\| section or key .*?\n\|---\|---\|\n(.*?)\n<!-- task-keys:end -->", text, re.S
    )
    assert body, "docs/configs.md: the task-keys table is missing"
    assert body.group(1) == table(), "docs/configs.md is stale; write this table there:\n" + table()
