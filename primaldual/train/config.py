"""Run configuration: a few dataclasses, loaded from YAML, overridden from the command line, validated.

A config file has the sections ``data``, ``model``, ``optim``, ``schedule``, ``trainer`` and the top-level keys
``name``, ``task``, ``protocol``, ``seed``. ``task`` is ``uea`` (time-series classification, epoch-based) or one of
the Long-Range Arena tasks ``lra_listops``, ``lra_text``, ``lra_retrieval``, ``lra_image``, ``lra_pathfinder``
(step-based: ``trainer.max_steps`` with an evaluation every ``trainer.val_check_interval`` steps). Overrides use Lightning-CLI style dotted flags (``--model.attention primal``,
``--trainer.max_epochs=5``, values parsed as YAML) plus one shortcut, ``--attention NAME``, that puts ``NAME`` in
every layer and drops the mechanism options of the config (they belong to the old mechanism).

Hand-written rather than LightningCLI/jsonargparse because the run directory, resume-by-default and the two
evaluation protocols sit around ``Trainer.fit`` rather than inside it, and the schema is four small dataclasses;
an unknown key (in a file or a flag) is an error that names the key and lists the valid ones.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "apply_overrides",
    "config_dir",
    "dump_config",
    "find_config",
    "list_configs",
    "load_config",
]

PROTOCOLS = ("heldout", "paper")
OPTIMIZERS = ("radam", "adam", "adamw", "sgd")
LRA_TASKS = ("lra_listops", "lra_text", "lra_retrieval", "lra_image", "lra_pathfinder")
TASKS = ("uea", *LRA_TASKS)
MODEL_KINDS = ("auto", "timeseries", "sequence", "retrieval")
DECAYS = ("constant", "linear", "cosine")


class ConfigError(ValueError):
    """A bad config file, key or value; the message names it."""


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


@dataclass
class ModelConfig:
    """The task model. ``kind``: ``timeseries`` (:class:`~primaldual.models.TimeSeriesClassifier`, post-LN),
    ``sequence`` (:class:`~primaldual.models.SequenceClassifier`, LRA) or ``retrieval``
    (:class:`~primaldual.models.RetrievalClassifier`); ``auto`` picks it from the task. ``vocab_size`` /
    ``num_classes``: None takes them from the data (a value that disagrees with the data is an error).
    ``norm_first``, ``positions``, ``pooling``: token models only."""

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

    def resolved_kind(self, task: str) -> str:
        if self.kind != "auto":
            return self.kind
        return {"uea": "timeseries", "lra_retrieval": "retrieval"}.get(task, "sequence")


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
    ``cosine`` to 0). ``total_steps`` None: ``trainer.max_steps``."""

    warmup_steps: int = 0
    decay: str = "constant"
    total_steps: int | None = None


@dataclass
class TrainerConfig:
    """Arguments passed to ``lightning.Trainer`` (see its documentation)."""

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """Short hash of everything that changes the result (not the progress bar): names the run directory.

        Keys added after 0.1.0 enter the hash only when they differ from their default, so the run directories of
        earlier configs keep their names (and still resume).
        """
        d = self.to_dict()
        d["trainer"].pop("enable_progress_bar")
        defaults = RunConfig().to_dict()
        for section, key in _ADDED_KEYS:
            node, ref = (d, defaults) if section is None else (d[section], defaults[section])
            if node.get(key) == ref.get(key):
                node.pop(key, None)
        if d["schedule"] == defaults["schedule"]:
            d.pop("schedule")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]

    @property
    def step_based(self) -> bool:
        """True when training is counted in optimiser steps (``trainer.max_steps > 0``), as LRA."""
        return self.trainer.max_steps > 0

    def validate(self) -> RunConfig:
        if self.task not in TASKS:
            raise ConfigError(f"task: expected one of {TASKS}, got {self.task!r}")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol: expected one of {PROTOCOLS}, got {self.protocol!r}")
        if self.task != "uea" and self.protocol == "paper":
            raise ConfigError("protocol: 'paper' (select on test) is the UEA reference protocol; LRA uses 'heldout'")
        if self.optim.name not in OPTIMIZERS:
            raise ConfigError(f"optim.name: expected one of {OPTIMIZERS}, got {self.optim.name!r}")
        if self.model.kind not in MODEL_KINDS:
            raise ConfigError(f"model.kind: expected one of {MODEL_KINDS}, got {self.model.kind!r}")
        kind = self.model.resolved_kind(self.task)
        if (kind == "timeseries") != (self.task == "uea"):
            raise ConfigError(f"model.kind: {kind!r} does not fit task {self.task!r}")
        if self.model.positions not in ("learned", "sinusoidal"):
            raise ConfigError(f"model.positions: expected 'learned' or 'sinusoidal', got {self.model.positions!r}")
        if self.model.pooling not in ("mean", "cls"):
            raise ConfigError(f"model.pooling: expected 'mean' or 'cls', got {self.model.pooling!r}")
        if self.schedule.decay not in DECAYS:
            raise ConfigError(f"schedule.decay: expected one of {DECAYS}, got {self.schedule.decay!r}")
        b = self.optim.betas
        if b is not None and not (isinstance(b, list | tuple) and len(b) == 2 and all(0 <= x < 1 for x in b)):
            raise ConfigError(f"optim.betas: expected two numbers in [0, 1), got {b!r}")
        positive = [("data.batch_size", self.data.batch_size), ("data.eval_batch_size", self.data.eval_batch_size)]
        if self.step_based:
            positive.append(("trainer.max_steps", self.trainer.max_steps))
            if self.trainer.val_check_interval is not None:
                positive.append(("trainer.val_check_interval", self.trainer.val_check_interval))
        else:
            positive.append(("trainer.max_epochs", self.trainer.max_epochs))
            if self.task != "uea":
                raise ConfigError(f"trainer.max_steps: task {self.task!r} is step-based; set a positive max_steps")
        if self.data.max_len is not None:
            positive.append(("data.max_len", self.data.max_len))
        for key, v in positive:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{key}: expected a positive int, got {v!r}")
        for key, v in (("schedule.warmup_steps", self.schedule.warmup_steps),):
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"{key}: expected an int >= 0, got {v!r}")
        if not isinstance(self.seed, int):
            raise ConfigError(f"seed: expected an int, got {self.seed!r}")
        return self


# (section, key) of config keys introduced after 0.1.0 (see RunConfig.fingerprint)
_ADDED_KEYS = [
    *(("data", k) for k in ("max_len", "tokenisation", "stand_in", "train_pairs", "eval_pairs", "val_size")),
    *(("model", k) for k in ("kind", "vocab_size", "num_classes", "norm_first", "positions", "pooling")),
    *(("optim", k) for k in ("betas", "eps")),
    *(("trainer", k) for k in ("max_steps", "val_check_interval")),
]

_SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "trainer": TrainerConfig,
}


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(values).__name__}")
    valid = {f.name for f in fields(cls)}
    for key in values:
        if key not in valid:
            full = f"{where}.{key}" if where else key
            raise ConfigError(f"unknown config key {full!r}; valid keys here: {sorted(valid)}")
    kwargs = {}
    for key, value in values.items():
        if key in _SECTIONS and not where:
            kwargs[key] = _build(_SECTIONS[key], value or {}, key)
        else:
            kwargs[key] = value
    return cls(**kwargs)


def config_dir() -> Path:
    """The repository's ``configs/`` folder (next to the package in a source checkout), else ``./configs``."""
    here = Path(__file__).resolve().parents[2] / "configs"
    return here if here.is_dir() else Path.cwd() / "configs"


def list_configs(prefix: str = "") -> list[str]:
    """Names of the configs this CLI runs (under ``configs/<prefix>``), relative to :func:`config_dir`."""
    root = config_dir()
    names = (str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
    return sorted(n for n in names if n.startswith(prefix))


def find_config(spec: str) -> Path:
    """A config path, or a name such as ``uea/JapaneseVowels/primalformer`` under :func:`config_dir`."""
    p = Path(spec).expanduser()
    for cand in (p, config_dir() / spec, config_dir() / f"{spec}.yaml"):
        if cand.is_file():
            return cand
    raise ConfigError(
        f"config {spec!r} not found (neither a file nor a name under {config_dir()}; see `primaldual configs`)"
    )


def load_config(spec: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (``None``: all defaults) and apply command-line overrides."""
    values: dict[str, Any] = {}
    if spec is not None:
        path = find_config(str(spec))
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        values.setdefault("name", path.stem)
        try:
            cfg = _build(RunConfig, values, "")
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    else:
        cfg = RunConfig()
    return apply_overrides(cfg, overrides or []).validate()


def apply_overrides(cfg: RunConfig, args: list[str]) -> RunConfig:
    """Apply ``--a.b value`` / ``--a.b=value`` / ``--attention NAME`` flags (values parsed as YAML)."""
    pairs: list[tuple[str, str]] = []
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
        pairs.append((key, val))
        i += 1
    d = cfg.to_dict()
    for key, raw in pairs:
        value = yaml.safe_load(raw) if raw != "" else None
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
    """YAML text of a resolved config (what the run directory stores)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
