"""Run configuration: a few dataclasses, loaded from YAML, overridden from the command line, validated.

A config file has the sections ``data``, ``model``, ``optim``, ``trainer`` and the top-level keys ``name``,
``task``, ``protocol``, ``seed``. Overrides use Lightning-CLI style dotted flags (``--model.attention primal``,
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


class ConfigError(ValueError):
    """A bad config file, key or value; the message names it."""


@dataclass
class DataConfig:
    """UEA data. ``root``: folder with ``<name>_TRAIN.ts`` / ``<name>_TEST.ts`` (None: the cache);
    ``fetch``: obtain JapaneseVowels automatically when it is missing; ``val_fraction``: stratified share of
    TRAIN held out for validation (heldout protocol)."""

    name: str = "JapaneseVowels"
    root: str | None = None
    fetch: bool = True
    val_fraction: float = 0.2
    batch_size: int = 16
    eval_batch_size: int = 256
    num_workers: int = 0


@dataclass
class ModelConfig:
    """Time-series classifier (see :class:`primaldual.models.TimeSeriesClassifier`)."""

    dim: int = 512
    depth: int = 2
    num_heads: int = 8
    ffn_dim: int = 2048
    dropout: float = 0.1
    attention: Any = "primal"  # a registry name, or one name per layer
    attention_options: Any = None  # a dict, or one dict (or null) per layer


@dataclass
class OptimConfig:
    """Optimiser (constant learning rate, as the UEA reference)."""

    name: str = "radam"
    lr: float = 1e-3
    weight_decay: float = 0.0


@dataclass
class TrainerConfig:
    """Arguments passed to ``lightning.Trainer`` (see its documentation)."""

    max_epochs: int = 100
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
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """Short hash of everything that changes the result (not the progress bar): names the run directory."""
        d = self.to_dict()
        d["trainer"].pop("enable_progress_bar")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]

    def validate(self) -> RunConfig:
        if self.task != "uea":
            raise ConfigError(f"task: only 'uea' (time-series classification) is wired to the CLI, got {self.task!r}")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol: expected one of {PROTOCOLS}, got {self.protocol!r}")
        if self.optim.name not in OPTIMIZERS:
            raise ConfigError(f"optim.name: expected one of {OPTIMIZERS}, got {self.optim.name!r}")
        for key, v in (("data.batch_size", self.data.batch_size), ("trainer.max_epochs", self.trainer.max_epochs)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{key}: expected a positive int, got {v!r}")
        if not isinstance(self.seed, int):
            raise ConfigError(f"seed: expected an int, got {self.seed!r}")
        return self


_SECTIONS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "trainer": TrainerConfig}


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


def list_configs(prefix: str = "uea/") -> list[str]:
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
