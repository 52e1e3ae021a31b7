"""``primaldual convert``: a trained softmax LM run -> a converted run directory (stage 1, then stage 2 by ``fit``).

A conversion config (YAML; shipped ones are named ``lm/<corpus>/convert/<name>`` and live in
``configs/lm/_convert/<corpus>/<name>.yaml``) says what to convert and with which budget::

    student: primal                  # primal | hybrid | window (primaldual.convert.STUDENTS)
    layers: [-1]                     # block indices (negative from the end) or all
    options: {s: 30, eta: 0.1}       # the student mechanism's options
    init: teacher                    # teacher (KSVD + least squares) | random (the layers' own)
    calibration_batches: 4           # training batches the initialisation is computed on
    stage1: {tokens: 409600, lr: 0.0003}
    stage2: {tokens: 819200, lr: 0.0002, warmup_steps: 20, decay: cosine, kl: 0.0}

The teacher is a ``CausalLM`` run directory (its ``config.yaml`` and best checkpoint, read in the safe mode). The
student's run config is the teacher's with the converted layers' attention, the stage-2 optimiser settings and
``max_steps`` from ``stage2.tokens``; its run directory is an ordinary one (``config.yaml``, checkpoints, resume,
``history.csv``, ``summary.json``, so ``generate``, ``test`` and ``analyze`` work on it) plus:

    convert.yaml            the conversion config and the teacher (path, test perplexity)
    convert/stage1.pt       the converted model's weights after stage 1 (atomic; a resume starts stage 2 from it)
    convert/stage1.json     per layer: the initialisation figures, the stage-1 loss before and after, J^2
    convert/stage1.csv      the stage-1 history

Stage 1 runs once, before stage 2's first update (a run killed during it redoes it); stage 2 resumes as ``fit``
does. ``summary.json`` gains a ``convert`` section (the tokens of each stage, the teacher's perplexity, the ratio).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from ...options import check_int, check_number
from ...train.config import ConfigError, RunConfig, apply_overrides
from ...train.validate import validate_config
from ...utils.io import atomic_write_json, atomic_write_text
from ..conversion import CONVERT_ENTRIES, check_plan, config_name, conversion_record, find_convert_config, run_stage1
from ..conversion import load_convert_config as load_config
from ..conversion import load_teacher as load_run_teacher

__all__ = [
    "CONVERT_ENTRIES",
    "ConvertConfig",
    "convert_run",
    "find_convert_config",
    "load_convert_config",
    "load_teacher",
    "student_config",
    "train_batches",
]


@dataclass
class Stage1:
    """Attention transfer: ``tokens`` of training data (rounded up to whole batches), Adam at ``lr``."""

    tokens: int = 409_600
    lr: float = 3e-4


@dataclass
class Stage2:
    """End-to-end LM training of the converted model: ``tokens``, AdamW at ``lr``, the schedule, and ``kl``: the weight
    of ``KL(teacher || model)`` over the target tokens added to the loss (0: the LM loss alone). ``lora``: the rank
    of adapters on the converted layers' projections (alpha 2r), with every other teacher weight frozen and the
    students' new parameters trained in full (0: the whole model trains, as without adapters). A ``CausalLM`` run's
    checkpoints store the adapted weights merged (:func:`~primaldual.convert.lora.fold_lora`)."""

    tokens: int = 819_200
    lr: float = 2e-4
    warmup_steps: int = 20
    decay: str = "cosine"
    kl: float = 0.0
    lora: int = 0


@dataclass
class ConvertConfig:
    """A conversion (see the module docstring)."""

    SECTIONS: ClassVar[dict[str, type]] = {"stage1": Stage1, "stage2": Stage2}

    student: str = "primal"
    layers: Any = field(default_factory=lambda: [-1])
    options: dict[str, Any] = field(default_factory=dict)
    init: str = "teacher"
    calibration_batches: int = 4
    stage1: Stage1 = field(default_factory=Stage1)
    stage2: Stage2 = field(default_factory=Stage2)
    # the text a Hugging Face teacher is converted on (:class:`.convert_hf.HFData`); a primaldual run brings its own
    data: dict[str, Any] | None = None

    def validate(self) -> ConvertConfig:
        from ...convert import INITS, STUDENTS

        if self.student not in STUDENTS:
            raise ConfigError(f"student: expected one of {', '.join(STUDENTS)}, got {self.student!r}")
        if self.init not in INITS:
            raise ConfigError(f"init: expected one of {', '.join(INITS)}, got {self.init!r}")
        layers = self.layers
        ok = layers == "all" or (
            isinstance(layers, list) and layers and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
        )
        if not ok:
            raise ConfigError(f"layers: expected 'all' or a non-empty list of ints, got {layers!r}")
        if self.data is not None and not isinstance(self.data, dict):
            raise ConfigError(f"data: expected a mapping (text, context, batch_size, ...), got {self.data!r}")
        if not isinstance(self.options, dict):
            raise ConfigError(f"options: expected a mapping of the student's options, got {self.options!r}")
        try:
            check_int("calibration_batches", self.calibration_batches, low=1)
            check_int("stage1.tokens", self.stage1.tokens, low=0)
            check_number("stage1.lr", self.stage1.lr, low=0.0, low_open=True)
            check_int("stage2.tokens", self.stage2.tokens, low=1)
            check_number("stage2.lr", self.stage2.lr, low=0.0, low_open=True)
            check_int("stage2.warmup_steps", self.stage2.warmup_steps, low=0)
            check_number("stage2.kl", self.stage2.kl, low=0.0)
            check_int("stage2.lora", self.stage2.lora, low=0)
        except (TypeError, ValueError) as e:
            raise ConfigError(str(e)) from None
        if self.student == "window" and (self.stage1.tokens or self.init != "teacher"):
            raise ConfigError(
                "student 'window' has no new parameters: stage1.tokens must be 0 and init left at 'teacher' "
                "(nothing is initialised)"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """The values, without the keys added since 0.1 at their defaults (``data``, ``stage2.lora``): the record in
        ``convert.yaml`` of an earlier conversion reads the same, so it still resumes."""
        d = asdict(self)
        if d["data"] is None:
            d.pop("data")
        if d["stage2"]["lora"] == 0:
            d["stage2"].pop("lora")
        return d


def load_convert_config(spec: str, overrides: list[tuple[str, Any]] = ()) -> ConvertConfig:
    """Read a conversion config and apply ``(dotted key, value)`` overrides."""
    return load_config(spec, overrides, ConvertConfig)


# ------------------------------------------------------------------------------------------------------------------
def load_teacher(teacher_dir: Path) -> tuple[RunConfig, Any, Any, dict[str, Any]]:
    """The teacher's config, data module, Lightning module (best weights loaded) and summary."""
    return load_run_teacher(teacher_dir, "lm")  # the CausalLM kind (task lm's)


def student_config(tcfg: RunConfig, conv: ConvertConfig, name: str, seed: int, tokens_per_update: int) -> RunConfig:
    """The converted run's config: the teacher's, with the student layers, the stage-2 optimiser and budget."""
    from ...convert import student_plan

    chosen = check_plan(conv, tcfg)
    base = tcfg.model.attention if isinstance(tcfg.model.attention, str) else None
    if base != "softmax":
        raise ConfigError(f"the teacher must have softmax attention in every layer, got {tcfg.model.attention!r}")
    names, options = student_plan(tcfg.model.depth, conv.student, chosen, **conv.options)
    steps = max(1, math.ceil(conv.stage2.tokens / tokens_per_update))
    sets = {
        "name": f"{tcfg.name}-{name}",
        "seed": seed,
        "model.attention": names,
        "model.attention_options": options,
        "optim.lr": conv.stage2.lr,
        "schedule.warmup_steps": conv.stage2.warmup_steps,
        "schedule.decay": conv.stage2.decay,
        "schedule.total_steps": None,
        "trainer.max_steps": steps,
        "trainer.val_check_interval": max(1, steps // 2),
    }
    args = [a for k, v in sets.items() for a in (f"--{k}", json.dumps(v))]  # JSON values are YAML
    return validate_config(apply_overrides(tcfg, args))


def train_batches(dm: Any, batch_size: int, seed: int):
    """Endless ``(ids, None)`` batches of the training chunks, in a seeded order (stage 1 and calibration)."""
    ds = dm.datasets["train"]
    g = torch.Generator().manual_seed(seed)
    while True:
        for idx in torch.randperm(len(ds), generator=g).split(batch_size):
            if len(idx) < batch_size:
                continue
            ids = torch.stack([ds[int(i)][0] for i in idx])  # (B, T)
            yield ids, None


def _stage1(
    conv: ConvertConfig, teacher: Any, model: Any, dm: Any, cfg: RunConfig, run_dir: Path, verbose: bool
) -> None:
    """Swap, initialise and run stage 1 on the seeded training chunks (:func:`~primaldual.tasks.conversion.run_stage1`)."""
    B = cfg.data.batch_size
    steps = math.ceil(conv.stage1.tokens / (B * cfg.data.max_len)) if conv.stage1.tokens else 0
    batches = train_batches(dm, B, cfg.seed)
    extra = {"tokens": steps * B * cfg.data.max_len}
    run_stage1(teacher, model, conv, batches, steps, cfg.seed, run_dir, verbose=verbose, extra=extra)


def convert_run(
    teacher_dir: str | os.PathLike,
    config: str,
    *,
    overrides: list[tuple[str, Any]] = (),
    seed: int = 0,
    run_dir: str | os.PathLike | None = None,
    fresh: bool = False,
    verbose: bool = True,
) -> dict[str, Any]:
    """Convert the ``CausalLM`` of the run ``teacher_dir`` as the conversion ``config`` says; returns the summary.

    Args:
        teacher_dir: a finished ``primaldual fit`` run of a softmax ``CausalLM`` (task lm).
        config: a conversion config (``lm/<corpus>/convert/<name>`` or a YAML path). overrides: ``(key, value)``.
        seed: the conversion's seed (initialisation, stage-1 batches, stage-2 shuffling and dropout).
        run_dir: default ``runs/lm/<dataset>/<teacher name>-<config name>-...``. fresh: start over there.
    """
    from ...train.run import fit
    from ...train.rundir import check_run_dir, default_run_dir

    teacher_dir = Path(teacher_dir)
    conv = load_convert_config(config, overrides)
    if conv.data is not None:
        raise ConfigError(
            f"{config}: data: only a Hugging Face teacher takes a data section; a primaldual run is converted on "
            "its own data (its config.yaml's)"
        )
    check_int("--seed", seed, low=0)
    tcfg, dm, tmodule, tsummary = load_teacher(teacher_dir)
    teacher = tmodule.model.eval()
    name = config_name(config)
    cfg = student_config(tcfg, conv, name, seed, tcfg.data.batch_size * tcfg.data.max_len)
    run_dir = check_run_dir(run_dir if run_dir is not None else default_run_dir(cfg), fresh)
    record = {
        "convert": conv.to_dict(),
        "config": config,
        "teacher": {"run_dir": str(teacher_dir.resolve()), "test_ppl": tsummary.get("test_ppl")},
    }
    text = conversion_record(run_dir, record, fresh)

    def before_training(module: Any, rd: Path, resuming: bool) -> None:
        if not resuming:
            atomic_write_text(rd / "convert.yaml", text)
            _stage1(conv, teacher, module.model, dm, cfg, rd, verbose)
        if conv.stage2.kl > 0:
            module.distill_from(teacher, conv.stage2.kl)
        if conv.stage2.lora:  # after stage 1 (whose weights are plain); on a resume, before the checkpoint loads
            from ...convert import add_lora, find_blocks
            from ...integrations.torch_nn import resolve_layer_indices

            blocks = find_blocks(module.model)
            chosen = resolve_layer_indices(conv.layers, len(blocks))
            add_lora(
                module.model, r=conv.stage2.lora, alpha=2.0 * conv.stage2.lora, layers=[blocks[i].attn for i in chosen]
            )

    summary = fit(cfg, run_dir, fresh=fresh, verbose=verbose, before_training=before_training)
    stage1 = json.loads((run_dir / "convert" / "stage1.json").read_text())
    tppl = tsummary.get("test_ppl")
    summary["convert"] = {
        **record,
        "stage1_tokens": stage1.get("tokens", 0),
        "stage2_tokens": cfg.trainer.max_steps * cfg.data.batch_size * cfg.data.max_len,
        "ppl_ratio_to_teacher": (summary["test_ppl"] / tppl) if tppl and summary.get("test_ppl") else None,
        "stage1": {k: stage1.get(k) for k in ("first", "last", "init_figures", "steps")},
    }
    atomic_write_json(run_dir / "summary.json", summary)
    if verbose:
        ratio = summary["convert"]["ppl_ratio_to_teacher"]
        print(
            f"converted: test ppl {summary.get('test_ppl'):.2f}"
            + (f" ({ratio:.3f}x the teacher's {tppl:.2f})" if ratio else "")
        )
    return summary
