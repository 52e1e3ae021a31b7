"""What ``primaldual convert`` shares for a primaldual run of any task: the conversion config, the teacher run, and
stage 1 inside the run directory.

* **The config** (:func:`load_convert_config`): a YAML file, or a shipped name ``<family>/<dataset>/convert/<name>``
  (:mod:`.convert_configs`), read in the safe mode, with ``--key value`` overrides applied once, each checked as the
  flag it came from. The task's own dataclass says which keys exist (its ``SECTIONS``: the nested dataclasses).
* **The teacher** (:func:`load_teacher`): a finished run's ``config.yaml`` and best checkpoint (read in the safe mode),
  its data module and Lightning module.
* **Stage 1** (:func:`run_stage1`): swap, initialisation and attention transfer on the teacher's training batches
  (:mod:`primaldual.convert`), written to ``convert/`` in the run directory. Every tenth of it writes
  ``convert/stage1.partial.pt`` (the student, Adam's state, the progress and the random state), so a killed stage 1
  continues there on the same batches, to the same weights as an uninterrupted one.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from ..train.checkpoints import load_checkpoint
from ..train.config import ConfigError, RunConfig
from ..train.rundir import run_config
from ..train.yaml_values import load_yaml
from ..utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from .convert_configs import convert_config_names, shipped_convert_config

__all__ = [
    "CONVERT_ENTRIES",
    "build_convert_config",
    "check_plan",
    "config_name",
    "conversion_record",
    "find_convert_config",
    "load_convert_config",
    "load_teacher",
    "run_stage1",
]

#: what a conversion adds to a run directory (primaldual's own entries there)
CONVERT_ENTRIES = ("convert.yaml", "convert")

Batch = tuple[Tensor, Tensor | None]


def find_convert_config(spec: str) -> Path:
    """A conversion config: a YAML path, or a shipped name ``<family>/<dataset>/convert/<name>``."""
    path = Path(spec)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"--config: {path} not found")
        return path
    if (shipped := shipped_convert_config(spec)) is not None:
        return shipped
    names = ", ".join(convert_config_names())
    raise ConfigError(f"--config: no conversion config {spec!r}; shipped: {names} (or a .yaml path)")


def build_convert_config(values: Any, where: str, cls: type) -> Any:
    """``cls(**values)``, validated: unknown keys (also inside its ``SECTIONS``) are named with the valid ones."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: a conversion config is a mapping, got {type(values).__name__}")
    known = _names(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
    kw = dict(values)
    for name, section in cls.SECTIONS.items():
        sub = kw.get(name, {})
        if not isinstance(sub, dict):
            raise ConfigError(f"{where}: {name} must be a mapping, got {sub!r}")
        valid = _names(section)
        bad = sorted(set(sub) - set(valid))
        if bad:
            raise ConfigError(f"{where}: unknown key(s) {name}.{', '.join(bad)}; valid: {', '.join(valid)}")
        kw[name] = section(**sub)
    try:
        return cls(**kw).validate()
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def load_convert_config(spec: str, overrides: list[tuple[str, Any]], cls: type) -> Any:
    """Read a conversion config of the dataclass ``cls`` and apply ``(dotted key, value)`` overrides."""
    path = find_convert_config(spec)
    try:
        values = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    known = _names(cls)
    for key, value in overrides:  # each key checked as the flag it came from, not as a key of the file
        top, _, sub = key.partition(".")
        section = cls.SECTIONS.get(top)
        if top not in known or (section is not None and sub and sub.partition(".")[0] not in _names(section)):
            valid = ", ".join(f"{top}.{f}" for f in _names(section)) if section else ", ".join(known)
            raise ConfigError(f"--{key}: not a key of the conversion config; valid: {valid}")
        node, parts = values, key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--{key}: {part!r} is not a section")
        node[parts[-1]] = value
    return build_convert_config(values, str(path), cls)


def _names(section: type) -> list[str]:
    return [f.name for f in fields(section)]


def config_name(config: str) -> str:
    """The short name of a conversion config (its file's stem, or a shipped name's last part) for run names."""
    return Path(config).stem if config.endswith((".yaml", ".yml")) else config.split("/")[-1]


def conversion_record(run_dir: Path, record: dict[str, Any], fresh: bool) -> str:
    """``record`` (the conversion config, its name and the teacher) as the YAML text of ``convert.yaml``; a run
    directory that holds another conversion is refused unless ``fresh``."""
    text = yaml.safe_dump(record, sort_keys=False)
    saved = run_dir / "convert.yaml"
    if not fresh and saved.is_file() and saved.read_text() != text:
        raise ConfigError(
            f"{run_dir} holds another conversion ({saved}); pass --fresh to start over there or another --run-dir"
        )
    return text


def check_plan(conv: Any, tcfg: RunConfig) -> list[int]:
    """The layers ``conv`` converts in the teacher of config ``tcfg`` (resolved indices), checked before anything is
    written: the indices exist, ``causal`` is left to the teacher's layers, and ``s`` fits the head width where the
    KSVD initialisation needs it (the kernel of a head has rank at most its width)."""
    from ..integrations.torch_nn import resolve_layer_indices

    try:
        chosen = resolve_layer_indices(conv.layers, tcfg.model.depth)
    except (IndexError, TypeError, ValueError) as e:
        raise ConfigError(f"layers: {e}") from None
    if "causal" in conv.options:
        raise ConfigError("options: causal is the teacher's (each student is causal as the layer it replaces)")
    width = tcfg.model.dim // tcfg.model.num_heads
    s = conv.options.get("s", 20)  # (the primal layer's default)
    if conv.init == "teacher" and conv.student != "window" and isinstance(s, int) and s > width:
        raise ConfigError(
            f"options: s={s} exceeds the teacher's head width {width}: the KSVD initialisation has at most {width} "
            "directions; choose a smaller s, or init random"
        )
    return chosen


def load_teacher(teacher_dir: Path, kind: str | None = None) -> tuple[RunConfig, Any, Any, dict[str, Any]]:
    """The teacher run's config, data module, Lightning module (best weights loaded) and summary; ``kind``: the
    model kind it must have (``"lm"``), if any."""
    from ..train.checkpoints import check_fits
    from .base import get_task

    tcfg = run_config(teacher_dir)
    if kind is not None and tcfg.model.resolved_kind(tcfg.task) != kind:
        raise ConfigError(f"{teacher_dir}: the teacher must be a run of model kind {kind!r} (task {tcfg.task})")
    ckpt = teacher_dir / "checkpoints" / "best.ckpt"
    state = load_checkpoint(ckpt)
    task = get_task(tcfg.task)
    dm = task.datamodule(tcfg)
    dm.prepare_data()
    dm.setup("fit")
    module = task.module(tcfg, dm)
    check_fits(module, state, ckpt, str(teacher_dir / "config.yaml"))
    module.load_state_dict(state["state_dict"])
    summary_path = teacher_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return tcfg, dm, module, summary


def _calibration(batches: Iterator[Batch], count: int) -> Batch:
    """``count`` batches as one: inputs concatenated, and masks (None where every one is None)."""
    taken = [next(batches) for _ in range(count)]
    masks = [m for _, m in taken]
    if all(m is None for m in masks):
        return torch.cat([x for x, _ in taken]), None
    return torch.cat([x for x, _ in taken]), torch.cat(
        [torch.ones(x.shape[:2], dtype=torch.bool) if m is None else m for x, m in taken]
    )


def run_stage1(
    teacher: Any,
    model: Any,
    conv: Any,
    batches: Iterator[Batch],
    steps: int,
    seed: int,
    run_dir: Path,
    *,
    verbose: bool,
    extra: dict[str, Any] | None = None,
) -> None:
    """Swap, initialise and run stage 1, then load the result into ``model`` and write ``convert/``.

    Args:
        teacher: the trained model. model: the student model of the run (its weights are set).
        conv: the conversion config (``student``, ``layers``, ``options``, ``init``, ``calibration_batches``,
            ``stage1.lr``).
        batches: the endless seeded stream of ``(inputs, mask)`` training batches (the same from its start on a
            resume: the calibration batches and the updates done are skipped).
        steps: stage-1 updates. seed: the conversion's seed. extra: figures added to ``stage1.json``.
    """
    from ..convert import (
        TransferState,
        attention_transfer,
        find_blocks,
        initialise_students,
        new_parameters,
        swap_attention,
    )

    out = run_dir / "convert"
    saved, partial = out / "stage1.pt", out / "stage1.partial.pt"
    if saved.is_file():
        model.load_state_dict(load_checkpoint(saved, weights_key=None))
        return
    out.mkdir(exist_ok=True)
    torch.manual_seed(seed)
    student, chosen = swap_attention(teacher, conv.student, conv.layers, **conv.options)
    report: dict[str, Any] = {"layers": chosen, "init": conv.init, "init_figures": {}, **(extra or {})}
    resume = load_checkpoint(partial, weights_key="student") if steps and partial.is_file() else None
    if conv.init == "teacher" and conv.student != "window":
        inputs, mask = _calibration(batches, conv.calibration_batches)
        if resume is None:
            report["init_figures"] = initialise_students(teacher, student, chosen, inputs, mask)
    rows: list[dict[str, float]] = []
    if steps:

        def log(row: dict[str, float]) -> None:
            if verbose:
                per = " ".join(f"{k.split('/')[1]} {v:.4f}" for k, v in row.items() if k.startswith("loss/"))
                print(f"stage 1 step {int(row['step'])}/{steps}: loss {row['loss']:.4f} ({per})", flush=True)

        every = max(1, steps // 10)
        blocks = find_blocks(student)
        opt = torch.optim.Adam([p for i in chosen for p in new_parameters(blocks[i].attn)], lr=conv.stage1.lr)
        state = TransferState()
        if resume is not None:
            student.load_state_dict(resume["student"])
            opt.load_state_dict(resume["optimizer"])
            state = TransferState(resume["step"], resume["history"])
            report["init_figures"] = resume["init_figures"]
            for _ in range(state.step):  # the batches already used, drawn again
                next(batches)
            torch.set_rng_state(resume["rng"])  # after those draws: a stream drawing from it lines up
            if verbose:
                print(f"stage 1: resuming at step {state.step}/{steps} ({partial})", flush=True)

        def checkpoint(st: TransferState, optimiser: torch.optim.Optimizer) -> None:
            if st.step % every == 0 and st.step < steps:
                keep = {"student": student.state_dict(), "optimizer": optimiser.state_dict(), "step": st.step,
                        "history": st.history, "init_figures": report["init_figures"], "rng": torch.get_rng_state()}  # fmt: skip
                data = io.BytesIO()
                torch.save(keep, data)
                atomic_write_bytes(partial, data.getvalue())

        rows = attention_transfer(
            teacher, student, chosen, batches, steps, optimizer=opt, state=state, log_every=every, on_log=log,
            on_step=checkpoint,
        ).history  # fmt: skip
        report["first"], report["last"] = rows[0], rows[-1]
    report["steps"] = steps
    buf = io.StringIO()
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        w = csv.DictWriter(buf, keys)
        w.writeheader()
        w.writerows(rows)
    atomic_write_text(out / "stage1.csv", buf.getvalue())
    atomic_write_json(out / "stage1.json", report)
    model.load_state_dict(student.state_dict())
    data = io.BytesIO()
    torch.save(model.state_dict(), data)
    atomic_write_bytes(saved, data.getvalue())
    partial.unlink(missing_ok=True)  # its own file: stage1.pt holds the result now
