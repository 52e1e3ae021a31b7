"""Run configuration: a few dataclasses, loaded from composed YAML, overridden from the command line, validated.

A config has the sections ``data``, ``model``, ``optim``, ``schedule``, ``trainer`` (plus ``rl`` and ``augment``,
read only by the tasks that declare them) and the top-level keys ``name``, ``task``, ``protocol``, ``seed``.
``task`` names a registered task (:mod:`primaldual.tasks`), which checks its own part of the config
(:meth:`~primaldual.tasks.Task.check`); the generic checks here know no task by name. Overrides use dotted flags
(``--model.attention primal``, ``--trainer.max_epochs=5``, values parsed as YAML, never coerced) plus one
shortcut, ``--attention NAME``, that puts ``NAME`` in every layer and drops the mechanism options of the config
(they belong to the old mechanism).

Files are found and composed by :mod:`primaldual.train.compose` (OmegaConf; ``docs/configs.md``); this module adds
the schema check of every file, the ``model.plan`` presets, the dataclasses and their validation. The dataclasses
stay plain (OmegaConf's typed mode would turn ``"7"`` into 7; the validators refuse it instead). An unknown key
(in a file or a flag) is an error that names the file and key and lists the valid ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any

import yaml

from ..data.augment import AugmentSettings
from ..tasks.base import exclusive_keys, get_task
from .compose import BUDGETS, MODELS, PLAN_KEYS, Composed, ComposeError, SearchPath, compose, lookup, not_found
from .compose import TASKS as TASK_FOLDER
from .errors import ConfigError

__all__ = [
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "AugmentConfig",
    "RLConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "apply_overrides",
    "check_machine",
    "search_path",
    "describe_config",
    "dump_config",
    "find_config",
    "lightning_names",
    "optional_str",
    "path_part",
    "lightning_precisions",
    "list_configs",
    "load_config",
]

PROTOCOLS = ("heldout", "paper")
OPTIMIZERS = ("radam", "adam", "adamw", "sgd")
DECAYS = ("constant", "linear", "cosine", "inverse_sqrt")


@dataclass
class DataConfig:
    """The dataset.

    UEA: ``name`` a UEA dataset; ``root`` folder with ``<name>_TRAIN.ts`` / ``<name>_TEST.ts`` (None: the cache);
    ``fetch`` obtains JapaneseVowels automatically when it is missing; ``val_fraction``: stratified share of TRAIN
    held out for validation (heldout protocol; also for LRA data that ships without a validation split).

    LRA (see :mod:`primaldual.train.lra_data`): ``name`` the dataset (e.g. ``listops``, ``imdb``,
    ``shakespeare_genre``, ``aan``, ``fashion_mnist``, ``pathfinder32_L14``); ``max_len`` the padded length;
    ``tokenisation`` ListOps' ``brackets`` / ``no_brackets``; ``stand_in`` the obtainable real-data stand-in that an
    error message suggests when the named data is missing (never substituted silently); ``train_pairs`` /
    ``eval_pairs`` pairs drawn per split by the retrieval stand-in; ``val_size``: evaluate a fixed random subset of the
    validation split of this size (cheaper periodic evaluation; the test split is always used whole).

    LM (see :mod:`primaldual.train.lm`): ``name`` one of :data:`LM_DATASETS`; ``root`` the corpus folder (None: the
    cache); ``max_len`` the tokens per sample (contiguous, non-overlapping chunks); ``val_size`` as LRA, in chunks.

    Vision (see :mod:`primaldual.train.vision`): ``name`` ``fashion_mnist`` / ``mnist`` (idx files) or any name of an
    image-folder tree at ``root`` (``train/<class>/*``, ``val/<class>/*``, optional ``test/<class>/*``);
    ``image_size`` the side the model sees (None: the idx images' 28; required for folders); ``crop_pct``: folders
    are decoded at ``image_size / crop_pct`` (shorter side, centre square) and evaluated on the centre
    ``image_size`` crop (DeiT's 256 -> 224).
    """

    name: str = "JapaneseVowels"
    root: str | None = None
    fetch: bool = True
    val_fraction: float = 0.2
    batch_size: int = 16
    eval_batch_size: int = 256
    num_workers: int = 0
    max_len: int | None = None
    tokenisation: str = "brackets"
    stand_in: str | None = None
    train_pairs: int = 10000
    eval_pairs: int = 2000
    val_size: int | None = None
    image_size: int | None = None
    crop_pct: float = 0.875


@dataclass
class ModelConfig:
    """The task model. ``kind``: ``timeseries`` (:class:`~primaldual.models.TimeSeriesClassifier`, post-LN),
    ``sequence`` (:class:`~primaldual.models.SequenceClassifier`, LRA) or ``retrieval``
    (:class:`~primaldual.models.RetrievalClassifier`); ``auto`` picks it from the task. ``vocab_size`` /
    ``num_classes``: None takes them from the data (a value that disagrees with the data is an error).
    ``norm_first``, ``positions``, ``pooling``: token models only. ``lm``: the decoder-only
    :class:`~primaldual.models.CausalLM` (pre-LN, causal attention in every layer; ``tie_embeddings``: the output
    layer shares the token embedding's weight). ``vit``: the
    :class:`~primaldual.models.VisionClassifier` (pre-LN, CLS token, ``patch_size`` patches, stochastic depth
    rising linearly to ``drop_path`` in the last block; ``patch_kernel``: the patch projection's kernel, None for
    ``patch_size``, larger for overlapping patches; ``stem``: ``patch`` or ``conv``, a convolutional stem)."""

    kind: str = "auto"
    dim: int = 512
    depth: int = 2
    num_heads: int = 8
    ffn_dim: int = 2048
    dropout: float = 0.1
    attention: Any = "primal"  # a registry name, or one name per layer
    attention_options: Any = None  # a dict, or one dict (or null) per layer
    vocab_size: int | None = None
    num_classes: int | None = None
    norm_first: bool = True
    positions: str = "learned"
    pooling: str = "mean"
    tie_embeddings: bool = True
    patch_size: int = 16
    drop_path: float = 0.0
    patch_kernel: int | None = None
    stem: str = "patch"

    def backbone_kwargs(self) -> dict[str, Any]:
        """The keyword arguments every task model passes to its encoder stack (sizes and attention plan)."""
        return {
            "dim": self.dim,
            "depth": self.depth,
            "num_heads": self.num_heads,
            "ffn_dim": self.ffn_dim,
            "dropout": self.dropout,
            "attention": self.attention,
            "attention_options": self.attention_options,
        }

    def resolved_kind(self, task: str) -> str:
        """``kind``, or for ``auto`` the task's model kind (the first of its ``model_kinds``)."""
        return self.kind if self.kind != "auto" else get_task(task).model_kinds[0]


@dataclass
class OptimConfig:
    """Optimiser. ``betas`` / ``eps`` apply to the Adam family (None: the optimiser's default)."""

    name: str = "radam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: Any = None
    eps: float | None = None


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, stepped every optimiser step: linear warm-up over ``warmup_steps`` from lr / warmup
    to lr, then ``decay`` (``constant``: the UEA reference; ``linear`` to 0 at ``total_steps``: the LRA reference;
    ``cosine`` to 0; ``inverse_sqrt``: lr * sqrt(warmup_steps / step), fairseq's ``inverse_sqrt``, the LM
    reference). ``total_steps`` None: ``trainer.max_steps``."""

    warmup_steps: int = 0
    decay: str = "constant"
    total_steps: int | None = None


@dataclass
class TrainerConfig:
    """Arguments passed to ``lightning.Trainer`` (see its documentation). ``accumulate_grad_batches``: batches whose
    gradients are summed into one optimiser step (``max_steps``, ``val_check_interval`` and the schedule count
    optimiser steps). ``compile``: train the model compiled with ``torch.compile`` (checked against eager on the
    first validation batch; eager training, with a message, where compilation fails or disagrees)."""

    max_epochs: int = 100
    max_steps: int = -1  # > 0: step-based training (LRA); max_epochs is then ignored
    val_check_interval: int | None = None  # step-based: evaluate (and checkpoint) every this many steps
    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    gradient_clip_val: float | None = None
    log_every_n_steps: int = 5
    enable_progress_bar: bool = True
    accumulate_grad_batches: int = 1
    compile: bool = False


@dataclass
class RLConfig:
    """Offline RL (task ``offline_rl``, see :mod:`primaldual.train.rl`): the Decision Transformer's episode and
    rollout settings. ``max_ep_len``: the model's timestep table and the rollouts' episode cap; ``return_scale``:
    returns-to-go are divided by it; ``target_returns``: the returns the periodic evaluation conditions on (None:
    the reference targets of the environment, e.g. Hopper 3600 / 1800); ``eval_episodes`` per target, seeded
    ``eval_seed + i``; ``action_tanh``: tanh on the predicted actions. The context K is ``data.max_len``."""

    max_ep_len: int = 1000
    return_scale: float = 1000.0
    target_returns: Any = None
    eval_episodes: int = 10
    eval_seed: int = 0
    action_tanh: bool = True


def _augment_settings(section: Any) -> Any:
    """The validated :class:`~primaldual.data.augment.AugmentSettings` of an ``augment`` section."""
    return AugmentSettings(**{f.name: getattr(section, f.name) for f in fields(AugmentSettings)})


# The ``augment`` section: AugmentSettings' fields, defaults (pairs as YAML lists) and checks, but mutable like the
# other sections, so that overrides and the YAML round trip treat it as they treat them.
AugmentConfig = make_dataclass(
    "AugmentConfig",
    [
        (f.name, Any, field(default_factory=lambda v=f.default: list(v) if isinstance(v, tuple) else v))
        for f in fields(AugmentSettings)
    ],
    namespace={"settings": _augment_settings, "__module__": __name__},
)
AugmentConfig.__doc__ = """Training-time augmentation of task ``vision`` (DeiT's recipe, :mod:`primaldual.data.augment`), applied to each
    training batch; the defaults switch everything off. ``crop_scale``: random resized crop area range (null: no
    crop, the centre ``image_size`` square); ``crop_ratio``: its aspect range; ``hflip``: horizontal flip
    probability; ``randaugment_ops`` (0: off), ``randaugment_magnitude``, ``randaugment_magnitude_std``: timm's
    ``rand-m9-mstd0.5-inc1`` with the subset of operations the module lists; ``erasing``: random-erasing
    probability; ``mixup_alpha`` / ``cutmix_alpha`` (0: off), ``mix_prob``, ``mix_switch_prob``: timm's batch
    mixup / cutmix; ``label_smoothing``."""


@dataclass
class RunConfig:
    """One training run. ``name`` names the run directory; ``protocol`` is ``heldout`` or ``paper``."""

    name: str = "run"
    task: str = "uea"
    protocol: str = "heldout"
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """Short hash of everything that changes the result (not the progress bar): names the run directory.

        Keys added after 0.1.0 enter the hash only when they differ from their default, so the run directories of
        earlier configs keep their names (and still resume).
        """
        d = self.to_dict()
        d["trainer"].pop("enable_progress_bar")
        d["trainer"].pop("compile")  # how the run executes, not what it computes (a resume may switch it)
        defaults = RunConfig().to_dict()
        for section, key in _ADDED_KEYS:
            node, ref = (d, defaults) if section is None else (d[section], defaults[section])
            if node.get(key) == ref.get(key):
                node.pop(key, None)
        if d["schedule"] == defaults["schedule"]:
            d.pop("schedule")
        for section in ("rl", "augment"):
            if d[section] == defaults[section]:
                d.pop(section)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]

    @property
    def step_based(self) -> bool:
        """True when training is counted in optimiser steps (``trainer.max_steps > 0``), as LRA."""
        return self.trainer.max_steps > 0

    def validate(self) -> RunConfig:
        """Check every value (types, ranges, names, combinations) and return ``self``; raise :class:`ConfigError`.

        Covers what the run passes on: the attention of every layer is looked up in the registry and built (on the
        ``meta`` device, so no memory is used) with the config's width, heads and options, so an unknown attention
        or option, or an out-of-range option value, is reported here under its config key. What depends on the
        machine (an accelerator that is not there) is checked by :func:`check_machine` when a run starts.
        """
        try:
            _validate(self)
        except ConfigError:
            raise
        except (TypeError, ValueError, KeyError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
            raise ConfigError(msg) from None
        return self


_PATH_PART = re.compile(r"[^./\\\x00-\x1f][^/\\\x00-\x1f]*")  # one safe path component: no separator, no leading dot
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


def path_part(key: str, value: Any) -> None:
    """Check that ``value`` is usable as one directory name (run directories are named after it)."""
    if not isinstance(value, str) or not _PATH_PART.fullmatch(value):
        raise ConfigError(
            f"{key}: expected a name usable as a directory name (no '/', not starting with '.'), got {value!r}"
        )


def optional_str(key: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{key}: expected a non-empty string or null, got {value!r}")


def _validate(cfg: RunConfig) -> None:
    from ..options import check_bool, check_choice, check_int, check_number

    task = get_task(cfg.task)
    if cfg.protocol not in PROTOCOLS:
        raise ConfigError(f"protocol: expected one of {PROTOCOLS}, got {cfg.protocol!r}")
    if cfg.protocol not in task.protocols:
        raise ConfigError(f"protocol: task {cfg.task!r} takes {task.protocols}, got {cfg.protocol!r}")
    path_part("name", cfg.name)
    check_int("seed", cfg.seed, low=0, high=_SEED_MAX)

    d = cfg.data
    optional_str("data.root", d.root)
    optional_str("data.stand_in", d.stand_in)
    check_bool("data.fetch", d.fetch)
    check_number("data.val_fraction", d.val_fraction, low=0, high=1, low_open=True, high_open=True)
    check_int("data.batch_size", d.batch_size, low=1)
    check_int("data.eval_batch_size", d.eval_batch_size, low=1)
    check_int("data.num_workers", d.num_workers, low=0)
    check_int("data.max_len", d.max_len, low=1, allow_none=True)
    check_choice("data.tokenisation", d.tokenisation, ("brackets", "no_brackets"))
    check_int("data.train_pairs", d.train_pairs, low=1)
    check_int("data.eval_pairs", d.eval_pairs, low=1)
    check_int("data.val_size", d.val_size, low=1, allow_none=True)
    check_int("data.image_size", d.image_size, low=1, allow_none=True)
    check_number("data.crop_pct", d.crop_pct, low=0, high=1, low_open=True)

    m = cfg.model
    if m.kind != "auto" and m.kind not in task.model_kinds:
        raise ConfigError(f"model.kind: {m.kind!r} does not fit task {cfg.task!r} (it builds {task.model_kinds})")
    if m.positions not in ("learned", "sinusoidal"):
        raise ConfigError(f"model.positions: expected 'learned' or 'sinusoidal', got {m.positions!r}")
    if m.pooling not in ("mean", "cls"):
        raise ConfigError(f"model.pooling: expected 'mean' or 'cls', got {m.pooling!r}")
    check_int("model.dim", m.dim, low=1)
    check_int("model.depth", m.depth, low=1)
    check_int("model.num_heads", m.num_heads, low=1)
    check_int("model.ffn_dim", m.ffn_dim, low=1)
    check_number("model.dropout", m.dropout, low=0, high=1, high_open=True)
    check_int("model.vocab_size", m.vocab_size, low=1, allow_none=True)
    check_int("model.num_classes", m.num_classes, low=2, allow_none=True)
    check_bool("model.norm_first", m.norm_first)
    check_bool("model.tie_embeddings", m.tie_embeddings)
    check_int("model.patch_size", m.patch_size, low=1)
    check_number("model.drop_path", m.drop_path, low=0, high=1, high_open=True)
    check_int("model.patch_kernel", m.patch_kernel, low=m.patch_size, allow_none=True)
    if m.patch_kernel is not None and (m.patch_kernel - m.patch_size) % 2:
        raise ConfigError(
            f"model.patch_kernel: expected model.patch_size ({m.patch_size}) plus an even number, got {m.patch_kernel}"
        )
    if m.stem not in ("patch", "conv"):
        raise ConfigError(f"model.stem: expected 'patch' or 'conv', got {m.stem!r}")
    if m.stem == "conv" and (m.patch_size < 2 or m.patch_size & (m.patch_size - 1) or m.patch_kernel is not None):
        raise ConfigError(
            f"model.stem: 'conv' needs model.patch_size a power of two (got {m.patch_size}) and model.patch_kernel "
            f"null (got {m.patch_kernel})"
        )
    _validate_attention(m, causal=task.causal)
    _validate_exclusive(cfg)

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
    check_int("trainer.accumulate_grad_batches", t.accumulate_grad_batches, low=1)
    check_bool("trainer.enable_progress_bar", t.enable_progress_bar)
    check_bool("trainer.compile", t.compile)
    if t.compile and not task.compiles:
        raise ConfigError(f"trainer.compile: task {cfg.task!r} does not compile its model; set it to false")
    task.check(cfg)


def _validate_exclusive(cfg: RunConfig) -> None:
    """Sections and keys that only some tasks read stay at their defaults in every other task's config."""
    defaults = RunConfig()
    for (section, key), owners in exclusive_keys().items():
        if cfg.task in owners:
            continue
        value, default = getattr(cfg, section), getattr(defaults, section)
        if key is not None:
            value, default = getattr(value, key), getattr(default, key)
        if value != default:
            who = " / ".join(f"{o!r}" for o in sorted(owners))
            what = section if key is None else f"{section}.{key}"
            raise ConfigError(f"{what}: only task {who} uses it, not task {cfg.task!r}")


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


def _yaml_hint(key: Any) -> str:
    """A hint for a key such as ``'s:4'``, which YAML reads from ``{s:4}`` (no space after the colon)."""
    if isinstance(key, str) and ":" in key:
        k, _, v = key.partition(":")
        return f" (YAML reads {{{key}}} as the key {key!r}; write {{{k}: {v}}} with a space after the colon)"
    return ""


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
                    f"{ot}: unknown option {key!r} for attention {name!r}{_yaml_hint(key)}; valid options: "
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


# (section, key) of config keys introduced after 0.1.0 (see RunConfig.fingerprint)
_ADDED_KEYS = [
    *(("data", k) for k in ("max_len", "tokenisation", "stand_in", "train_pairs", "eval_pairs", "val_size")),
    *(("model", k) for k in ("kind", "vocab_size", "num_classes", "norm_first", "positions", "pooling")),
    ("model", "tie_embeddings"),
    *(("optim", k) for k in ("betas", "eps")),
    *(("trainer", k) for k in ("max_steps", "val_check_interval", "accumulate_grad_batches")),
    *(("data", k) for k in ("image_size", "crop_pct")),
    *(("model", k) for k in ("patch_size", "drop_path", "patch_kernel", "stem")),
]

_SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "trainer": TrainerConfig,
    "rl": RLConfig,
    "augment": AugmentConfig,
}


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(values).__name__}")
    valid = {f.name for f in fields(cls)}
    for key in values:
        if key not in valid:
            full = f"{where}.{key}" if where else key
            raise ConfigError(f"unknown config key {full!r}{_yaml_hint(key)}; valid keys here: {sorted(valid)}")
    kwargs = {}
    for key, value in values.items():
        if key in _SECTIONS and not where:
            kwargs[key] = _build(_SECTIONS[key], value or {}, key)
        else:
            kwargs[key] = value
    return cls(**kwargs)


def search_path(config_dir: str | os.PathLike | None = None) -> list[Path]:
    """The folders config names are looked up in, first wins: ``config_dir``, ``./configs``, the shipped configs."""
    return SearchPath(config_dir).roots


def _check_layer(values: dict[str, Any], path: Path, maps: tuple[str, ...], fragment: bool, entry: str = "") -> None:
    """Unknown keys, wrong shapes and misplaced composition keys of one file (``maps``: the per-model / per-budget
    maps a task file may hold; checked again, entry by entry)."""
    top = {f.name for f in fields(RunConfig)} | {"vars"} | ({"defaults", *maps} if not entry else set())
    if fragment:
        top.discard("name")  # the run name comes from the config's own file or name, never from a fragment
    for key, value in values.items():
        full = f"{entry}{key}"
        if key not in top:
            extra = " (a fragment cannot set the run name)" if key == "name" and fragment else ""
            raise ConfigError(f"{path}: unknown config key {full!r}{extra}; valid keys here: {sorted(top)}")
        if key in _SECTIONS and value is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {full}: expected a mapping, got {type(value).__name__}")
            valid = {f.name for f in fields(_SECTIONS[key])} | (set(PLAN_KEYS) if key == "model" else set())
            for k in value:
                if k not in valid:
                    raise ConfigError(f"{path}: unknown config key '{full}.{k}'; valid keys here: {sorted(valid)}")
            if key == "model" and "plan" in value and ({"attention", "attention_options"} & set(value)):
                raise ConfigError(
                    f"{path}: {full}: set either plan (which writes attention and attention_options) or attention"
                )
        elif key == "vars" and not isinstance(value, dict):
            raise ConfigError(f"{path}: {full}: expected a mapping of values to reference as ${{vars...}}")
        elif key == "defaults" and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            raise ConfigError(f"{path}: defaults: expected a list of config names or .yaml paths, got {value!r}")
        elif key in maps:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {full}: expected a mapping of {key[:-1]} name -> values")
            for name, sub in value.items():
                if sub is not None and not isinstance(sub, dict):
                    raise ConfigError(f"{path}: {full}.{name}: expected a mapping, got {type(sub).__name__}")
                _check_layer(sub or {}, path, (), fragment, entry=f"{full}.{name}.")


def _plan_presets() -> dict[str, Callable[..., dict[str, list]]]:
    from ..models.plans import primal_plus, primalformer

    return {"primalformer": primalformer, "primal_plus": primal_plus}


def _expand_plan(model: dict[str, Any]) -> None:
    """``model.plan`` (+ ``primal_options``, ``base``, ``base_options``, ``primal_layers``) -> attention lists."""
    plan = model.pop("plan", None)
    opts = {k: model.pop(k) for k in PLAN_KEYS[1:] if k in model}
    if plan is None:
        if opts:
            raise ConfigError(f"model.{next(iter(opts))}: only used with model.plan (primalformer or primal_plus)")
        return
    presets = _plan_presets()
    if plan not in presets:
        raise ConfigError(f"model.plan: expected one of {sorted(presets)}, got {plan!r}")
    primal = opts.pop("primal_options", None) or {}
    if not isinstance(primal, dict):
        raise ConfigError(f"model.primal_options: expected a mapping of primal options, got {primal!r}")
    if plan == "primalformer" and opts:
        raise ConfigError(f"model.{next(iter(opts))}: not an option of plan 'primalformer' (every layer is primal)")
    try:
        model.update(presets[plan](model.get("depth", ModelConfig.depth), **opts, **primal))
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"model.plan {plan!r}: {e}") from None


def _known_key(key: str) -> bool:
    """Whether dotted ``key`` is a key of the run config (the rest is reported by :func:`apply_overrides`)."""
    node: Any = RunConfig().to_dict()
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _compose(spec: str, overrides: list[tuple[str, Any]] = (), config_dir: str | os.PathLike | None = None):
    try:
        c = compose(str(spec), SearchPath(config_dir), _check_layer, overrides, _known_key)
    except ComposeError as e:
        raise ConfigError(str(e)) from None
    try:
        if isinstance(c.values.get("model"), dict):
            _expand_plan(c.values["model"])
    except ConfigError as e:
        raise ConfigError(f"{c.origin}: {e}") from None
    return c


def list_configs(prefix: str = "", config_dir: str | os.PathLike | None = None) -> list[str]:
    """Names of the configs this CLI runs (files and composed names on the search path), no fragments."""
    search = SearchPath(config_dir)
    names = set(search.files())
    for fam in search.families():
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
        raise ConfigError(str(not_found(spec, search)))
    return search.find(f"{target.family}/{TASK_FOLDER}/{target.task}.yaml") if isinstance(target, Composed) else target


def describe_config(spec: str | Path, config_dir: str | os.PathLike | None = None) -> list[str]:
    """The files a config is merged from, first to last (relative to their root on the search path); a task
    file's per-model / per-budget entry as ``lra/_tasks/listops.yaml (models.primal_plus)``."""
    return _compose(str(spec), config_dir=config_dir).sources


def _parse_overrides(args: list[str]) -> list[tuple[str, Any]]:
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
        pairs.append((key, yaml.safe_load(val) if val != "" else None))
        i += 1
    return pairs


def load_config(
    spec: str | Path | None = None, overrides: list[str] | None = None, config_dir: str | os.PathLike | None = None
) -> RunConfig:
    """Load a config file or name (``None``: all defaults), composing it from its fragments, and apply
    command-line overrides (before the file's ``${...}`` references are resolved, so references follow them).
    ``config_dir``: a folder searched before ``./configs`` and the shipped configs."""
    if spec is None:
        cfg = RunConfig()
    else:
        c = _compose(str(spec), _parse_overrides(overrides or []), config_dir)
        try:
            cfg = _build(RunConfig, c.values, "")
        except (ConfigError, TypeError) as e:
            raise ConfigError(f"{c.origin}: {e}") from None
    return apply_overrides(cfg, overrides or []).validate()


def apply_overrides(cfg: RunConfig, args: list[str]) -> RunConfig:
    """Apply ``--a.b value`` / ``--a.b=value`` / ``--attention NAME`` flags (values parsed as YAML)."""
    d = cfg.to_dict()
    for key, value in _parse_overrides(args):
        if key == "attention":  # the one-flag switch to any registered mechanism
            d["model"]["attention"], d["model"]["attention_options"] = value, None
            d["name"] = f"{d['name']}-{value}" if isinstance(value, str) else d["name"]
            continue
        node, parts = d, key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"unknown config key {key!r} (from --{key}): {part!r} is not a section")
            node = node[part]
        if parts[-1] not in node:
            raise ConfigError(f"unknown config key {key!r} (from --{key}); valid keys here: {sorted(node)}")
        node[parts[-1]] = value
    try:
        return _build(RunConfig, d, "")
    except (ConfigError, TypeError) as e:
        raise ConfigError(str(e)) from None


def dump_config(cfg: RunConfig) -> str:
    """YAML text of a resolved config (what the run directory stores). Sections and keys that only other tasks read
    are left out when at their defaults (and ``trainer.compile`` when off), so the stored configs of earlier runs
    read as they always did (and still resume)."""
    d = cfg.to_dict()
    defaults = RunConfig().to_dict()
    if not cfg.trainer.compile:
        d["trainer"].pop("compile")
    for (section, key), owners in exclusive_keys().items():
        if cfg.task in owners:
            continue
        if key is None and d[section] == defaults[section]:
            d.pop(section)
        elif key is not None and section in d and d[section][key] == defaults[section][key]:
            d[section].pop(key)
    return yaml.safe_dump(d, sort_keys=False)
