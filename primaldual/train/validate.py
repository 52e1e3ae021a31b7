"""Checks of a run config's values: types, ranges, names and combinations, never coercion (``"7"`` is not 7).

The generic checks know no task by name and cover the common keys; the task checks the keys it declares
(:meth:`primaldual.tasks.Task.check`), which exist in its configs only. Also here: the schema check of one
config file (:func:`check_file`, unknown keys named with the file) and the check against the machine
(:func:`check_machine`, when a run starts).
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..options import check_bool, check_choice, check_int, check_number
from ..tasks.base import exclusive_keys, get_task
from ..utils.errors import ConfigError
from .compose import PLAN_KEYS
from .schema import SECTIONS, ModelConfig, RunConfig, config_class, every_default
from .yaml_values import yaml_hint

__all__ = [
    "check_file",
    "check_machine",
    "lightning_names",
    "lightning_precisions",
    "optional_str",
    "path_part",
    "peer_attention",
    "validate_config",
]

PROTOCOLS = ("heldout", "paper")
OPTIMIZERS = ("radam", "adam", "adamw", "sgd")
DECAYS = ("constant", "linear", "cosine", "inverse_sqrt")


_PATH_PART = re.compile(r"[^./\\\x00-\x1f][^/\\\x00-\x1f]*")  # one safe path component: no separator, no leading dot
_PRECISIONS_FALLBACK = ("16-true", "16-mixed", "bf16-true", "bf16-mixed", "32-true", "64-true", 64, 32, 16)
_PRECISIONS_FALLBACK += ("64", "32", "16", "bf16")
_COMMON_ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
_COMMON_STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "single_device")
_SEED_MAX = 2**32 - 1  # the range Lightning's seed_everything accepts (outside it, it draws a random seed)


#: ``trainer.logger``: the CSV log is always written; these add a second logger beside it
LOGGERS = ("csv", "tensorboard", "wandb")

#: the largest model.dim (and num_heads; ffn_dim: 4x) and model.depth a config may ask for
MAX_WIDTH, MAX_DEPTH = 65_536, 1_024


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


def path_part(key: str, value: Any) -> None:
    """Check that ``value`` is usable as one directory name (run directories are named after it)."""
    if not isinstance(value, str) or not _PATH_PART.fullmatch(value):
        raise ConfigError(
            f"{key}: expected a name usable as a directory name (no '/', not starting with '.'), got {value!r}"
        )


def optional_str(key: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{key}: expected a non-empty string or null, got {value!r}")


def peer_attention(m: ModelConfig, what: str) -> None:
    """A model kind that is another library's model (``what``, e.g. ``"Hugging Face's GPT2LMHeadModel"``) has its
    own softmax attention: ``model.attention`` must be ``softmax`` (or ``softmax`` for every layer) and
    ``model.attention_options`` null; anything else is a :class:`ConfigError`, never ignored."""
    names = list(m.attention) if isinstance(m.attention, list | tuple) else [m.attention]
    options = list(m.attention_options) if isinstance(m.attention_options, list | tuple) else [m.attention_options]
    if any(n != "softmax" for n in names) or any(o is not None for o in options):
        raise ConfigError(
            f"model.attention: model.kind {m.kind!r} is {what}, with its own softmax attention in every layer; "
            f"set model.attention 'softmax' and model.attention_options null (got {m.attention!r} with "
            f"options {m.attention_options!r})"
        )


def validate_config(cfg: RunConfig) -> RunConfig:
    """Check every value (types, ranges, names, combinations) and return ``cfg``; raise :class:`ConfigError`.

    Covers what the run passes on: the attention of every layer is looked up in the registry and built (on the
    ``meta`` device, so no memory is used) with the config's width, heads and options, so an unknown attention
    or option, or an out-of-range option value, is reported here under its config key. What depends on the
    machine (an accelerator that is not there) is checked by :func:`check_machine` when a run starts.
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
    path_part("name", cfg.name)
    check_int("seed", cfg.seed, low=0, high=_SEED_MAX)

    d = cfg.data
    optional_str("data.root", d.root)
    check_int("data.batch_size", d.batch_size, low=1)
    check_int("data.eval_batch_size", d.eval_batch_size, low=1)
    check_int("data.num_workers", d.num_workers, low=0)
    check_int("data.max_len", d.max_len, low=1, allow_none=True)

    m = cfg.model
    if m.kind != "auto" and m.kind not in task.model_kinds:
        raise ConfigError(f"model.kind: {m.kind!r} does not fit task {cfg.task!r} (it builds {task.model_kinds})")
    # upper bounds far above any model a run trains (GPT-3's width is 12,288), so that a typo such as an extra
    # three zeros is a one-line error here, not an allocator's overflow after the data is loaded
    check_int("model.dim", m.dim, low=1, high=MAX_WIDTH)
    check_int("model.depth", m.depth, low=1, high=MAX_DEPTH)
    check_int("model.num_heads", m.num_heads, low=1, high=MAX_WIDTH)
    check_int("model.ffn_dim", m.ffn_dim, low=1, high=4 * MAX_WIDTH)
    check_number("model.dropout", m.dropout, low=0, high=1, high_open=True)
    _validate_attention(m, causal=task.causal)

    o = cfg.optim
    if o.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name: expected one of {OPTIMIZERS}, got {o.name!r}")
    check_number("optim.lr", o.lr, low=0, low_open=True)
    check_number("optim.weight_decay", o.weight_decay, low=0)
    b = o.betas
    if b is not None and not (
        isinstance(b, list | tuple)
        and len(b) == 2
        and all(not isinstance(x, bool) and isinstance(x, int | float) and 0 <= x < 1 for x in b)
    ):
        raise ConfigError(f"optim.betas: expected two numbers in [0, 1), got {b!r}")
    check_number("optim.eps", o.eps, low=0, low_open=True, allow_none=True)

    s = cfg.schedule
    if s.decay not in DECAYS:
        raise ConfigError(f"schedule.decay: expected one of {DECAYS}, got {s.decay!r}")
    for key, v in (("schedule.warmup_steps", s.warmup_steps),):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"{key}: expected an int >= 0, got {v!r}")
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
    check_int("trainer.num_nodes", t.num_nodes, low=1)
    if not any(type(t.precision) is type(c) and t.precision == c for c in _PRECISIONS_FALLBACK):
        check_choice("trainer.precision", t.precision, lightning_precisions())
    check_number(
        "trainer.gradient_clip_val (null for no clipping)", t.gradient_clip_val, low=0, low_open=True, allow_none=True
    )
    check_int("trainer.log_every_n_steps", t.log_every_n_steps, low=1)
    check_choice("trainer.logger", t.logger, LOGGERS)
    if t.logger != "csv" and importlib.util.find_spec(t.logger) is None:
        raise ConfigError(f"trainer.logger: {t.logger!r} needs the {t.logger} package (pip install {t.logger})")
    check_int("trainer.accumulate_grad_batches", t.accumulate_grad_batches, low=1)
    check_bool("trainer.enable_progress_bar", t.enable_progress_bar)
    check_bool("trainer.compile", t.compile)
    if t.compile and not task.compiles:
        raise ConfigError(f"trainer.compile: task {cfg.task!r} does not compile its model; set it to false")
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


def _validate_attention(m: ModelConfig, causal: bool = False) -> None:
    """Every layer's attention name and options, checked against the registry and by building the layer on meta
    (``causal``: as a causal layer, the language model's)."""
    from ..attention.registry import attention_options, build_attention, list_attentions

    registered = [i.name for i in list_attentions()]
    per_layer = isinstance(m.attention, list | tuple)
    names = list(m.attention) if per_layer else [m.attention] * m.depth
    if per_layer and len(names) != m.depth:
        raise ConfigError(f"model.attention: {len(names)} entries, but model.depth is {m.depth}")
    opts_per_layer = isinstance(m.attention_options, list | tuple)
    if opts_per_layer:
        options = list(m.attention_options)
        if len(options) != m.depth:
            raise ConfigError(f"model.attention_options: {len(options)} entries, but model.depth is {m.depth}")
    elif m.attention_options is None or isinstance(m.attention_options, dict):
        options = [m.attention_options] * m.depth
    else:
        raise ConfigError(
            f"model.attention_options: expected a mapping, or one mapping (or null) per layer, got {m.attention_options!r}"
        )
    built: set[str] = set()
    for i, (name, opts) in enumerate(zip(names, options)):
        at = f"model.attention[{i}]" if per_layer else "model.attention"
        ot = f"model.attention_options[{i}]" if opts_per_layer else "model.attention_options"
        if not isinstance(name, str) or name not in registered:
            raise ConfigError(f"{at}: unknown attention {name!r}; registered attentions: {', '.join(registered)}")
        if opts is not None and not isinstance(opts, dict):
            raise ConfigError(f"{ot}: expected a mapping of {name!r} options or null, got {opts!r}")
        opts = dict(opts or {})
        valid = attention_options(name)
        for key in opts:
            if key not in valid:
                raise ConfigError(
                    f"{ot}: unknown option {key!r} for attention {name!r}{yaml_hint(key)}; valid options: "
                    f"{', '.join(sorted(valid))}"
                )
        if causal and "causal" in opts:
            raise ConfigError(f"{ot}: leave out 'causal'; every layer of the language model is causal")
        if "head_dim" not in opts and m.dim % m.num_heads:
            raise ConfigError(f"model.num_heads: {m.num_heads} heads do not divide model.dim {m.dim}")
        key = repr((name, sorted(opts.items(), key=lambda kv: kv[0])))
        if key in built:
            continue
        built.add(key)
        opts.update(device="meta", dtype=None)
        if causal:
            opts["causal"] = True
        try:
            build_attention(name, m.dim, m.num_heads, **opts)
        except (TypeError, ValueError, KeyError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
            raise ConfigError(f"{ot} ({name}): {msg}") from None


def check_machine(cfg: RunConfig) -> None:
    """Raise :class:`ConfigError` when ``trainer.accelerator`` names hardware this machine does not have, or
    ``trainer.devices`` asks for more devices of it than there are (checked when a run starts, not on load: a run's
    config stays loadable, for analysis, on a machine without its accelerator)."""
    acc = cfg.trainer.accelerator
    if acc in ("auto", "cpu"):
        return
    from lightning.pytorch.accelerators import AcceleratorRegistry, CUDAAccelerator, MPSAccelerator

    classes = [CUDAAccelerator, MPSAccelerator] if acc == "gpu" else [AcceleratorRegistry[acc]["accelerator"]]
    available = [c for c in classes if c.is_available()]
    if not available:
        raise ConfigError(
            f"trainer.accelerator: {acc!r}, but this machine has no such device (torch sees none); "
            "use --trainer.accelerator cpu or auto"
        )
    devices = cfg.trainer.devices
    count = max(c.auto_device_count() for c in available)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > count:
        raise ConfigError(f"trainer.devices: {devices} {acc} devices requested, but this machine has {count}")


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
