"""The run config's schema: one plain dataclass per section, and :class:`RunConfig` with its fingerprint.

Sections: ``data``, ``model``, ``optim``, ``schedule``, ``trainer``, and ``rl`` / ``augment``, read only by the
tasks that declare them (:attr:`primaldual.tasks.Task.sections`). What each key means for a task is documented
with the task (:mod:`primaldual.tasks`) and in ``docs/configs.md``. Loading: :mod:`primaldual.train.config`;
value checks: :mod:`primaldual.train.validate`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from typing import Any

from ..data.augment import AugmentSettings
from ..tasks.base import get_task

__all__ = [
    "SECTIONS",
    "AugmentConfig",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RLConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
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
        d["trainer"].pop("logger")
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
    "rl": RLConfig,
    "augment": AugmentConfig,
}
