"""The runner knows no task by name, and the runner and the task modules form no import cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "primaldual"


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """The primaldual modules ``path`` imports (module level, or anywhere)."""
    tree = ast.parse(path.read_text())
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:  # `from . import x` may import a module
                out.add(f"{mod}.{alias.name}")
            out.add(mod)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("primaldual")}


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {i for i in _imports(p, top_level_only) if i in files} for m, p in files.items()}


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return False


def test_no_task_module_imports_the_runner_and_the_runner_imports_no_task_module():
    anywhere = _graph(top_level_only=False)
    tasks = [m for m in anywhere if m.startswith("primaldual.tasks.") and m.endswith(".task")]
    assert len(tasks) == 5, tasks
    for t in tasks:
        assert not _reaches(anywhere, t, "primaldual.train.run"), t
        assert t not in anywhere["primaldual.train.run"]


def test_no_import_cycle_through_the_runner_or_a_task_module():
    graph = _graph(top_level_only=True)
    for m in [m for m in graph if m.startswith("primaldual.tasks") or m == "primaldual.train.run"]:
        for dep in graph[m]:
            assert not _reaches(graph, dep, m), f"{m} -> {dep} -> ... -> {m}"


def test_no_task_name_branches_outside_the_task_modules():
    # a task compared with a name (``cfg.task == "uea"``, ``task in ("lm", ...)``), or a task constant
    pattern = re.compile(r"""task\s*(==|!=)\s*["'A-Z]|task\s+(not\s+)?in\s+[(\[{]?["'A-Z]|\b[A-Z]+_TASKS?\b""")
    offenders = [
        f"{p.relative_to(PACKAGE.parent)}:{i}"
        for p in PACKAGE.rglob("*.py")
        if "tasks" not in p.relative_to(PACKAGE).parts[:1]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders
