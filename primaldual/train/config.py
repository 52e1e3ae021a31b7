"""Run configuration: loaded from composed YAML, overridden from the command line, validated, written back.

A config has the sections ``data``, ``model``, ``optim``, ``schedule``, ``trainer`` (plus ``rl`` and ``augment``,
read only by the tasks that declare them) and the top-level keys ``name``, ``task``, ``protocol``, ``seed``.
``task`` names a registered task (:mod:`primaldual.tasks`), which checks its own part of the config
(:meth:`~primaldual.tasks.Task.check`); the generic checks here know no task by name. Overrides use dotted flags
(``--model.attention primal``, ``--trainer.max_epochs=5``, values parsed as YAML, never coerced) plus one
shortcut, ``--attention NAME``, that puts ``NAME`` in every layer and drops the mechanism options of the config
(they belong to the old mechanism).

Files are found and composed by :mod:`primaldual.train.compose` (OmegaConf; ``docs/configs.md``); this module
expands ``model.plan`` with the plan presets, builds the dataclasses of :mod:`primaldual.train.schema` (plain:
OmegaConf's typed mode would turn ``"7"`` into 7, which the validators of :mod:`primaldual.train.validate` refuse
instead) and applies the overrides. An unknown key (in a file or a flag) is an error that names the file and key
and lists the valid ones.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from ..models.plans import expand_plan
from ..utils.errors import ConfigError
from .compose import BUDGETS, MODELS, Composed, SearchPath, compose, lookup, not_found
from .compose import TASKS as TASK_FOLDER
from .schema import DataConfig, ModelConfig, OptimConfig, RunConfig, ScheduleConfig, TrainerConfig, config_class
from .validate import check_file, foreign_default, unknown_key, validate_config
from .yaml_values import override_value

__all__ = [
    "parse_overrides",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "apply_overrides",
    "search_path",
    "describe_config",
    "dump_config",
    "find_config",
    "list_configs",
    "load_config",
]


def _build(cls: type, values: dict[str, Any], where: str = "", task: Any = None) -> Any:
    """``cls`` (a run config class, or a section's at ``where``) from plain values; unknown keys are errors."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(values).__name__}")
    if not where:
        task = values.get("task", RunConfig.task)
        cls = config_class(task)  # the common sections plus the task's own keys
    valid = {f.name for f in fields(cls)}
    # another task's key at its default (an older config.yaml lists them) reads as absent
    values = {k: v for k, v in values.items() if k in valid or not foreign_default(where or k, k if where else None, v)}
    for key in values:
        if key not in valid:
            raise ConfigError(unknown_key(f"{where}.{key}" if where else key, task, valid))
    sections = cls.sections if not where else {}
    return cls(**{k: _build(sections[k], v or {}, k, task) if k in sections else v for k, v in values.items()})


def search_path(config_dir: str | os.PathLike | None = None) -> list[Path]:
    """The folders config names are looked up in, first wins: ``config_dir``, ``./configs``, the shipped configs."""
    return SearchPath(config_dir).roots


def _known_key(key: str, task: Any = None) -> bool:
    """Whether dotted ``key`` is a key of ``task``'s run config (the rest is reported by :func:`apply_overrides`)."""
    try:
        node: Any = config_class(task if task is not None else RunConfig.task)().to_dict()
    except ConfigError:  # an unknown task: reported when the config is built
        return False
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _compose(spec: str, overrides: list[tuple[str, Any]] = (), config_dir: str | os.PathLike | None = None):
    c = compose(str(spec), SearchPath(config_dir), check_file, overrides, _known_key)
    try:
        if isinstance(c.values.get("model"), dict):
            expand_plan(c.values["model"], ModelConfig.depth)
    except ConfigError as e:
        raise ConfigError(f"{c.origin}: {e}") from None
    return c


def list_configs(prefix: str = "", config_dir: str | os.PathLike | None = None) -> list[str]:
    """Names of the configs this CLI runs (files and composed names on the search path), no fragments."""
    search = SearchPath(config_dir)
    names, families = search.configs()
    for fam in families:
        budgets, models = [None, *search.names(fam, BUDGETS)], search.names(fam, MODELS)
        for task in search.names(fam, TASK_FOLDER):
            for model in models:
                names.update(f"{fam}/{task}/{b + '/' if b else ''}{model}" for b in budgets)
    return sorted(n for n in names if n.startswith(prefix))


def find_config(spec: str, config_dir: str | os.PathLike | None = None) -> Path:
    """The file of a config path or name (``uea/default``); for a composed name such as
    ``uea/JapaneseVowels/primalformer``, its task file (see :func:`describe_config` for every file it uses)."""
    search = SearchPath(config_dir)
    target = lookup(spec, search)
    if target is None:
        raise not_found(spec, search)
    return search.find(f"{target.family}/{TASK_FOLDER}/{target.task}.yaml") if isinstance(target, Composed) else target


def describe_config(spec: str | Path, config_dir: str | os.PathLike | None = None) -> list[str]:
    """The files a config is merged from, first to last (relative to their root on the search path); a task
    file's per-model / per-budget entry as ``lra/_tasks/listops.yaml (models.primal_plus)``."""
    return _compose(str(spec), config_dir=config_dir).sources


def parse_overrides(args: list[str]) -> list[tuple[str, Any]]:
    """``--a.b value`` / ``--a.b=value`` / ``--attention NAME`` flags as (key, value) pairs, values parsed as YAML."""
    pairs: list[tuple[str, Any]] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--"):
            raise ConfigError(f"unexpected argument {tok!r}; overrides look like --model.attention softmax")
        key, eq, val = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(f"override --{key} needs a value")
            val, i = args[i + 1], i + 1
        pairs.append((key, override_value(val, f"--{key}")))
        i += 1
    return pairs


def load_config(
    spec: str | Path | None = None, overrides: list[str] | None = None, config_dir: str | os.PathLike | None = None
) -> RunConfig:
    """Load a config file or name (``None``: all defaults), composing it from its fragments, and apply
    command-line overrides (before the file's ``${...}`` references are resolved, so references follow them).
    ``config_dir``: a folder searched before ``./configs`` and the shipped configs."""
    pairs = parse_overrides(overrides or [])
    if spec is None:
        cfg, rest = RunConfig(), pairs
    else:
        # the run config's own keys are set while composing (so that references follow them), once; the rest (the
        # --attention switch, unknown keys to report) on the built config
        c = _compose(str(spec), pairs, config_dir)
        try:
            cfg = _build(RunConfig, c.values)
        except (ConfigError, TypeError) as e:
            raise ConfigError(f"{c.origin}: {e}") from None
        rest = [(k, v) for k, v in pairs if not _known_key(k, dict(pairs).get("task", c.values.get("task")))]
    return validate_config(_apply(cfg, rest))


def apply_overrides(cfg: RunConfig, args: list[str]) -> RunConfig:
    """Apply ``--a.b value`` / ``--a.b=value`` / ``--attention NAME`` flags (values parsed as YAML)."""
    return _apply(cfg, parse_overrides(args))


def _apply(cfg: RunConfig, pairs: list[tuple[str, Any]]) -> RunConfig:
    if not pairs:
        return cfg
    d = cfg.to_dict()
    if (task := dict(pairs).get("task", d["task"])) != d["task"]:
        # another task: the old one's own keys go where they are at their defaults, the new one's come in at theirs
        type(cfg).drop_own_defaults(d)
        cls = config_class(task)
        new = cls().to_dict()
        for section, key in cls.added:
            if key is None:
                d.setdefault(section, new[section])
            else:
                d[section].setdefault(key, new[section][key])
    for key, value in pairs:
        if key == "attention":  # the one-flag switch to any registered mechanism
            d["model"]["attention"], d["model"]["attention_options"] = value, None
            d["name"] = f"{d['name']}-{value}" if isinstance(value, str) else d["name"]
            continue
        node, parts = d, key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ConfigError(unknown_key(key, d["task"], node, f" (from --{key}: {part!r} is not a section)"))
            node = node[part]
        if parts[-1] not in node:
            raise ConfigError(unknown_key(key, d["task"], node, f" (from --{key})"))
        node[parts[-1]] = value
    try:
        return _build(RunConfig, d)
    except (ConfigError, TypeError) as e:
        raise ConfigError(str(e)) from None


def dump_config(cfg: RunConfig) -> str:
    """YAML text of a resolved config (what the run directory stores): the task's keys, and ``trainer.compile`` /
    ``trainer.logger`` only when not at their defaults, so the stored configs of earlier runs read as they did."""
    d = cfg.to_dict()
    if not cfg.trainer.compile:
        d["trainer"].pop("compile")
    if cfg.trainer.logger == "csv":
        d["trainer"].pop("logger")
    return yaml.safe_dump(d, sort_keys=False)
