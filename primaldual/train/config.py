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
from omegaconf import DictConfig, OmegaConf

from ..models.plans import PLAN_KEYS, expand_plan
from ..utils.errors import ConfigError
from .compose import BUDGETS, MODELS, SearchPath, compose, drop_alternatives
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


def _compose(spec: str, pairs: list[tuple[str, Any]] = (), config_dir: str | os.PathLike | None = None):
    def overrides(values: DictConfig) -> None:
        set_overrides(values, pairs, dict(pairs).get("task", values.get("task")))

    c = compose(str(spec), SearchPath(config_dir), check_file, overrides)
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


def _expanded(args: list[str] | None) -> list[tuple[str, Any]]:
    """:func:`parse_overrides`, with ``--attention NAME`` as ``model.attention`` NAME and ``model.attention_options``
    null (they were the old mechanism's), kept too: the run is renamed ``<name>-NAME`` once built."""
    out: list[tuple[str, Any]] = []
    for key, value in parse_overrides(args or []):
        out += [("model.attention", value), ("model.attention_options", None)] if key == "attention" else []
        out.append((key, value))
    return out


def set_overrides(values: DictConfig, pairs: list[tuple[str, Any]], task: Any) -> None:
    """Set ``(dotted key, value)`` pairs on config values, each key checked against ``task``'s schema (deeper keys
    only where the values hold a mapping; a whole section's mapping merged key by key, as files are);
    ``model.plan`` and ``model.attention`` replace each other, as in files, and a flag that would undo an earlier
    one is an error."""
    try:
        schema = config_class(task)().to_dict()
        schema["model"].update(dict.fromkeys(PLAN_KEYS))
    except ConfigError:  # an unknown task: reported when the config is built
        schema = None
    flat: list[tuple[str, Any]] = []
    for key, value in pairs:  # --optim '{lr: 0.1}' is --optim.lr 0.1
        if schema is not None and isinstance(schema.get(key), dict):
            if not isinstance(value, dict):
                raise ConfigError(f"--{key}: a section; expected a mapping of its keys, got {value!r}")
            flat += [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            flat.append((key, value))
    model = values.get("model")
    keys = {k for k, _ in flat}
    plan = isinstance(model, DictConfig) and "plan" in model
    if plan and "model.attention_options" in keys and "model.attention" not in keys:
        raise ConfigError(
            "--model.attention_options: this config sets model.plan; change the plan's options with "
            "--model.primal_options, or give --model.attention as well (it replaces the plan)"
        )
    done: list[str] = []
    for key, value in flat:
        if key == "attention":  # the switch's rename, done on the built config
            continue
        node, parts = schema, key.split(".")
        for i, part in enumerate(parts if schema is not None else ()):
            if not isinstance(node, dict):
                at = ".".join(parts[:i])
                if isinstance(here := OmegaConf.select(values, at), DictConfig):
                    break  # inside a mapping value, such as model.attention_options.s
                raise ConfigError(
                    f"--{key}: {at} is {'null' if here is None else 'not a mapping'} here; set it whole (--{at} ...)"
                )
            if part not in node:
                raise ConfigError(unknown_key(key, task, node, f" (from --{key})"))
            node = node[part]
        dropped = drop_alternatives(values, parts[1:], value) if parts[0] == "model" and len(parts) == 2 else []
        undone = [d for d in done if d.startswith(f"{key}.") or any(d.startswith(f"model.{x}") for x in dropped)]
        if undone:
            raise ConfigError(f"--{key} undoes --{undone[0]} given before it; give one of them")
        OmegaConf.update(values, key, value, merge=False, force_add=True)
        done.append(key)


def load_config(
    spec: str | Path | None = None, overrides: list[str] | None = None, config_dir: str | os.PathLike | None = None
) -> RunConfig:
    """Load a config file or name (``None``: all defaults), composing it from its fragments, and apply
    command-line overrides (before the file's ``${...}`` references are resolved, so references follow them).
    ``config_dir``: a folder searched before ``./configs`` and the shipped configs."""
    pairs = _expanded(overrides)
    if spec is None:
        return validate_config(_with(RunConfig(), pairs))
    c = _compose(str(spec), pairs, config_dir)
    try:
        cfg = _build(RunConfig, c.values)
    except ConfigError as e:
        raise ConfigError(f"{c.origin}: {e}") from None
    return validate_config(_renamed(cfg, pairs))


def apply_overrides(cfg: RunConfig, args: list[str]) -> RunConfig:
    """``cfg`` with ``--a.b value`` / ``--a.b=value`` / ``--attention NAME`` flags applied (values parsed as YAML)."""
    return _with(cfg, _expanded(args))


def _with(cfg: RunConfig, pairs: list[tuple[str, Any]]) -> RunConfig:
    if not pairs:
        return cfg
    d = cfg.to_dict()
    if (task := dict(pairs).get("task", cfg.task)) != cfg.task:
        type(cfg).drop_own_defaults(d)  # the old task's keys at their defaults go; the new one's come in at theirs
    values = OmegaConf.create(d)
    set_overrides(values, pairs, task)
    d = OmegaConf.to_container(values, resolve=False)  # verbatim: nothing here is a reference
    expand_plan(d["model"], ModelConfig.depth)
    return _renamed(_build(RunConfig, d), pairs)


def _renamed(cfg: RunConfig, pairs: list[tuple[str, Any]]) -> RunConfig:
    """After ``--attention NAME``: the run is ``<name>-NAME``."""
    for key, value in pairs:
        if key == "attention" and isinstance(value, str):
            cfg.name = f"{cfg.name}-{value}"
    return cfg


def dump_config(cfg: RunConfig) -> str:
    """YAML text of a resolved config (what the run directory stores): the task's keys, and ``trainer.compile`` /
    ``compile_mode`` / ``logger`` only when not at their defaults, so the stored configs of earlier runs read as they
    did."""
    d = cfg.to_dict()
    if not cfg.trainer.compile:
        d["trainer"].pop("compile")
    if cfg.trainer.compile_mode == "default":
        d["trainer"].pop("compile_mode")
    if cfg.trainer.logger == "csv":
        d["trainer"].pop("logger")
    return yaml.safe_dump(d, sort_keys=False)
