"""Checks of a run config's values: types, ranges, names and combinations, never coercion (``"7"`` is not 7).

The generic checks know no task by name and cover the common keys; the task checks the keys it declares
(:meth:`primaldual.tasks.Task.check`), which exist in its configs only. Also here: the schema check of one
config file (:func:`check_file`, unknown keys named with the file). Checks that belong to what they check live
there: each common key's own range on its field (:func:`primaldual.options.checked`), the attention plan in
:func:`primaldual.models.plans.check_plan`, the machine in :func:`primaldual.train.run.check_machine` (when a run
starts).
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..models.plans import PLAN_KEYS, check_plan
from ..options import check_choice, check_fields, check_int, check_name
from ..tasks.base import exclusive_keys, get_task
from ..utils.errors import ConfigError, yaml_hint
from .schema import SECTIONS, RunConfig, config_class, every_default

__all__ = [
    "check_file",
    "lightning_names",
    "lightning_precisions",
    "validate_config",
]

PROTOCOLS = ("heldout", "paper")


_PRECISIONS_FALLBACK = ("16-true", "16-mixed", "bf16-true", "bf16-mixed", "32-true", "64-true", 64, 32, 16)
_PRECISIONS_FALLBACK += ("64", "32", "16", "bf16")
_COMMON_ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
_COMMON_STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "single_device")
_SEED_MAX = 2**32 - 1  # the range Lightning's seed_everything accepts (outside it, it draws a random seed)


def lightning_precisions() -> tuple[Any, ...]:
    """The ``trainer.precision`` values the installed Lightning accepts (strings and ints)."""
    from typing import get_args

    def flat(t: Any) -> list[Any]:
        args = get_args(t)
        return [v for a in args for v in flat(a)] if args else [t]

    try:
        from lightning.fabric.plugins.precision import precision as lp

        values = tuple(dict.fromkeys(flat(lp._PRECISION_INPUT)))
        return values or _PRECISIONS_FALLBACK
    except (ImportError, AttributeError):
        return _PRECISIONS_FALLBACK


def lightning_names(kind: str) -> tuple[str, ...]:
    """Registered Lightning ``accelerator`` or ``strategy`` names (plus ``auto``, and ``gpu`` for accelerators)."""
    try:
        if kind == "accelerator":
            from lightning.pytorch.accelerators import AcceleratorRegistry

            return ("auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators()))
        from lightning.pytorch.strategies import StrategyRegistry

        return ("auto", *StrategyRegistry.available_strategies())
    except ImportError:
        return ("auto", "cpu", "gpu", "cuda", "mps", "tpu") if kind == "accelerator" else ("auto", "ddp")


def validate_config(cfg: RunConfig) -> RunConfig:
    """Check every value (types, ranges, names, combinations) and return ``cfg``; raise :class:`ConfigError`.

    Covers what the run passes on: the attention of every layer is looked up in the registry and built (on the
    ``meta`` device, so no memory is used) with the config's width, heads and options, so an unknown attention
    or option, or an out-of-range option value, is reported here under its config key. What depends on the
    machine (an accelerator that is not there) is checked by :func:`~primaldual.train.run.check_machine` when a run
    starts.
    """
    try:
        _validate_config(cfg)
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
        raise ConfigError(msg) from None
    return cfg


def _validate_config(cfg: RunConfig) -> None:
    """Raise :class:`ConfigError` naming the first bad value of ``cfg``."""
    task = get_task(cfg.task)
    if cfg.protocol not in PROTOCOLS:
        raise ConfigError(f"protocol: expected one of {PROTOCOLS}, got {cfg.protocol!r}")
    if cfg.protocol not in task.protocols:
        raise ConfigError(f"protocol: task {cfg.task!r} takes {task.protocols}, got {cfg.protocol!r}")
    check_name("name", cfg.name)
    check_int("seed", cfg.seed, low=0, high=_SEED_MAX)

    for section in SECTIONS:  # each field's own check (options.checked), then what spans fields
        check_fields(getattr(cfg, section), section)
    m, o, s = cfg.model, cfg.optim, cfg.schedule
    if m.kind != "auto" and m.kind not in task.model_kinds:
        raise ConfigError(f"model.kind: {m.kind!r} does not fit task {cfg.task!r} (it builds {task.model_kinds})")
    check_plan(m.attention, m.attention_options, m.depth, m.dim, m.num_heads, causal=task.causal)
    b = o.betas
    if b is not None and not (
        isinstance(b, list | tuple)
        and len(b) == 2
        and all(not isinstance(x, bool) and isinstance(x, int | float) and 0 <= x < 1 for x in b)
    ):
        raise ConfigError(f"optim.betas: expected two numbers in [0, 1), got {b!r}")
    if s.decay == "inverse_sqrt" and s.warmup_steps < 1:
        raise ConfigError(
            "schedule.warmup_steps: decay 'inverse_sqrt' (lr * sqrt(warmup_steps / step)) needs warmup_steps >= 1"
        )

    t = cfg.trainer
    if not isinstance(t.max_steps, int) or isinstance(t.max_steps, bool) or t.max_steps == 0 or t.max_steps < -1:
        raise ConfigError(f"trainer.max_steps: expected -1 (epoch-based) or a positive int, got {t.max_steps!r}")
    if cfg.step_based:
        check_int("trainer.max_epochs", t.max_epochs, low=-1)
        if t.max_epochs not in (-1, RunConfig().trainer.max_epochs):  # silently ignored otherwise
            raise ConfigError(
                f"trainer.max_epochs: a step-based run stops at trainer.max_steps ({t.max_steps}) and ignores "
                f"max_epochs ({t.max_epochs}); set the length with --trainer.max_steps instead"
            )
        check_int("trainer.val_check_interval", t.val_check_interval, low=1, high=t.max_steps, allow_none=True)
    else:
        if task.step_based:
            raise ConfigError(f"trainer.max_steps: task {cfg.task!r} is step-based; set a positive max_steps")
        check_int("trainer.max_epochs", t.max_epochs, low=1)
        if t.val_check_interval is not None:
            raise ConfigError(
                "trainer.val_check_interval: only step-based runs (trainer.max_steps > 0) evaluate every K steps; "
                "an epoch-based run evaluates after every epoch (set it to null)"
            )
    # after the trainer: a total_steps referencing trainer.max_steps is reported under max_steps first
    check_int("schedule.total_steps", s.total_steps, low=1, allow_none=True)
    if s.decay in ("linear", "cosine") and s.total_steps is None and not cfg.step_based:
        raise ConfigError(
            f"schedule.decay: {s.decay!r} decays to 0 at schedule.total_steps; set it (or train step-based with "
            "trainer.max_steps)"
        )
    # the common values without importing Lightning (seconds); anything else against what Lightning registers
    if t.accelerator not in _COMMON_ACCELERATORS:
        check_choice("trainer.accelerator", t.accelerator, lightning_names("accelerator"))
    if t.strategy not in _COMMON_STRATEGIES:
        check_choice("trainer.strategy", t.strategy, lightning_names("strategy"))
    _validate_devices(t.devices)
    if not any(type(t.precision) is type(c) and t.precision == c for c in _PRECISIONS_FALLBACK):
        check_choice("trainer.precision", t.precision, lightning_precisions())
    if t.logger != "csv" and importlib.util.find_spec(t.logger) is None:
        raise ConfigError(f"trainer.logger: {t.logger!r} needs the {t.logger} package (pip install {t.logger})")
    if t.compile and not task.compiles:
        raise ConfigError(f"trainer.compile: task {cfg.task!r} does not compile its model; set it to false")
    if t.compile_mode != "default" and not t.compile:
        raise ConfigError(
            f"trainer.compile_mode: {t.compile_mode!r} applies only with trainer.compile true (to run eagerly, set "
            "it to default as well)"
        )
    task.check(cfg)


def _validate_devices(v: Any) -> None:
    ok = (
        (isinstance(v, int) and not isinstance(v, bool) and (v >= 1 or v == -1))
        or (isinstance(v, str) and (v in ("auto", "-1") or re.fullmatch(r"\d+(,\d*)*", v.strip()) is not None))
        or (
            isinstance(v, list | tuple)
            and len(v) > 0
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v)
            and len(set(v)) == len(v)
        )
    )
    if not ok or v == "0" or v == 0:
        raise ConfigError(
            f"trainer.devices: expected a count >= 1, -1 (all), 'auto', or a list of distinct device indices, got {v!r}"
        )


def check_file(
    values: dict[str, Any], path: Path, maps: tuple[str, ...], fragment: bool, task: Any = None, entry: str = ""
) -> None:
    """One config file: its shapes and misplaced composition keys, and, with ``task`` (the composed config's), its
    keys against that task's schema (the common sections plus what the task adds), each unknown key named with the
    file (``maps``: the per-model / per-budget maps a task file may hold; checked again, entry by entry)."""
    schema = config_class(task) if task is not None else None
    sections = schema.sections if schema is not None else SECTIONS
    top = {f.name for f in fields(schema or RunConfig)} | {"vars"} | ({"defaults", *maps} if not entry else set())
    if fragment:
        top.discard("name")  # the run name comes from the config's own file or name, never from a fragment
    for key, value in values.items():
        full = f"{entry}{key}"
        if key == "name" and fragment:
            raise ConfigError(f"{path}: unknown config key {full!r} (a fragment cannot set the run name)")
        if schema is not None and key not in top and not foreign_default(key, None, value):
            raise ConfigError(f"{path}: {unknown_key(key, task, top, shown=full)}")
        if key in sections and value is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {full}: expected a mapping, got {type(value).__name__}")
            valid = {f.name for f in fields(sections[key])} | (set(PLAN_KEYS) if key == "model" else set())
            for k in value if schema is not None else ():
                if k not in valid and not foreign_default(key, k, value[k]):
                    raise ConfigError(f"{path}: {unknown_key(f'{key}.{k}', task, valid, shown=f'{full}.{k}')}")
            if key == "model" and "plan" in value and ({"attention", "attention_options"} & set(value)):
                raise ConfigError(
                    f"{path}: {full}: set either plan (which writes attention and attention_options) or attention"
                )
        elif key == "vars" and not isinstance(value, dict):
            raise ConfigError(f"{path}: {full}: expected a mapping of values to reference as ${{vars...}}")
        elif (
            key == "defaults" and not entry and not (isinstance(value, list) and all(isinstance(x, str) for x in value))
        ):
            raise ConfigError(f"{path}: defaults: expected a list of config names or .yaml paths, got {value!r}")
        elif key in maps and not entry:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {full}: expected a mapping of {key[:-1]} name -> values")
            for name, sub in value.items():
                if sub is not None and not isinstance(sub, dict):
                    raise ConfigError(f"{path}: {full}.{name}: expected a mapping, got {type(sub).__name__}")
                check_file(sub or {}, path, (), fragment, task, entry=f"{full}.{name}.")


def foreign_default(section: str, key: str | None, value: Any) -> bool:
    """Whether ``section.key`` (``key`` None: the whole section) is another task's, at its default: what a config.yaml
    written before tasks owned their keys lists. Such an entry reads as absent; any other value is an error."""
    if (section, key) not in exclusive_keys():
        return False
    default = every_default()[section]
    default = default if key is None else default[key]
    return json.dumps(value, sort_keys=True, default=str) == json.dumps(default, sort_keys=True, default=str)


def unknown_key(full: str, task: Any, valid: Any, note: str = "", shown: str | None = None) -> str:
    """The message for dotted key ``full`` (``section.key``), which ``task``'s schema lacks: the task(s) that own it,
    or the valid keys (``note``: said after the key; ``shown``: the key as the message names it)."""
    section, _, key = full.partition(".")
    try:
        owners = exclusive_keys(task)
    except ConfigError:  # an unknown task is reported on its own
        owners = {}
    shown = shown or full
    whole = shown[: len(shown) - len(full) + len(section)]
    for what, who in ((whole, owners.get((section, None))), (shown, owners.get((section, key or None)))):
        if who and task not in who:
            return f"{what}: only task {' / '.join(repr(o) for o in sorted(who))} uses it, not task {task!r}"
    return f"unknown config key {shown!r}{note}{yaml_hint(full.rpartition('.')[2])}; valid keys here: {sorted(valid)}"
