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
from dataclasses import asdict, dataclass, field, fields, is_dataclass, make_dataclass
from functools import cache
from typing import Any, ClassVar

from ..tasks.base import COMMON_SECTIONS, Task, get_task

__all__ = [
    "SECTIONS",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "config_class",
]


@dataclass
class DataConfig:
    """The dataset.

    UEA: ``name`` a UEA dataset; ``root`` folder with ``<name>_TRAIN.ts`` / ``<name>_TEST.ts`` (None: the cache);
    ``fetch`` obtains JapaneseVowels automatically when it is missing; ``val_fraction``: stratified share of TRAIN
    held out for validation (heldout protocol; also for LRA data that ships without a validation split).

    LRA (see :mod:`primaldual.tasks.lra.data`): ``name`` the dataset (e.g. ``listops``, ``imdb``,
    ``shakespeare_genre``, ``aan``, ``fashion_mnist``, ``pathfinder32_L14``); ``max_len`` the padded length;
    ``tokenisation`` ListOps' ``brackets`` / ``no_brackets``; ``stand_in`` the obtainable real-data stand-in that an
    error message suggests when the named data is missing (never substituted silently); ``train_pairs`` /
    ``eval_pairs`` pairs drawn per split by the retrieval stand-in; ``val_size``: evaluate a fixed random subset of the
    validation split of this size (cheaper periodic evaluation; the test split is always used whole).

    LM (see :mod:`primaldual.tasks.lm.training`): ``name`` one of :data:`LM_DATASETS`; ``root`` the corpus folder (None: the
    cache); ``max_len`` the tokens per sample (contiguous, non-overlapping chunks); ``val_size`` as LRA, in chunks.

    Vision (see :mod:`primaldual.tasks.vision.training`): ``name`` ``fashion_mnist`` / ``mnist`` (idx files) or any name of an
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
    ``patch_size``, larger for overlapping patches; ``stem``: ``patch`` or ``conv``, a convolutional stem). ``dt``
    (offline RL) also reads ``activation`` (the FFN's, ``gelu`` or ``relu``), ``attn_drop`` (dropout on attention
    weights), ``ffn_drop`` (dropout on the FFN's hidden units, null: ``dropout``) and ``init`` (``pytorch`` or
    ``gpt2``); ``activation: relu, attn_drop: 0.1, ffn_drop: 0.0, init: gpt2`` is Hugging Face's model, see
    :class:`~primaldual.models.DecisionTransformer`."""

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
    activation: str = "gelu"
    attn_drop: float = 0.0
    ffn_drop: float | None = None
    init: str = "pytorch"

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
    logger: str = "csv"  # csv (always written) | tensorboard | wandb (offline unless WANDB_MODE says otherwise)


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
        d["trainer"].pop("compile")  # how the run executes, not what it computes (a resume may switch it)
        d["trainer"].pop("logger")
        defaults = type(self)().to_dict()
        for section, key in _ADDED_KEYS:
            node, ref = (d, defaults) if section is None else (d[section], defaults[section])
            if node.get(key) == ref.get(key):
                node.pop(key, None)
        if d["schedule"] == defaults["schedule"]:
            d.pop("schedule")
        type(self).drop_own_defaults(d)
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
    for name, cls in task.config.items():
        if not (isinstance(name, str) and is_dataclass(cls) and isinstance(cls, type)):
            raise TypeError(f"task {task.name!r}: config maps a section name to a dataclass, got {name!r}: {cls!r}")
        base = SECTIONS.get(name)
        if base is None:  # a section of its own
            added.append((name, None))
        else:  # keys added to a common section
            if clash := sorted({f.name for f in fields(cls)} & {f.name for f in fields(base)}):
                raise ValueError(f"task {task.name!r}: {name}.{clash[0]} is a common key; a task adds keys only")
            cls = make_dataclass(f"{base.__name__}_{task.name}", [], bases=(cls, base))
            added += [(name, f.name) for f in fields(cls) if f.name not in {g.name for g in fields(base)}]
        sections[name] = cls
        new.append((name, cls, field(default_factory=cls)))
    namespace = {"sections": sections, "added": tuple(added)}
    return make_dataclass(f"RunConfig_{task.name}", new, bases=(RunConfig,), namespace=namespace)
