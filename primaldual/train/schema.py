"""The run config's schema: one plain dataclass per section, and :class:`RunConfig` with its fingerprint.

The common sections: ``data``, ``model``, ``optim``, ``schedule``, ``trainer``. A task adds its own sections, or
keys to a common section, by declaring dataclasses in :attr:`primaldual.tasks.Task.config` (offline RL's ``rl``,
vision's ``augment``, a plugin's keys): :func:`config_class` is the run config of one task, and a key the task does
not declare is unknown there. What each key means for a task is documented with the task (:mod:`primaldual.tasks`)
and in ``docs/configs.md``. Loading: :mod:`primaldual.train.config`; value checks: :mod:`primaldual.train.validate`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from functools import cache
from typing import Any, ClassVar

from ..options import check_bool, check_choice, check_int, check_number, check_optional_str, checked
from ..tasks.base import COMMON_SECTIONS, Task, config_parts, exclusive_keys, get_task

#: ``torch.compile``'s modes (``trainer.compile_mode``)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: the largest model.dim (and num_heads; ffn_dim: 4x) and model.depth a config may ask for
MAX_WIDTH, MAX_DEPTH = 65_536, 1_024

__all__ = [
    "MAX_DEPTH",
    "MAX_WIDTH",
    "SECTIONS",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "config_class",
    "every_default",
]


@dataclass
class DataConfig:
    """The dataset: ``name`` (what it means is the task's), ``root`` (its folder or file; None: the cache),
    ``batch_size`` (per device), ``eval_batch_size``, ``num_workers`` (loader processes), ``max_len`` (the padded
    length, tokens per sample, or the context in timesteps). Keys some tasks add: :mod:`primaldual.tasks.checks`."""

    name: str = "JapaneseVowels"
    root: str | None = checked(None, check_optional_str)
    batch_size: int = checked(16, check_int, low=1)
    eval_batch_size: int = checked(256, check_int, low=1)
    num_workers: int = checked(0, check_int, low=0)
    max_len: int | None = checked(None, check_int, low=1, allow_none=True)


@dataclass
class ModelConfig:
    """The task model: ``kind`` (one of the task's model kinds; ``auto``: its first), the encoder's sizes,
    ``dropout``, and the attention of every layer (``attention``: a registry name, or one per layer;
    ``attention_options``: a mapping, or one (or null) per layer). Keys some tasks add (token models, ViT, the
    Decision Transformer): :mod:`primaldual.tasks.checks`."""

    kind: str = "auto"
    # upper bounds far above any model a run trains (GPT-3's width is 12,288), so that a typo such as an extra
    # three zeros is a one-line error, not an allocator's overflow after the data is loaded
    dim: int = checked(512, check_int, low=1, high=MAX_WIDTH)
    depth: int = checked(2, check_int, low=1, high=MAX_DEPTH)
    num_heads: int = checked(8, check_int, low=1, high=MAX_WIDTH)
    ffn_dim: int = checked(2048, check_int, low=1, high=4 * MAX_WIDTH)
    dropout: float = checked(0.1, check_number, low=0, high=1, high_open=True)
    attention: Any = "primal"  # a registry name, or one name per layer
    attention_options: Any = None  # a dict, or one dict (or null) per layer

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

    name: str = checked("radam", check_choice, choices=("radam", "adam", "adamw", "sgd"))
    lr: float = checked(1e-3, check_number, low=0, low_open=True)
    weight_decay: float = checked(0.0, check_number, low=0)
    betas: Any = None
    eps: float | None = checked(None, check_number, low=0, low_open=True, allow_none=True)


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, stepped every optimiser step: linear warm-up over ``warmup_steps`` from lr / warmup
    to lr, then ``decay`` (``constant``: the UEA reference; ``linear`` to 0 at ``total_steps``: the LRA reference;
    ``cosine`` to 0; ``inverse_sqrt``: lr * sqrt(warmup_steps / step), fairseq's ``inverse_sqrt``, the LM
    reference). ``total_steps`` None: ``trainer.max_steps``."""

    warmup_steps: int = checked(0, check_int, low=0)
    decay: str = checked("constant", check_choice, choices=("constant", "linear", "cosine", "inverse_sqrt"))
    total_steps: int | None = None  # checked after the trainer (it may reference trainer.max_steps)


@dataclass
class TrainerConfig:
    """Arguments passed to ``lightning.Trainer`` (see its documentation). ``accumulate_grad_batches``: batches whose
    gradients are summed into one optimiser step (``max_steps``, ``val_check_interval`` and the schedule count
    optimiser steps). ``compile``: train the model compiled with ``torch.compile`` (checked against eager on the
    first validation batch; eager training, with a message, where compilation fails or disagrees);
    ``compile_mode``: its ``mode`` (``reduce-overhead``: CUDA graphs on a GPU, for launch-bound steps)."""

    max_epochs: int = 100
    max_steps: int = -1  # > 0: step-based training (LRA); max_epochs is then ignored
    val_check_interval: int | None = None  # step-based: evaluate (and checkpoint) every this many steps
    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = checked(1, check_int, low=1)
    strategy: str = "auto"
    precision: str = "32-true"
    gradient_clip_val: float | None = checked(
        None, check_number, " (null for no clipping)", low=0, low_open=True, allow_none=True
    )
    log_every_n_steps: int = checked(5, check_int, low=1)
    enable_progress_bar: bool = checked(True, check_bool)
    accumulate_grad_batches: int = checked(1, check_int, low=1)
    compile: bool = checked(False, check_bool)
    compile_mode: str = checked("default", check_choice, choices=COMPILE_MODES)
    # csv (always written) | tensorboard | wandb (offline unless WANDB_MODE says otherwise)
    logger: str = checked("csv", check_choice, choices=("csv", "tensorboard", "wandb"))


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

    # the section classes (the task's own and extended ones in a task's class), and the (section, key or None for
    # the whole section) the task adds: those enter the fingerprint only when they differ from their default
    sections: ClassVar[dict[str, type]] = {}
    added: ClassVar[tuple[tuple[str, str | None], ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """Short hash of everything that changes the result (not the progress bar): names the run directory.

        Keys added after 0.1.0 enter the hash only when they differ from their default, so the run directories of
        earlier configs keep their names (and still resume).
        """
        d = self.to_dict()
        d["trainer"].pop("enable_progress_bar")
        for key in ("compile", "compile_mode"):  # how the run executes, not what it computes (a resume may switch it)
            d["trainer"].pop(key)
        d["trainer"].pop("logger")
        type(self).drop_own_defaults(d)  # (then the legacy keys that were common in 0.1.0, always hashed)
        for (section, key), value in _V010_KEYS.items():
            d[section].setdefault(key, value)
        defaults = type(self)().to_dict()
        for section, key in _ADDED_KEYS:
            node, ref = (d, defaults) if section is None else (d[section], defaults[section])
            if node.get(key) == ref.get(key):
                node.pop(key, None)
        if d["schedule"] == defaults["schedule"]:
            d.pop("schedule")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]

    @classmethod
    def drop_own_defaults(cls, d: dict[str, Any]) -> dict[str, Any]:
        """Remove from ``d`` (a :meth:`to_dict`) the task's own keys and sections that are at their defaults."""
        defaults = cls().to_dict()
        for section, key in cls.added:
            node, ref = (d, defaults) if key is None else (d.get(section, {}), defaults[section])
            name = section if key is None else key
            if name in node and node[name] == ref[name]:
                node.pop(name)
        return d

    @property
    def step_based(self) -> bool:
        """True when training is counted in optimiser steps (``trainer.max_steps > 0``), as LRA."""
        return self.trainer.max_steps > 0


# keys of 0.1.0 that tasks own since: hashed as they were then, at their default where the task has no such key
_V010_KEYS = {("data", "fetch"): True, ("data", "val_fraction"): 0.2}
# (section, key) of config keys introduced after 0.1.0 (see RunConfig.fingerprint)
_ADDED_KEYS = [
    *(("data", k) for k in ("max_len", "tokenisation", "stand_in", "train_pairs", "eval_pairs", "val_size")),
    *(("model", k) for k in ("kind", "vocab_size", "num_classes", "norm_first", "positions", "pooling")),
    ("model", "tie_embeddings"),
    *(("optim", k) for k in ("betas", "eps")),
    *(("trainer", k) for k in ("max_steps", "val_check_interval", "accumulate_grad_batches")),
    *(("data", k) for k in ("image_size", "crop_pct")),
    *(("model", k) for k in ("patch_size", "drop_path", "patch_kernel", "stem")),
    *(("model", k) for k in ("activation", "attn_drop", "ffn_drop", "init")),
]

SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "trainer": TrainerConfig,
}
RunConfig.sections = SECTIONS
assert tuple(SECTIONS) == COMMON_SECTIONS


def config_class(task: Any) -> type[RunConfig]:
    """The run config class of ``task`` (a name): :class:`RunConfig` with the sections and keys the task declares in
    :attr:`~primaldual.tasks.Task.config`; :class:`~primaldual.utils.errors.ConfigError` for an unknown task."""
    return _task_class(get_task(task))


@cache  # one class per registered task object
def _task_class(task: Task) -> type[RunConfig]:
    if not task.config:
        return RunConfig
    sections, new, added = dict(SECTIONS), [], []
    for name, parts in config_parts(task).items():
        base = SECTIONS.get(name)
        own = [f.name for c in parts for f in fields(c)]
        common = {f.name for f in fields(base)} if base else set()
        if dup := sorted({k for k in own if own.count(k) > 1} | (set(own) & common)):
            raise ValueError(f"task {task.name!r}: {name}.{dup[0]} is a common key or declared twice")
        # fields in the order given, after the common section's (dataclasses collect them from the last base)
        cls = make_dataclass(
            f"{name.title()}Config_{task.name}", [], bases=(*reversed(parts), *([base] if base else []))
        )
        added += [(name, None)] if base is None else [(name, k) for k in own]
        sections[name] = cls
        new.append((name, cls, field(default_factory=cls)))
    namespace = {"sections": sections, "added": tuple(added)}
    return make_dataclass(f"RunConfig_{task.name}", new, bases=(RunConfig,), namespace=namespace)


def every_default() -> dict[str, Any]:
    """The default of every key a registered task's config may hold: the common ones, and each task-owned key or
    section at its owners' default (:func:`~primaldual.tasks.base.exclusive_keys`)."""
    defaults = RunConfig().to_dict()
    for (section, key), owners in exclusive_keys().items():
        theirs = config_class(sorted(owners)[0])().to_dict()[section]
        if key is None:
            defaults.setdefault(section, theirs)
        else:
            defaults.setdefault(section, {}).setdefault(key, theirs[key])
    return defaults
