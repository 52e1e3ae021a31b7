"""Config composition on OmegaConf: where config files are found, and how a name becomes one mapping of values.

**Search path.** Names are looked up in, first to last: ``--config-dir DIR`` (when given), ``./configs`` (when the
working directory has one) and the configs shipped inside the package (``primaldual/configs``). Each file is looked
up on its own, as Hydra does, so a user's folder may hold a whole new family or just one new model file
(``configs/lra/_models/mine.yaml``) that composes with the shipped base and tasks.

**Names.** A file ``<name>.yaml`` (or a path) is a config; a *family* folder (one holding ``_base.yaml``) composes
the names ``<family>/<task>/[<budget>/]<model>`` from ``_base.yaml``, ``_tasks/<task>.yaml``,
``_models/<model>.yaml``, the optional ``_budgets/<budget>.yaml``, then the task file's ``models.<model>`` and
``budgets.<budget>`` entries. One form per group: a folder of files. Files and folders starting with ``_`` are
fragments: never run alone, never listed. Any file may build on others with a ``defaults:`` list (merged first, in
order; the file itself last).

**Values.** Files are parsed with ``yaml.safe_load`` (the YAML 1.1 scalars the configs were always read with) and
merged with ``OmegaConf.merge`` in its untyped mode (later wins; mappings merge key by key; lists and scalars are
replaced; nothing is converted, so ``"7"`` stays a string for the validators to refuse). ``${a.b}`` references and
``???`` (a value a later file must set) are OmegaConf's. ``vars:`` holds values that are only referenced. One rule
is the project's own: ``model.plan`` and ``model.attention`` are alternatives, so a file that sets one drops the
other. Command-line overrides are set before references are resolved, so a reference follows an overridden key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

__all__ = ["ComposeError", "Composition", "SearchPath", "compose"]

BASE, TASKS, MODELS, BUDGETS = "_base.yaml", "_tasks", "_models", "_budgets"
MAPS = {"models": MODELS, "budgets": BUDGETS}  # task-file maps: values per model / per budget
PLAN_KEYS = ("plan", "primal_options", "base", "base_options", "primal_layers")
PACKAGE_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class ComposeError(ValueError):
    """A config that cannot be found or composed; the message names the file and key."""


class SearchPath:
    """The folders names are looked up in, first wins: ``config_dir``, ``./configs``, the shipped configs."""

    def __init__(self, config_dir: str | os.PathLike | None = None) -> None:
        roots = []
        if config_dir is not None:
            if not Path(config_dir).is_dir():
                raise ComposeError(f"--config-dir: {config_dir} is not a directory")
            roots.append(Path(config_dir))
        if (Path.cwd() / "configs").is_dir():
            roots.append(Path.cwd() / "configs")
        roots.append(PACKAGE_CONFIGS)
        self.roots = list(dict.fromkeys(r.resolve() for r in roots))

    def find(self, rel: str | Path) -> Path | None:
        """The first file ``rel`` (relative to a root) on the search path."""
        return next((r / rel for r in self.roots if (r / rel).is_file()), None)

    def stems(self, folder: str | Path) -> list[str]:
        """The ``*.yaml`` stems of ``folder`` in every root."""
        return sorted({p.stem for r in self.roots if (r / folder).is_dir() for p in (r / folder).glob("*.yaml")})

    def show(self, path: Path) -> str:
        """A file as messages name it: relative to its root."""
        for r in self.roots:
            if path.resolve().is_relative_to(r):
                return path.resolve().relative_to(r).as_posix()
        return str(path)

    def is_fragment(self, path: Path) -> bool:
        return any(p.startswith("_") for p in Path(self.show(path)).parts) and self.show(path) != str(path)

    def families(self) -> list[str]:
        """Folders (relative) that hold a ``_base.yaml`` in some root."""
        out = set()
        for r in self.roots:
            for base in r.rglob(BASE):
                rel = base.parent.relative_to(r)
                if not any(p.startswith("_") for p in rel.parts):
                    out.add(rel.as_posix())
        return sorted(out)

    def names(self, family: str, folder: str) -> list[str]:
        return self.stems(f"{family}/{folder}")

    def files(self) -> Iterable[str]:
        """Names of the plain config files (no fragments)."""
        for r in self.roots:
            for p in r.rglob("*.yaml"):
                rel = p.relative_to(r)
                if not any(part.startswith("_") for part in rel.parts):
                    yield rel.with_suffix("").as_posix()


@dataclass(frozen=True)
class Composed:
    """A name with no file of its own: family base + task + model (+ budget overlay)."""

    name: str
    family: str
    task: str
    model: str
    budget: str | None

    @property
    def run_name(self) -> str:
        return self.model if self.budget is None else f"{self.model}_{self.budget}"


@dataclass
class Composition:
    """The result of :func:`compose`: plain values (references resolved), the files in merge order, and how to name
    the config in messages."""

    values: dict[str, Any]
    sources: list[str]
    origin: str


def lookup(spec: str, search: SearchPath) -> Path | Composed | None:
    """A file (a path, or a name on the search path, fragments included) or a composed name."""
    p = Path(spec).expanduser()
    if p.is_file():
        return p
    found = search.find(spec) or search.find(f"{spec}.yaml")
    return found if found is not None else composed_name(spec, search)


def composed_name(name: str, search: SearchPath) -> Composed | None:
    parts = name.strip("/").split("/")
    if any(not p or p.startswith("_") or p in (".", "..") for p in parts):
        return None
    for with_budget in (False, True):
        n = 3 + with_budget
        if len(parts) < n:
            continue
        family = "/".join(parts[: len(parts) - n + 1])
        task, model, budget = parts[-n + 1], parts[-1], parts[-2] if with_budget else None
        wanted = {TASKS: task, MODELS: model, **({BUDGETS: budget} if budget else {})}
        if search.find(f"{family}/{BASE}") and all(s in search.names(family, f) for f, s in wanted.items()):
            return Composed(name.strip("/"), family, task, model, budget)
    return None


def not_found(spec: str, search: SearchPath) -> ComposeError:
    hint = ""
    for fam in search.families():
        if spec.startswith(fam + "/") and len(spec.strip("/").split("/")) >= 3:
            names = {k: search.names(fam, f) for k, f in (("tasks", TASKS), ("models", MODELS), ("budgets", BUDGETS))}
            hint = f"; {fam}/<task>/[<budget>/]<model> is composed from " + ", ".join(
                f"{k} {v}" for k, v in names.items()
            )
    where = ", ".join(map(str, search.roots))
    return ComposeError(
        f"config {spec!r} not found (neither a file nor a name under {where}{hint}; see `primaldual configs`)"
    )


def read(path: Path) -> dict[str, Any]:
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ComposeError(f"{path}: not valid YAML: {e}") from None
    except OSError as e:
        raise ComposeError(f"{path}: cannot read: {e}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ComposeError(f"{path}: expected a mapping at the top level, got {type(values).__name__}")
    return values


class _Composer:
    """Merges the files of one spec, recording them (in merge order) for ``describe_config``.

    ``check(values, path, maps)`` is the schema check of one file's keys (the caller's: it knows the sections)."""

    def __init__(self, search: SearchPath, check: Any) -> None:
        self.search, self.check = search, check
        self.sources: list[str] = []
        self.named = False  # whether the file named on the command line sets ``name`` itself

    def file(self, path: Path, stack: tuple[str, ...], maps: tuple[str, ...] = ()) -> DictConfig:
        """A file's values merged over its ``defaults`` (recursively)."""
        key = self.search.show(path)
        stack = _enter(key, stack)
        raw = read(path)
        self.check(raw, path, maps, self.search.is_fragment(path))
        if len(stack) == 1:
            if not raw:  # a full default run (width 512, 100 epochs) is never what an empty file meant
                raise ComposeError(
                    f"{path}: empty (no keys); a config sets at least its task, or builds on one with defaults"
                )
            self.named = "name" in raw
        values = OmegaConf.create()
        for entry in raw.pop("defaults", None) or []:
            values = merge(values, self.entry(entry, path, stack))
        self.sources.append(key)
        return merge(values, raw)

    def entry(self, entry: str, including: Path, stack: tuple[str, ...]) -> DictConfig:
        """One ``defaults`` entry: a ``.yaml`` path relative to ``including``, or a config name."""
        if entry.endswith(".yaml"):
            p = Path(entry).expanduser()
            target: Path | Composed | None = p if p.is_absolute() else including.parent / p
            target = target if target.is_file() else None
        else:
            target = lookup(entry, self.search)
        if target is None:
            raise ComposeError(f"{including}: defaults entry {entry!r} not found (neither a file nor a config name)")
        if isinstance(target, Composed):
            return self.composed(target, stack)
        if target.parent.name == TASKS and (target.parent.parent / BASE).is_file():
            raise ComposeError(
                f"{including}: defaults entry {entry!r} is a task fragment, whose models/budgets maps apply only "
                "to composed names; include a name such as <family>/<task>/<model> instead"
            )
        return self.file(target, stack)

    def composed(self, c: Composed, stack: tuple[str, ...]) -> DictConfig:
        """Base, task, model, budget overlay, then the task's entries for this model and budget."""
        stack = _enter(c.name, stack)
        values = self.file(self.search.find(f"{c.family}/{BASE}"), stack)
        task_path = self.search.find(f"{c.family}/{TASKS}/{c.task}.yaml")
        task = self.file(task_path, stack, maps=tuple(MAPS))
        per = {k: task.pop(k, None) or {} for k in MAPS}
        values = merge(values, task)
        values = merge(values, self.file(self.search.find(f"{c.family}/{MODELS}/{c.model}.yaml"), stack))
        if c.budget is not None:
            values = merge(values, self.file(self.search.find(f"{c.family}/{BUDGETS}/{c.budget}.yaml"), stack))
        for key, name in (("models", c.model), ("budgets", c.budget)):
            known = self.search.names(c.family, MAPS[key])
            for entry in per[key]:
                if entry not in known:
                    raise ComposeError(f"{task_path}: {key}: unknown {key[:-1]} {entry!r}; expected one of {known}")
            if name is not None and per[key].get(name):
                values = merge(values, per[key][name])
                self.sources.append(f"{self.search.show(task_path)} ({key}.{name})")
        values["name"] = c.run_name
        return values


def _enter(key: str, stack: tuple[str, ...]) -> tuple[str, ...]:
    if key in stack:
        raise ComposeError(f"defaults cycle: {' -> '.join((*stack[stack.index(key) :], key))}")
    return (*stack, key)


def merge(into: DictConfig, new: dict[str, Any] | DictConfig) -> DictConfig:
    """``OmegaConf.merge`` plus the plan rule: a later ``model.plan`` drops ``model.attention`` (and the other way
    round). An empty section (``model:`` with nothing under it) changes nothing."""
    new = OmegaConf.create({k: v for k, v in _items(new) if not (v is None and (k == "vars" or k in _sections()))})
    model, incoming = into.get("model"), new.get("model")
    if isinstance(model, DictConfig) and isinstance(incoming, DictConfig):
        drop = ("attention", "attention_options") if "plan" in incoming else ()
        if not drop and {"attention", "attention_options"} & set(incoming.keys()):
            drop = PLAN_KEYS
        for k in drop:
            model.pop(k, None)
    return OmegaConf.merge(into, new)


def _items(d: dict[str, Any] | DictConfig) -> Iterable[tuple[str, Any]]:
    if isinstance(d, DictConfig):
        return ((k, d._get_node(k)) for k in d)  # nodes, so that ${...} and ??? are carried unresolved
    return d.items()


def _sections() -> tuple[str, ...]:
    return ("data", "model", "optim", "schedule", "trainer", "rl", "augment")


def compose(
    spec: str, search: SearchPath, check: Any, overrides: list[tuple[str, Any]] = (), known: Any = None
) -> Composition:
    """Merged, resolved values of a config file or name (see the module docstring).

    ``check(values, path, maps, fragment)``: the schema check of one file. ``overrides``: parsed ``(key, value)``
    pairs, set before references are resolved, where ``known(key)`` says the key exists (the rest is reported later,
    on the built config).
    """
    target = lookup(spec, search)
    if target is None:
        raise not_found(spec, search)
    composer = _Composer(search, check)
    if isinstance(target, Composed):
        values, label = composer.composed(target, ()), target.name
    else:
        if search.is_fragment(target):
            raise ComposeError(
                f"{spec!r} is a fragment ({search.show(target)}), a part of composed configs, not a runnable config; "
                "run a name from `primaldual configs`, e.g. <family>/<task>/<model>"
            )
        values, label = composer.file(target, ()), str(target)
        if not composer.named:  # a file's run name defaults to its stem
            values["name"] = target.stem
    origin = f"{label} (from {', '.join(composer.sources)})" if len(composer.sources) > 1 else label
    for key, value in overrides:
        if known is None or known(key):
            _set(values, key, value)
    missing_msg = "no value given (??? marks a value a task or model file must set)"
    try:
        plain = OmegaConf.to_container(values, resolve=True)
    except InterpolationToMissingValueError as e:
        raise ComposeError(f"{origin}: {e.full_key}: {missing_msg}") from None
    except OmegaConfBaseException as e:
        raise ComposeError(f"{origin}: {_message(e)}") from None
    plain.pop("vars", None)
    missing = _find_missing(plain)
    if missing is not None:
        raise ComposeError(f"{origin}: {missing}: {missing_msg}")
    return Composition(plain, composer.sources, origin)


def _set(values: DictConfig, key: str, value: Any) -> None:
    """Set dotted ``key`` in the merged, unresolved values, creating sections; a path through a non-mapping is left
    to the caller's later check."""
    node, parts = values, key.split(".")
    for part in parts[:-1]:
        if part not in node or node.get(part) is None:
            node[part] = {}
        if not isinstance(node.get(part), DictConfig):
            return
        node = node[part]
    node[parts[-1]] = value


def _find_missing(v: Any, at: str = "") -> str | None:
    """The first key of resolved values whose value is still ``???``."""
    if isinstance(v, str) and v == "???":
        return at
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        found = _find_missing(x, f"{at}[{k}]" if isinstance(v, list) else (f"{at}.{k}" if at else str(k)))
        if found is not None:
            return found
    return None


def _message(e: OmegaConfBaseException) -> str:
    msg = str(e).split("\n")[0]
    key = getattr(e, "full_key", None)
    return f"{key}: {msg}" if key and key not in msg else msg
