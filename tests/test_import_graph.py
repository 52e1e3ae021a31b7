"""The import graph of primaldual: no circle among its modules, lazy imports (inside functions) counted too, and the
runner's floor (``train/``) imports no task.

Every ``import`` / ``from ... import`` statement anywhere in a module is an edge, except those under ``if
TYPE_CHECKING:`` (type names, never executed). ``from pkg import name`` is an edge to ``pkg``, and to ``pkg.name``
too when that is a module. Modules loaded by name at run time (the task and data-source registries' built-ins, like
a plugin's entry point) are no edges: that is what keeps a registry under what it lists.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "primaldual"
TASKS = ("uea", "lra", "vision", "lm", "offline_rl")


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


class _Imports(ast.NodeVisitor):
    def __init__(self, package: list[str]) -> None:
        self.package, self.found = package, set()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(a.name for a in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self.package[: len(self.package) - node.level + 1] if node.level else []
        mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
        self.found.add(mod)
        self.found.update(f"{mod}.{a.name}" for a in node.names)


def graph() -> dict[str, set[str]]:
    """module -> the primaldual modules it imports (anywhere in the file)."""
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    out = {}
    for mod, path in files.items():
        visitor = _Imports(mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1])
        visitor.visit(ast.parse(path.read_text()))
        out[mod] = {m for m in visitor.found if m in files and m != mod}
    return out


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def _edges(g: dict[str, set[str]], comp: list[str]) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(g[m] & set(comp)))}" for m in comp)


def test_no_import_circle_among_primaldual_modules_lazy_imports_included():
    g = graph()
    found = circles(g)
    assert not found, "import circles:\n" + "\n".join(_edges(g, c) for c in found)


def test_circle_finder_sees_a_lazy_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(g) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_train_module_imports_a_task():
    g = graph()
    offenders = [
        f"{m} -> {d}"
        for m, deps in g.items()
        if m.startswith("primaldual.train")
        for d in deps
        if d.startswith(tuple(f"primaldual.tasks.{t}" for t in TASKS)) or d == "primaldual.tasks.classification"
    ]
    assert not offenders, offenders


def test_the_task_contract_sits_under_the_runner():
    # the registry and the protocol types import nothing from train/ or from a task package
    g = graph()
    for floor in ("primaldual.tasks", "primaldual.tasks.base", "primaldual.tasks.protocols"):
        bad = {d for d in g[floor] if d.startswith(("primaldual.train", *(f"primaldual.tasks.{t}" for t in TASKS)))}
        assert not bad, (floor, bad)
    assert {"primaldual.tasks.base"} <= g["primaldual.train.run"]


def test_every_task_is_a_package_with_its_task_module():
    for t in TASKS:
        assert (PACKAGE / "tasks" / t / "task.py").is_file(), t
    assert not [p.name for p in (PACKAGE / "train").glob("*.py") if p.stem in {"lm", "vision", "lra_data", "convert"}]


# docs/architecture.md's floors, bottom first: a module imports only from its own floor or the ones below. The
# package root re-exports the layers and models (the floor of integrations); modules named ``cli`` (the subcommands)
# sit on top.
FLOORS: list[tuple[str, ...]] = [
    ("options", "checks", "utils", "_version"),
    ("functional", "theory", "dropout", "kernels", "naive"),
    ("attention", "aux_loss"),
    ("encoder",),
    ("models",),
    ("integrations", "convert", ""),
    ("data", "rl"),
    ("recipes",),
    ("tasks.contract",),
    ("train",),
    ("tasks",),
    ("analysis", "bench"),
]


def _floor(module: str) -> int | None:
    """The floor of a primaldual module; None for the ``cli`` modules (the top)."""
    parts = module.split(".")[1:]
    if parts and parts[-1] == "cli":
        return None
    name = parts[0] if parts else ""
    if name == "tasks" and (len(parts) == 1 or parts[1] in ("base", "protocols")):
        name = "tasks.contract"  # the registry package, its contract and protocols
    for i, floor in enumerate(FLOORS):
        if name in floor:
            return i
    raise AssertionError(f"{module}: on no floor of docs/architecture.md; add its folder to FLOORS")


def test_every_import_goes_to_the_same_floor_or_below():
    g = graph()
    upward = [
        f"{mod} -> {dep}"
        for mod, deps in g.items()
        if (here := _floor(mod)) is not None
        for dep in deps
        if (there := _floor(dep)) is None or there > here
    ]
    assert not upward, "imports that go up a floor:\n" + "\n".join(sorted(upward))
