"""The task registry: ``register_task(name)`` and the :class:`Task` protocol the generic runner drives.

Modelled on the attention registry: a task is a class registered under one or more names (the config's ``task``);
the runner (:mod:`primaldual.train.run`) and the config validator know no task by name, they ask the task. A task
says what its config may hold and checks it (:meth:`Task.check`), builds its data module, model and Lightning
module, names its selection protocol, and turns a finished fit into the result it reports (:meth:`Task.results`,
:meth:`Task.report`). Every task is trained by the same runner: one whose evaluation is not a pass over examples
(offline RL: rollouts) does it in its Lightning module's validation step. A classifier subclasses
:class:`~primaldual.tasks.classification.ClassificationTask`, which supplies the module, results and report.

This module is the contract's floor, under the runner: it imports nothing from :mod:`primaldual.train` or from a
task package, and loads the built-in tasks by name (``_BUILTIN``) as it loads a plugin's entry point.

Registering and validating never import Lightning: the built-in tasks import their Lightning parts inside the
methods that build them, so loading or checking a config stays fast. A task of your own can keep everything in one
file (``docs/architecture.md``, "Add a task").
"""

from __future__ import annotations

import importlib
from dataclasses import fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..utils.errors import ConfigError
from .protocols import PROTOCOLS, Protocol

if TYPE_CHECKING:
    from torch import nn

    from ..train.config import RunConfig  # a type name only: the contract imports nothing from train at run time

__all__ = ["Task", "get_protocol", "get_task", "list_tasks", "register_task"]

_REGISTRY: dict[str, Task] = {}
#: the sections every task's run config has (:mod:`primaldual.train.schema`); a task adds keys to them or sections of
#: its own (:attr:`Task.config`)
COMMON_SECTIONS = ("data", "model", "optim", "schedule", "trainer")
# the built-in tasks: name -> the module that registers it, imported on first use by name (as a plugin's entry point
# is), so the registry imports no task and importing primaldual.tasks stays cheap
_BUILTIN = {
    "uea": "uea.task",
    "lra_listops": "lra.task",
    "lra_text": "lra.task",
    "lra_retrieval": "lra.task",
    "lra_image": "lra.task",
    "lra_pathfinder": "lra.task",
    "lm": "lm.task",
    "offline_rl": "offline_rl.task",
    "vision": "vision.task",
}


class Task:
    """What the runner and the config validator need from a task. Subclass it and register the subclass.

    Class attributes:
        model_kinds: the ``model.kind`` values the task builds; the first is what ``auto`` means.
        causal: every attention layer is causal (the config must not set ``causal`` itself).
        step_based: the run is counted in optimiser steps (``trainer.max_steps > 0`` required); else epochs.
        protocols: the ``protocol`` values it accepts.
        config: what the task adds to the run config: ``{section: dataclass or tuple of dataclasses}`` for a section
            of its own (offline RL's ``rl``) or for keys it adds to one of :data:`COMMON_SECTIONS` (``data.fetch``,
            a plugin's ``data.my_key``); the fields' defaults are the keys' defaults. The task's :meth:`check` checks
            them (:mod:`primaldual.tasks.checks` holds the keys several tasks read, and their checks). A key no task
            declaration covers is unknown in the task's configs.
        compiles: whether ``trainer.compile`` applies.
        example_splits: the data module's ``datasets`` hold the examples of each split (``analyze`` and ``bench
            steps`` feed them to the model); ``False`` for data evaluated otherwise (offline RL: rollouts).
        metrics: the per-evaluation metrics of ``history.csv`` per evaluated split (:meth:`history_metrics`).
        majority_baseline: (:class:`~primaldual.tasks.classification.ClassificationTask`) the summary records the
            data's ``info`` and the majority-class test accuracy.
    """

    name: str = ""
    model_kinds: tuple[str, ...] = ()
    causal: bool = False
    step_based: bool = True
    protocols: tuple[str, ...] = ("heldout",)
    config: dict[str, Any] = {}
    compiles: bool = True
    example_splits: bool = True
    metrics: tuple[str, ...] = ("loss", "acc")
    majority_baseline: bool = False

    # --- config ------------------------------------------------------------------------------------------------
    def check(self, cfg: RunConfig) -> None:
        """Task-specific checks of a config (the generic ones have passed); raise :class:`ConfigError`."""

    def protocol(self, name: str) -> Protocol:
        """The selection protocol ``name`` (one of :attr:`protocols`)."""
        return PROTOCOLS[name]

    def history_metrics(self, cfg: RunConfig) -> tuple[str, ...]:
        """The metrics ``history.csv`` records per evaluated split (``<split>/<metric>``); default :attr:`metrics`."""
        return self.metrics

    # --- building ----------------------------------------------------------------------------------------------
    def datamodule(self, cfg: RunConfig) -> Any:
        """The Lightning data module (not yet set up)."""
        raise NotImplementedError(f"task {self.name!r} has no data module")

    def model(self, cfg: RunConfig, dm: Any) -> nn.Module:
        """The task model of ``cfg.model``, sized from the set-up data module."""
        raise NotImplementedError(f"task {self.name!r} has no model")

    def module(self, cfg: RunConfig, dm: Any) -> Any:
        """The Lightning module: the model with its loss, optimiser and schedule
        (:class:`~primaldual.tasks.classification.ClassificationTask` gives the classification one)."""
        raise NotImplementedError(f"task {self.name!r} has no Lightning module")

    def example_inputs(self, dm: Any) -> list[Any]:
        """One batch of the model's inputs (``trainer.compile`` checks the compiled model on it): by default the
        first validation batch without its last element (the targets)."""
        return list(next(iter(dm.val_dataloader()[0]))[:-1])

    def describe_data(self, cfg: RunConfig, dm: Any) -> str:
        """The data's part of the line ``fit`` prints before training."""
        n = dm.sizes
        return f"{cfg.data.name} train/val/test {n.get('train', 0)}/{n.get('val', 0)}/{n['test']}"

    def on_run_dir(self, cfg: RunConfig, dm: Any, run_dir: Path) -> None:
        """Called once the run directory is prepared (before training), in the launching process only."""

    # --- results -----------------------------------------------------------------------------------------------
    def results(
        self, cfg: RunConfig, dm: Any, module: Any, protocol: Protocol, best: dict[str, Any], test: dict | None
    ) -> dict[str, Any]:
        """The task's part of ``summary.json``. ``best``: the history row the protocol selected; ``test``: the
        metrics of the selected checkpoint on test (None when the protocol evaluates test every epoch)."""
        raise NotImplementedError(f"task {self.name!r} reports no results")

    def report(self, cfg: RunConfig, summary: dict[str, Any], protocol: Protocol) -> str:
        """The lines ``fit`` prints at the end."""
        raise NotImplementedError(f"task {self.name!r} has no report")

    # --- the seeds table (primaldual seeds) -------------------------------------------------------------------
    table_title: str = "Test accuracy (%)"

    def table_value(self, summary: dict[str, Any]) -> float:
        """The number a summary contributes to the mean +- std table."""
        return 100 * summary["test_acc"]

    def table_column(self, protocol: str) -> str:
        """The column heading of a protocol."""
        return self.protocol(protocol).label

    def table_notes(self, summaries: list[dict[str, Any]]) -> list[str]:
        """Lines printed under the table."""
        return []

    def __repr__(self) -> str:
        return f"<task {self.name!r}: {type(self).__module__}.{type(self).__qualname__}>"


def register_task(*names: str):
    """Class decorator: register a :class:`Task` subclass under each of ``names`` (one instance per name)."""
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"register_task: expected one or more non-empty names, got {names!r}")

    def deco(cls: type[Task]) -> type[Task]:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"register_task: {cls!r} is not a subclass of primaldual.tasks.Task")
        if not cls.model_kinds:
            raise ValueError(f"register_task: {cls.__name__}.model_kinds is empty; name the model kinds it builds")
        for name in names:
            old = _REGISTRY.get(name)
            if old is not None and type(old).__qualname__ != cls.__qualname__:
                raise ValueError(f"task name {name!r} is already registered to {old!r}")
            task = cls()
            task.name = name
            _REGISTRY[name] = task
        return cls

    return deco


def unregister_task(name: str) -> None:
    """Remove a task registered at run time (tests, notebooks); built-in tasks come back on their next use."""
    _REGISTRY.pop(name, None)


@cache  # the installed distributions' metadata is scanned once per process
def _plugins() -> dict[str, Any]:
    """Tasks other packages declare: entry points of the group ``primaldual.tasks`` (name -> the module or class
    that registers it), so that ``primaldual fit`` finds them without an import of yours."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group="primaldual.tasks")}


def get_task(name: str) -> Task:
    """The task registered as ``name``; :class:`ConfigError` naming the registered ones otherwise."""
    if isinstance(name, str) and name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(f"{__package__}.{_BUILTIN[name]}")
    if isinstance(name, str) and name not in _REGISTRY and name in (plugins := _plugins()):
        try:
            plugins[name].load()
        except Exception as err:  # noqa: BLE001 - any failure of someone else's module: named, for this task only
            ep = plugins[name]
            raise ConfigError(
                f"task {name!r}: its plugin ({getattr(ep, 'value', type(ep).__name__)}) failed to load: "
                f"{type(err).__name__}: {err}"
            ) from None
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ConfigError(f"task: expected one of {tuple(list_tasks())}, got {name!r}")
    return _REGISTRY[name]


def list_tasks() -> list[str]:
    """Every registered task name (the built-in ones included)."""
    for module in sorted(set(_BUILTIN.values())):
        importlib.import_module(f"{__package__}.{module}")
    return sorted({*_REGISTRY, *_plugins()})


def config_parts(task: Task) -> dict[str, tuple[type, ...]]:
    """``task.config`` with every value a tuple of dataclasses; :class:`TypeError` naming the task otherwise."""
    out = {}
    for name, given in task.config.items():
        parts = given if isinstance(given, tuple) else (given,)
        if not (isinstance(name, str) and parts and all(is_dataclass(c) and isinstance(c, type) for c in parts)):
            raise TypeError(
                f"task {task.name!r}: config maps a section name to a dataclass (or a tuple of them), got "
                f"{name!r}: {given!r}"
            )
        out[name] = parts
    return out


def exclusive_keys(task: str | None = None) -> dict[tuple[str, str | None], set[str]]:
    """``(section, key or None for the whole section) -> the tasks that read it``, over the built-in tasks, the tasks
    registered in this process, and ``task`` (a plugin's is loaded). Other installed plugins are not loaded: a
    broken or slow plugin affects only the configs that name its task."""
    for module in sorted(set(_BUILTIN.values())):
        importlib.import_module(f"{__package__}.{module}")
    names = set(_REGISTRY)
    if task is not None:
        get_task(task)  # loads a plugin's task; ConfigError for an unknown name
        names.add(task)
    owners: dict[tuple[str, str | None], set[str]] = {}
    for name in sorted(names):
        t = _REGISTRY[name]
        for section, parts in config_parts(t).items():
            own = (
                [(section, f.name) for c in parts for f in fields(c)]
                if section in COMMON_SECTIONS
                else [(section, None)]
            )
            for key in own:
                owners.setdefault(key, set()).add(name)
    return owners


def data_info(dm: Any) -> dict[str, Any]:
    """The plain values of a data module's ``info`` (what ``summary.json`` records of the data)."""
    return {k: v for k, v in getattr(dm, "info", {}).items() if isinstance(v, str | int | float | bool)}


def get_protocol(name: str, task: str | None = None) -> Protocol:
    """The protocol ``name`` (of ``task``, when given: the task may select differently, e.g. on the loss)."""
    if task is not None:
        t = get_task(task)
        if name not in t.protocols:
            raise ValueError(f"protocol: task {task!r} takes {t.protocols}, got {name!r}")
        return t.protocol(name)
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"protocol: expected one of {sorted(PROTOCOLS)}, got {name!r}") from None
