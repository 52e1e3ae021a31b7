"""``primaldual convert`` for a classifier run (tasks ``uea``, ``vision`` and the one-input LRA tasks): a trained
softmax encoder turned Primal.+ or PrimalFormer, initialised from the teacher, trained layer-wise on its attention
outputs (stage 1), then fine-tuned on its own task (stage 2, the runner of ``primaldual fit``).

A conversion config (YAML; shipped ones are named ``<family>/<dataset>/convert/<name>`` and live in
``configs/<family>/_convert/<dataset>/<name>.yaml``)::

    student: primal                  # the bidirectional student (primaldual.convert.BIDIRECTIONAL_STUDENTS)
    layers: [-1]                     # block indices (negative from the end) or all
    options: {s: 16, eta: 0.05, max_len: 50}   # the primal layer's options (data-dependent W_e, W_r by default)
    init: teacher                    # teacher (KSVD + least squares) | random (the layer's own)
    calibration_batches: 4           # training batches the initialisation is computed on
    stage1: {steps: 200, lr: 0.0003} # attention-transfer updates (0: none) and Adam's learning rate
    stage2: {trainer: {max_steps: 429}, optim: {lr: 0.001}}   # overrides of the teacher's run config

Stage 2 is the teacher's own recipe (data, batch, optimiser, schedule, augmentation, protocol) with ``stage2``'s
overrides, each checked as ``primaldual fit`` checks a ``--key value``: the budget (``trainer.max_steps`` or
``trainer.max_epochs``, as the task counts), the learning rate, the warm-up; of the model only its regularisers
(:data:`STAGE2_MODEL_KEYS`). Stage 1 takes its batch size from the same config (``data.batch_size``). The run directory is an ordinary run's
(``config.yaml`` is the converted model's, so ``test``, ``validate`` and ``analyze`` work on it; a second call reports
or resumes it) plus ``convert.yaml`` and ``convert/`` (:mod:`.conversion`). ``summary.json`` gains a ``convert``
section: the teacher's test accuracy and the change.

The stage-1 batches are the training split in a seeded order, as the training step feeds the model (a vision run's
batch augmentation included: the student learns the teacher's attention on the inputs the model trains on). Models that take more than one input besides the mask
(LRA retrieval's two documents) are refused: their shared tower runs twice per forward.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.utils.data import default_collate

from ..options import check_int, check_number
from ..train.config import ConfigError, RunConfig, apply_overrides
from ..train.validate import validate_config
from ..utils.io import atomic_write_json, atomic_write_text
from .conversion import check_plan, config_name, conversion_record, load_convert_config, load_teacher, run_stage1
from .convert_configs import convert_config_names

__all__ = [
    "STAGE2_MODEL_KEYS",
    "ClassifierConvertConfig",
    "ClassifierStage1",
    "convert_classifier_run",
    "student_config",
    "train_batches",
]


@dataclass
class ClassifierStage1:
    """Attention transfer: ``steps`` updates on training batches (0: none), Adam at ``lr``."""

    steps: int = 200
    lr: float = 3e-4


@dataclass
class ClassifierConvertConfig:
    """A classifier's conversion (see the module docstring)."""

    SECTIONS: ClassVar[dict[str, type]] = {"stage1": ClassifierStage1}

    student: str = "primal"
    layers: Any = field(default_factory=lambda: [-1])
    options: dict[str, Any] = field(default_factory=dict)
    init: str = "teacher"
    calibration_batches: int = 4
    stage1: ClassifierStage1 = field(default_factory=ClassifierStage1)
    stage2: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> ClassifierConvertConfig:
        from ..convert import INITS
        from ..convert.students import check_student

        if not isinstance(self.options, dict):
            raise ConfigError(f"options: expected a mapping of the student's options, got {self.options!r}")
        try:
            check_student(self.student, self.options, causal=False)
        except ValueError as e:
            raise ConfigError(f"student: {e}") from None
        if self.init not in INITS:
            raise ConfigError(f"init: expected one of {', '.join(INITS)}, got {self.init!r}")
        layers = self.layers
        ok = layers == "all" or (
            isinstance(layers, list) and layers and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
        )
        if not ok:
            raise ConfigError(f"layers: expected 'all' or a non-empty list of ints, got {layers!r}")
        if not isinstance(self.stage2, dict):
            raise ConfigError(f"stage2: expected a mapping of run-config overrides, got {self.stage2!r}")
        try:
            check_int("calibration_batches", self.calibration_batches, low=1)
            check_int("stage1.steps", self.stage1.steps, low=0)
            check_number("stage1.lr", self.stage1.lr, low=0.0, low_open=True)
        except (TypeError, ValueError) as e:
            raise ConfigError(str(e)) from None
        return self


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"trainer": {"max_steps": 5}}`` -> ``{"trainer.max_steps": 5}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(_flatten(value, f"{name}.") if isinstance(value, dict) else {name: value})
    return flat


#: the model keys stage 2 may change: regularisers, which leave the weights' shapes as the teacher's
STAGE2_MODEL_KEYS = ("model.dropout", "model.drop_path", "model.attn_drop", "model.ffn_drop")


def _overrides(values: dict[str, Any]) -> list[str]:
    return [a for k, v in values.items() for a in (f"--{k}", json.dumps(v))]  # JSON values are YAML


def student_config(tcfg: RunConfig, conv: ClassifierConvertConfig, name: str, seed: int) -> RunConfig:
    """The converted run's config: the teacher's, with the student layers and ``stage2``'s overrides."""
    from ..convert import student_plan

    chosen = check_plan(conv, tcfg)
    base = tcfg.model.attention if isinstance(tcfg.model.attention, str) else None
    if base != "softmax":
        raise ConfigError(f"the teacher must have softmax attention in every layer, got {tcfg.model.attention!r}")
    names, options = student_plan(tcfg.model.depth, conv.student, chosen, causal=False, **conv.options)
    own = {"name": f"{tcfg.name}-{name}", "seed": seed, "model.attention": names, "model.attention_options": options}
    stage2 = _flatten(conv.stage2)
    if clash := sorted(set(stage2) & set(own)):
        raise ConfigError(f"stage2: {', '.join(clash)} is set by the conversion; leave it out")
    if shaped := sorted(k for k in stage2 if k.startswith("model.") and k not in STAGE2_MODEL_KEYS):
        raise ConfigError(
            f"stage2: {', '.join(shaped)} would change the teacher's model; stage 2 may set "
            f"{', '.join(STAGE2_MODEL_KEYS)} of it"
        )
    plan = validate_config(apply_overrides(tcfg, _overrides(own)))  # the student's options, named as such
    try:
        return validate_config(apply_overrides(plan, _overrides(stage2)))
    except ConfigError as e:
        raise ConfigError(f"stage2: {e}") from None


def train_batches(dm: Any, module: Any, batch_size: int, seed: int) -> Iterator[tuple[Tensor, Tensor | None]]:
    """Endless ``(inputs, mask or None)`` batches of the training split, in a seeded order, as the teacher's
    Lightning ``module`` feeds its model in training (its ``training_inputs``: a vision run's crops, flips and mixes)
    (stage 1, calibration). A model of more than one input besides its mask is refused here, before any batch is
    drawn."""
    ds = dm.datasets["train"]
    if len(ds) < batch_size:  # every batch would be short, and short ones are skipped
        raise ConfigError(
            f"data.batch_size: {batch_size} exceeds the {len(ds)} training examples, so stage 1 has no whole batch; "
            "set stage2.data.batch_size (stage 1 and 2 share it) to at most that"
        )
    width = len(ds[0]) - 1  # the model's inputs before the label
    if width not in (1, 2):
        raise ConfigError(
            f"the teacher's model takes {width} inputs (LRA retrieval's two documents and masks): its shared tower "
            "runs twice per forward, which stage 1 cannot read; convert a one-input classifier"
        )

    def stream() -> Iterator[tuple[Tensor, Tensor | None]]:
        g = torch.Generator().manual_seed(seed)
        while True:
            for idx in torch.randperm(len(ds), generator=g).split(batch_size):
                if len(idx) < batch_size:
                    continue
                inputs = module.training_inputs(tuple(default_collate([ds[int(i)] for i in idx])), g)
                yield inputs[0], (inputs[1] if width == 2 else None)

    return stream()


def convert_classifier_run(
    teacher_dir: str | os.PathLike,
    config: str | None,
    *,
    overrides: list[tuple[str, Any]] = (),
    seed: int = 0,
    run_dir: str | os.PathLike | None = None,
    fresh: bool = False,
    verbose: bool = True,
) -> dict[str, Any]:
    """Convert the classifier of the run ``teacher_dir`` as the conversion ``config`` says; returns the summary.

    Args:
        teacher_dir: a finished ``primaldual fit`` run of a softmax classifier.
        config: a conversion config (``<family>/<dataset>/convert/<name>`` or a YAML path); None: the shipped
            ``primal_plus`` of the teacher's family and dataset. overrides: ``(key, value)``.
        seed: the conversion's seed (initialisation, stage-1 batches, stage-2 shuffling and dropout).
        run_dir: default ``runs/<task>/<dataset>/<teacher name>-<config name>-...``. fresh: start over there.
    """
    from ..train.run import fit
    from ..train.rundir import check_run_dir, default_run_dir
    from .base import get_task
    from .classification import ClassificationTask

    teacher_dir = Path(teacher_dir)
    check_int("--seed", seed, low=0)
    tcfg, dm, tmodule, tsummary = load_teacher(teacher_dir)
    if not isinstance(get_task(tcfg.task), ClassificationTask):
        raise ConfigError(
            f"{teacher_dir}: a run of task {tcfg.task!r}; primaldual convert takes a language model (task lm) or a "
            "classifier (uea, vision, the one-input lra tasks)"
        )
    if config is None:
        config = _default_config(tcfg)
    conv = load_convert_config(config, overrides, ClassifierConvertConfig)
    teacher = tmodule.model.eval()
    name = config_name(config)
    cfg = student_config(tcfg, conv, name, seed)
    # (refuses a two-input model, or a batch larger than the training split, before anything is written)
    batches = train_batches(dm, tmodule, cfg.data.batch_size, seed)
    run_dir = check_run_dir(run_dir if run_dir is not None else default_run_dir(cfg), fresh)
    record = {
        "convert": asdict(conv),
        "config": config,
        "teacher": {"run_dir": str(teacher_dir.resolve()), "test_acc": tsummary.get("test_acc")},
    }
    text = conversion_record(run_dir, record, fresh)

    def before_training(module: Any, rd: Path, resuming: bool) -> None:
        if not resuming:
            atomic_write_text(rd / "convert.yaml", text)
            run_stage1(teacher, module.model, conv, batches, conv.stage1.steps, seed, rd, verbose=verbose)

    summary = fit(cfg, run_dir, fresh=fresh, verbose=verbose, before_training=before_training)
    stage1 = json.loads((run_dir / "convert" / "stage1.json").read_text())
    tacc, acc = tsummary.get("test_acc"), summary.get("test_acc")
    summary["convert"] = {
        **record,
        "test_acc_change": (acc - tacc) if acc is not None and tacc is not None else None,
        "stage1": {k: stage1.get(k) for k in ("first", "last", "init_figures", "steps")},
    }
    atomic_write_json(run_dir / "summary.json", summary)
    if verbose and acc is not None:
        print(f"converted: test accuracy {100 * acc:.2f}%" + (f" (teacher {100 * tacc:.2f}%)" if tacc else ""))
    return summary


def _default_config(tcfg: RunConfig) -> str:
    """The shipped ``primal_plus`` conversion of the teacher's family and dataset."""
    family = tcfg.task.split("_")[0]  # lra_listops -> lra
    dataset = str(tcfg.data.name)
    name = f"{family}/{dataset}/convert/primal_plus"
    if name in convert_config_names():
        return name
    shipped = ", ".join(convert_config_names(family)) or "none"
    raise ConfigError(f"--config: none shipped for {family}/{dataset} (shipped for {family}: {shipped}); give a .yaml")
