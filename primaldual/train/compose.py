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

**Values.** Files are parsed with :func:`~primaldual.train.yaml_values.load_yaml` (the safe loader's YAML 1.1 scalars,
plus floats spelled ``1e-3``; duplicate keys and alias bombs refused) and
merged with ``OmegaConf.merge`` in its untyped mode (later wins; mappings merge key by key; lists and scalars are
replaced; nothing is converted, so ``"7"`` stays a string for the validators to refuse). ``${a.b}`` references and
``???`` (a value a later file must set) are OmegaConf's. ``vars:`` holds values that are only referenced. One rule
is the project's own: ``model.plan`` and ``model.attention`` are alternatives, so a file that sets one drops the
other. Command-line overrides are set before references are resolved, so a reference follows an overridden key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

from ..models.plans import PLAN_KEYS
from ..utils.errors import ConfigError
from .yaml_values import load_yaml

__all__ = ["Composition", "SearchPath", "compose"]

BASE, TASKS, MODELS, BUDGETS = "_base.yaml", "_tasks", "_models", "_budgets"
MAPS = {"models": MODELS, "budgets": BUDGETS}  # task-file maps: values per model / per budget
PACKAGE_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class SearchPath:
    """The folders names are looked up in, first wins: ``config_dir``, ``./configs``, the shipped configs."""

    def __init__(self, config_dir: str | os.PathLike | None = None) -> None:
        if config_dir is not None and not Path(config_dir).is_dir():
            raise ConfigError(f"--config-dir: {config_dir} is not a directory")
        roots = [Path(config_dir)] if config_dir is not None else []
        roots += [Path.cwd() / "configs"] if (Path.cwd() / "configs").is_dir() else []
        self.roots = list(dict.fromkeys(r.resolve() for r in [*roots, PACKAGE_CONFIGS]))

    def find(self, rel: str) -> Path | None:
        """The first file ``rel`` (relative to a root) on the search path."""
        return next((r / rel for r in self.roots if (r / rel).is_file()), None)

    def names(self, family: str, folder: str) -> list[str]:
        """The parts of a family's group folder (``_tasks``, ``_models``, ``_budgets``), over every root."""
        return sorted({p.stem for r in self.roots for p in (r / family / folder).glob("*.yaml")})

    def show(self, path: Path) -> str:
        """A file as messages name it: relative to its root."""
        root = next((r for r in self.roots if path.resolve().is_relative_to(r)), None)
        return path.resolve().relative_to(root).as_posix() if root else str(path)

    def is_fragment(self, path: Path) -> bool:
        rel = self.show(path)
        return rel != str(path) and any(p.startswith("_") for p in Path(rel).parts)

    def configs(self) -> tuple[set[str], set[str]]:
        """The plain config files (names, no fragments) and the families (folders holding ``_base.yaml``)."""
        files, families = set(), set()
        for r in self.roots:
            for p in r.rglob("*.yaml"):
                rel = p.relative_to(r)
                if not any(part.startswith("_") for part in rel.parts):
                    files.add(rel.with_suffix("").as_posix())
                elif p.name == BASE and not any(part.startswith("_") for part in rel.parent.parts):
                    families.add(rel.parent.as_posix())
        return files, families


@dataclass(frozen=True)
class Composed:
    """A name with no file of its own: family base + task + model (+ budget overlay)."""

    name: str
    family: str
    task: str
    model: str
    budget: str | None


@dataclass
class Composition:
    """What :func:`compose` returns: plain values (references resolved), the files in merge order, a label."""

    values: dict[str, Any]
    sources: list[str]
    origin: str


def lookup(spec: str, search: SearchPath) -> Path | Composed | None:
    """A file (a path, or a name on the search path, fragments included) or a composed name."""
    if Path(spec).expanduser().is_file():
        return Path(spec).expanduser()
    found = search.find(spec) or search.find(f"{spec}.yaml")
    parts = spec.strip("/").split("/")
    if found is not None or any(not p or p.startswith("_") or p in (".", "..") for p in parts):
        return found
    for n in (3, 4):  # <family>/<task>/<model>, then <family>/<task>/<budget>/<model>
        if len(parts) >= n:
            family, task, model = "/".join(parts[: len(parts) - n + 1]), parts[-n + 1], parts[-1]
            budget = parts[-2] if n == 4 else None
            wanted = {TASKS: task, MODELS: model, **({BUDGETS: budget} if budget else {})}
            if search.find(f"{family}/{BASE}") and all(x in search.names(family, f) for f, x in wanted.items()):
                return Composed(spec.strip("/"), family, task, model, budget)
    return None


def not_found(spec: str, search: SearchPath) -> ConfigError:
    hint = ""
    for fam in sorted(search.configs()[1]):
        if spec.startswith(fam + "/") and spec.count("/") >= 2:
            parts = ", ".join(f"{f[1:]} {search.names(fam, f)}" for f in (TASKS, MODELS, BUDGETS))
            hint = f"; {fam}/<task>/[<budget>/]<model> is composed from {parts}"
    where = ", ".join(map(str, search.roots))
    return ConfigError(
        f"config {spec!r} not found (neither a file nor a name under {where}{hint}; see `primaldual configs`)"
    )


def read(path: Path) -> dict[str, Any]:
    try:
        values = load_yaml(path.read_text())
    except (yaml.YAMLError, OSError) as e:
        what = "not valid YAML" if isinstance(e, yaml.YAMLError) else "cannot read"
        raise ConfigError(f"{path}: {what}: {e}") from None
    if not isinstance(values, dict | None):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(values).__name__}")
    return values or {}


class _Composer:
    """Merges the files of one spec, recording them (in merge order); ``check(values, path, maps, fragment)`` is the
    caller's schema check of one file."""

    def __init__(self, search: SearchPath, check: Callable[..., None]) -> None:
        self.search, self.check, self.sources, self.named = search, check, [], False
        self.files: list[tuple[dict[str, Any], Path, tuple[str, ...], bool]] = []  # for the keys check, once composed

    def file(self, path: Path, stack: tuple[str, ...], maps: tuple[str, ...] = ()) -> DictConfig:
        """A file's values merged over its ``defaults`` (recursively)."""
        key = self.search.show(path)
        stack = _enter(key, stack)
        raw = read(path)
        fragment = self.search.is_fragment(path)
        self.check(raw, path, maps, fragment, None)  # shapes now; keys once the task is known
        self.files.append((dict(raw), path, maps, fragment))
        if len(stack) == 1:
            if not raw:  # a full default run (width 512, 100 epochs) is never what an empty file meant
                raise ConfigError(f"{path}: empty (no keys); a config sets its task, or builds on one with defaults")
            self.named = "name" in raw
        values = OmegaConf.create()
        for entry in raw.pop("defaults", None) or []:
            values = merge(values, self.entry(entry, path, stack))
        self.sources.append(key)
        return merge(values, raw)

    def entry(self, entry: str, including: Path, stack: tuple[str, ...]) -> DictConfig:
        """One ``defaults`` entry: a ``.yaml`` path relative to ``including``, or a config name."""
        target = (
            lookup(entry, self.search) if not entry.endswith(".yaml") else including.parent / Path(entry).expanduser()
        )
        if target is None or (isinstance(target, Path) and not target.is_file()):
            raise ConfigError(f"{including}: defaults entry {entry!r} not found (neither a file nor a config name)")
        if isinstance(target, Composed):
            return self.composed(target, stack)
        if target.parent.name == TASKS and (target.parent.parent / BASE).is_file():
            raise ConfigError(
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
        for folder, name in ((MODELS, c.model), (BUDGETS, c.budget)):
            if name is not None:
                values = merge(values, self.file(self.search.find(f"{c.family}/{folder}/{name}.yaml"), stack))
        for key, name in (("models", c.model), ("budgets", c.budget)):
            known = self.search.names(c.family, MAPS[key])
            if unknown := [e for e in per[key] if e not in known]:
                raise ConfigError(f"{task_path}: {key}: unknown {key[:-1]} {unknown[0]!r}; expected one of {known}")
            if name is not None and per[key].get(name):
                values = merge(values, per[key][name])
                self.sources.append(f"{self.search.show(task_path)} ({key}.{name})")
        values["name"] = c.model if c.budget is None else f"{c.model}_{c.budget}"
        return values


def _enter(key: str, stack: tuple[str, ...]) -> tuple[str, ...]:
    if key in stack:
        raise ConfigError(f"defaults cycle: {' -> '.join((*stack[stack.index(key) :], key))}")
    return (*stack, key)


def merge(into: DictConfig, new: dict[str, Any] | DictConfig) -> DictConfig:
    """``OmegaConf.merge`` plus two rules of the project: an empty section (``model:`` with nothing under it)
    changes nothing, and a later ``model.plan`` drops ``model.attention`` (and the other way round)."""
    new = OmegaConf.create(new)
    raw = OmegaConf.to_container(new, resolve=False)  # None without resolving a reference (public API only)
    for k in [k for k, v in raw.items() if v is None and isinstance(into.get(k), DictConfig)]:
        new.pop(k)
    if isinstance(incoming := new.get("model"), DictConfig):
        drop_alternatives(into, incoming.keys(), incoming.get("plan"))
    return OmegaConf.merge(into, new)


def drop_alternatives(values: DictConfig, incoming: Iterable[str], plan: Any = None) -> list[str]:
    """Before ``model`` keys ``incoming`` are set: ``plan`` drops ``attention`` / ``attention_options`` from
    ``values.model`` (and, to ``primalformer``, ``primal_plus``'s own keys), and either of those drops the plan's
    keys (files and overrides follow the same rule). Returns the names dropped."""
    model, incoming = values.get("model"), set(incoming)
    if not isinstance(model, DictConfig):
        return []
    if "plan" in incoming:
        drop = ["attention", "attention_options", *(PLAN_KEYS[2:] if plan == "primalformer" else ())]
    else:
        drop = list(PLAN_KEYS) if {"attention", "attention_options"} & incoming else []
    return [k for k in drop if k not in incoming and model.pop(k, "-") != "-"]


def compose(
    spec: str,
    search: SearchPath,
    check: Callable[..., None],
    overrides: Callable[[DictConfig], None] = lambda values: None,
) -> Composition:
    """Merged, resolved values of a config file or name. ``check(values, path, maps, fragment, task)`` checks one
    file: its shapes while merging (``task`` None), then its keys against the composed config's ``task``.
    ``overrides(values)`` sets the command line's values on the merged ones, before references are resolved."""
    target = lookup(spec, search)
    if target is None:
        raise not_found(spec, search)
    composer = _Composer(search, check)
    if isinstance(target, Composed):
        values, label = composer.composed(target, ()), target.name
    elif search.is_fragment(target):
        raise ConfigError(
            f"{spec!r} is a fragment ({search.show(target)}), a part of composed configs, not a runnable config; "
            "run a name from `primaldual configs`, e.g. <family>/<task>/<model>"
        )
    else:
        values, label = composer.file(target, ()), str(target)
        if not composer.named:  # a file's run name defaults to its stem
            values["name"] = target.stem
    origin = f"{label} (from {', '.join(composer.sources)})" if len(composer.sources) > 1 else label
    missing = "no value given (??? marks a value a task or model file must set)"
    try:
        overrides(values)
        plain = OmegaConf.to_container(values, resolve=True)
    except InterpolationToMissingValueError as e:
        raise ConfigError(f"{origin}: {e.full_key}: {missing}") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{origin}: {key + ': ' if key else ''}{str(e).splitlines()[0]}") from None
    plain.pop("vars", None)  # values only referenced: one still ??? is never needed
    if (at := _find_missing(plain)) is not None:  # resolved: a reference to ??? is ??? here
        raise ConfigError(f"{origin}: {at}: {missing}")
    for raw, path, maps, fragment in composer.files:
        check(raw, path, maps, fragment, plain.get("task"))
    return Composition(plain, composer.sources, origin)


def _find_missing(v: Any, at: str = "") -> str | None:
    """The first key (in file order) of resolved values whose value is still ``???``."""
    if isinstance(v, str) and v == "???":
        return at
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        if (found := _find_missing(x, f"{at}[{k}]" if isinstance(v, list) else f"{at}.{k}".lstrip("."))) is not None:
            return found
    return None
