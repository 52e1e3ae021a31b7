"""``primaldual convert`` for a Hugging Face causal LM (Llama and its layout, GPT-NeoX, GPT-2, OPT): both stages, a
run directory, resume.

The teacher is a ``save_pretrained`` directory, a ``.gguf`` file (transformers' GGUF reader; ``pip install
'primaldual[llama]'``) or ``smollm2`` (the model ``primaldual data fetch smollm2`` caches). The conversion config is
the one :mod:`.convert` reads (student, layers, options, init, stage budgets in tokens); its ``data`` section, which
only a Hugging Face teacher takes (a primaldual run brings its data), says what text to convert on
(:class:`HFData`).

1. **Stage 1**: :func:`primaldual.convert.hf.convert_hf`: the calibration windows set the KSVD + least-squares
   initialisation, then teacher-forced attention transfer. The model after it is saved in ``convert/stage1/``.
2. **Stage 2**: the converted layers' attention parameters (their projections included) train on the LM loss plus
   the KSVD term, plus ``stage2.kl`` times ``KL(teacher || model)`` per token; everything else stays frozen (the
   optimiser state of a full finetune is what does not fit for a large model). With ``stage2.lora`` r > 0 the
   projections train as rank-r adapters instead (alpha 2r; :func:`primaldual.convert.add_lora`, merged before saving),
   the students' new parameters in full. The loop is the Hugging Face
   ``Trainer`` (:class:`~primaldual.integrations.hf.PrimalDualTrainer`): its checkpoints
   (``checkpoints/checkpoint-N``, read back in its safe mode) make a killed conversion resume.
3. **The result**: ``model/`` (``save_pretrained``, with the tokenizer; load it with
   :func:`primaldual.integrations.hf.from_pretrained`) and ``summary.json``: perplexity on the same evaluation
   windows for the teacher, after stage 1 and at the end.

Written here rather than in :mod:`primaldual.convert`: this is the command's run around the library's conversion
(text, budget, run directory); the training loop is the ``Trainer``'s.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor, nn

from ...options import check_int, check_number
from ...train.checkpoints import load_checkpoint
from ...train.lock import LOCK_NAME, RunLock
from ...train.rundir import MARK
from ...utils.errors import ConfigError
from ...utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from ..conversion import config_name

__all__ = ["HFData", "convert_hf_run", "is_hf_teacher", "load_hf_teacher", "perplexity", "token_stream", "windows"]

#: what an HF conversion writes into its run directory (nothing else there is ever touched)
OWN = (MARK, "convert.yaml", "convert", "checkpoints", "model", "summary.json")
#: ``stage2.decay`` as the ``Trainer``'s schedules (each after ``stage2.warmup_steps`` of linear warm-up)
SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


@dataclass
class HFData:
    """The text a Hugging Face teacher is converted on.

    ``text``: ``english`` (the English corpus, ``primaldual data fetch english``: its train split trains, its test
    split evaluates) or a UTF-8 text file (its last ``eval_fraction`` of characters evaluates, the rest trains).
    ``train_chars``: the first this many characters of the training text are tokenised (None: all).
    ``context``: tokens per window; ``batch_size``: windows per update (stage 1 and 2; the calibration batch holds
    ``calibration_batches`` times as many); ``eval_windows``: consecutive windows from the evaluation text's start.
    """

    text: str = "english"
    train_chars: int | None = 4_000_000
    context: int = 512
    batch_size: int = 4
    eval_windows: int = 32
    eval_fraction: float = 0.1

    @classmethod
    def build(cls, values: Any) -> HFData:
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"data: expected a mapping, got {values!r}")
        known = [f.name for f in fields(cls)]
        if bad := sorted(set(values) - set(known)):
            raise ConfigError(f"data: unknown key(s) {', '.join(bad)}; valid: {', '.join(known)}")
        d = cls(**values)
        if not isinstance(d.text, str) or not d.text:
            raise ConfigError(f"data.text: expected 'english' or a text file, got {d.text!r}")
        try:
            check_int("data.train_chars", d.train_chars, low=1, allow_none=True)
            check_int("data.context", d.context, low=2)
            check_int("data.batch_size", d.batch_size, low=1)
            check_int("data.eval_windows", d.eval_windows, low=1)
            check_number("data.eval_fraction", d.eval_fraction, low=0, high=1, low_open=True, high_open=True)
        except (TypeError, ValueError) as e:
            raise ConfigError(str(e)) from None
        return d


def is_hf_teacher(source: str | os.PathLike) -> bool:
    """Whether ``source`` names a Hugging Face teacher (``smollm2``, a ``.gguf`` file, a directory with a
    ``config.json`` and no primaldual ``config.yaml``) rather than a primaldual run directory."""
    p = Path(source)
    if _is_smollm2(source):
        return True
    if p.is_file() and p.suffix == ".gguf":
        return True
    return p.is_dir() and (p / "config.json").is_file() and not (p / "config.yaml").is_file()


def _is_smollm2(source: str | os.PathLike) -> bool:
    """``smollm2`` names the cached model, unless a file or folder of that name is there."""
    return str(source) == "smollm2" and not Path(source).exists()


def load_hf_teacher(source: str | os.PathLike) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)``: the teacher in float32, eval mode."""
    if _is_smollm2(source):
        from ...data.smollm2 import load_smollm2

        return load_smollm2()
    if Path(source).suffix == ".gguf":
        from ...data.smollm2 import load_gguf

        return load_gguf(source)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise ImportError(f"a Hugging Face teacher needs transformers: pip install 'primaldual[hf]' ({err})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{source}: no tokenizer could be read ({str(e).splitlines()[0][:160]}); the teacher's folder holds its "
            "tokenizer's files beside config.json (tokenizer.save_pretrained)"
        ) from None
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    return model.eval(), tokenizer


def token_stream(tokenizer: Any, text: str, limit_chars: int | None = None) -> Tensor:
    """The text's token ids ``(T,)``, documents joined as they are in the text."""
    body = text if limit_chars is None else text[:limit_chars]
    return torch.tensor(tokenizer(body, add_special_tokens=False)["input_ids"], dtype=torch.long)


def windows(stream: Tensor, batch: int, context: int, seed: int, device: Any = "cpu"):
    """Endless ``(ids (B, N), None)`` batches of random windows of ``stream``, in a seeded order."""
    if len(stream) <= context + 1:
        raise ConfigError(f"data: the training text has {len(stream)} tokens, fewer than one window of {context}")
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(stream) - context - 1, (batch,), generator=g)
        yield torch.stack([stream[s : s + context] for s in starts.tolist()]).to(device), None


@torch.no_grad()
def perplexity(model: nn.Module, stream: Tensor, context: int, chunks: int, batch: int = 4) -> dict[str, float]:
    """exp(mean next-token NLL) over ``chunks`` consecutive windows of ``context`` tokens from ``stream``'s start."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    parts = [stream[i * context : (i + 1) * context] for i in range(chunks)]
    parts = [w for w in parts if len(w) == context]
    if not parts:
        raise ConfigError(f"data: the evaluation text has {len(stream)} tokens, fewer than one window of {context}")
    for i in range(0, len(parts), batch):
        ids = torch.stack(parts[i : i + batch]).to(device)  # (b, N)
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()  # (b, N - 1, V)
        nll = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
        total, count = total + float(nll), count + ids[:, 1:].numel()
    return {"ppl": math.exp(total / count), "tokens": count, "windows": len(parts), "context": context}


def _texts(data: HFData) -> tuple[str, str, str]:
    """``(train text, evaluation text, what they are)``."""
    if data.text == "english" and not Path("english").is_file():
        from ...data.cache import dataset_dir

        folder = dataset_dir("english")
        if not (folder / "train.txt").is_file():
            raise ConfigError(f"data.text: {folder}/train.txt not found: run `primaldual data fetch english` first")
        return (folder / "train.txt").read_text(), (folder / "test.txt").read_text(), "english train / test"
    path = Path(data.text).expanduser()
    if not path.is_file():
        raise ConfigError(f"data.text: {path} is not a file (expected 'english' or a UTF-8 text file)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"data.text: {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    cut = int(len(text) * (1 - data.eval_fraction))
    return text[:cut], text[cut:], f"{path}: first {1 - data.eval_fraction:.0%} / last {data.eval_fraction:.0%}"


def _check_teacher(teacher: nn.Module, conv: Any, data: HFData, source_id: str) -> None:
    """What the conversion needs of the teacher, checked before anything is written: a causal LM the Hugging Face
    integration reads, not converted already, its layers in range, a student window no wider than a sliding teacher
    layer's, and positions enough for ``data.context``."""
    from ...convert.hf import check_student_windows
    from ...convert.students import check_student
    from ...integrations.hf.architectures import find_blocks, read_site
    from ...integrations.hf.convert import CONVERSIONS_KEY
    from ...integrations.torch_nn import resolve_layer_indices
    from ...models.plans import check_plan

    if getattr(teacher.config, CONVERSIONS_KEY, None):
        raise ConfigError(
            f"TEACHER {source_id}: already converted by primaldual (its config.json records {CONVERSIONS_KEY}); "
            "convert the original model"
        )
    try:
        _, blocks = find_blocks(teacher)
        chosen = resolve_layer_indices(conv.layers, len(blocks))
        sites = [read_site(teacher, blocks[i], i) for i in chosen]
        name, fixed = check_student(conv.student, conv.options)
        check_student_windows(conv.student, chosen, sites, conv.options)
    except (IndexError, KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"TEACHER {source_id}: {e}") from None
    if not all(site.causal for site in sites):
        raise ConfigError(f"TEACHER {source_id}: not a causal LM (its attention is not causal); convert a decoder")
    cfg = teacher.config
    width = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
    try:  # the student's options, on a layer built on the meta device (no memory)
        check_plan(name, {**fixed, **conv.options}, 1, width, sites[0].num_heads, causal=True)
    except ConfigError as e:
        raise ConfigError(str(e).replace("model.attention_options", "options", 1)) from None
    positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if positions and data.context > positions:
        raise ConfigError(f"data.context: {data.context} tokens, more than the teacher's {positions} positions")


def _attention_parameters(model: nn.Module, layers: list[int]) -> list[nn.Parameter]:
    from ...convert.hf import hf_student_layers

    return [p for layer in hf_student_layers(model, layers) for p in layer.parameters()]


def _stage2_trainer(teacher: nn.Module, kl: float) -> type:
    """:class:`PrimalDualTrainer` plus ``kl`` times the per-token ``KL(teacher || model)`` of the next-token laws."""
    from ...integrations.hf import PrimalDualTrainer

    class Stage2Trainer(PrimalDualTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001
            loss, out = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
            if kl > 0:
                with torch.no_grad():
                    target = teacher(input_ids=inputs["input_ids"], use_cache=False).logits[:, :-1].float()
                logp = out.logits[:, :-1].float().log_softmax(-1)  # (B, N - 1, V)
                logq = target.log_softmax(-1)
                loss = loss + kl * (logq.exp() * (logq - logp)).sum(-1).mean()
            return (loss, out) if return_outputs else loss

    return Stage2Trainer


class _Windows(torch.utils.data.Dataset):
    """``steps * batch`` random training windows, fixed by the seed (the ``Trainer`` shuffles them and, on resume,
    skips the ones it has used)."""

    def __init__(self, stream: Tensor, count: int, context: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed + 1)
        self.stream, self.context = stream, context
        self.starts = torch.randint(0, len(stream) - context - 1, (count,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        ids = self.stream[self.starts[i] : self.starts[i] + self.context]
        return {"input_ids": ids, "labels": ids}


def _check_dir(run_dir: Path, record: str, fresh: bool) -> None:
    """Refuse a directory this conversion may not write in (before anything in it is touched)."""
    if fresh:
        raise ConfigError(
            "--fresh: a Hugging Face conversion does not delete its run directory's files (model and checkpoint "
            "folders); remove the directory yourself, or pass another --run-dir"
        )
    if run_dir.is_symlink() and not run_dir.exists():
        raise ConfigError(f"--run-dir: {run_dir} is a symlink to nothing; pass a directory")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir: {run_dir} is a file, not a directory")
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return
    names = [p.name for p in run_dir.iterdir() if not p.name.startswith(LOCK_NAME)]
    foreign = [n for n in names if n not in OWN and not (n.startswith(".") and n.endswith(".tmp"))]
    if foreign or (names and not (run_dir / MARK).is_file()):
        shown = ", ".join(sorted(foreign or names)[:5])
        raise ConfigError(
            f"{run_dir} is not a primaldual conversion directory (it holds {shown}); nothing in it was touched. "
            "Pass a new or empty --run-dir"
        )
    saved = run_dir / "convert.yaml"
    progress = [
        n
        for n in ("convert/stage1.partial.pt", "convert/stage1.json", "checkpoints", "model", "summary.json")
        if (run_dir / n).exists()
    ]
    if saved.is_file() and saved.read_text() != record and progress:  # without progress, the new record replaces it
        raise ConfigError(f"{run_dir} holds another conversion ({saved}); pass another --run-dir")


def _save_model(model: nn.Module, tokenizer: Any, dest: Path) -> None:
    """``save_pretrained`` into ``dest`` whole or not at all: written beside it, then renamed."""
    for old in dest.parent.glob(f".{dest.name}.*.tmp"):  # a killed attempt's (the name is ours; the lock is held)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.tmp"
    if dest.is_dir() and not dest.is_symlink():  # saved by an attempt killed before it recorded it: saved again
        shutil.rmtree(dest)
    model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    os.replace(tmp, dest)


def _load_converted(path: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    from ...integrations.hf import from_pretrained

    return from_pretrained(AutoModelForCausalLM, path, dtype=torch.float32).eval()


def _steps(tokens: int, data: HFData) -> int:
    return math.ceil(tokens / (data.batch_size * data.context))


def convert_hf_run(
    source: str | os.PathLike,
    conv: Any,
    config: str,
    *,
    seed: int = 0,
    run_dir: str | os.PathLike | None = None,
    fresh: bool = False,
    verbose: bool = True,
) -> dict[str, Any]:
    """Convert the Hugging Face causal LM ``source`` as ``conv`` (a :class:`~.convert.ConvertConfig`) says; returns
    the summary. ``run_dir`` default: ``runs/convert/<teacher>-<config name>-seed<seed>``."""
    data = HFData.build(conv.data)
    check_int("--seed", seed, low=0)
    if conv.stage2.decay not in SCHEDULES:
        raise ConfigError(
            f"stage2.decay: a Hugging Face conversion takes {sorted(SCHEDULES)}, got {conv.stage2.decay!r}"
        )
    name = config_name(config)
    teacher_name = Path(str(source)).stem if Path(str(source)).suffix == ".gguf" else Path(str(source)).name
    if run_dir is not None and not str(run_dir).strip():
        raise ConfigError("--run-dir: empty; give a directory for the conversion")
    run_dir = Path(run_dir if run_dir is not None else f"runs/convert/{teacher_name}-{name}-seed{seed}")
    if config.endswith((".yaml", ".yml")):
        config = str(Path(config).resolve())  # one conversion, however its file is spelled
    source_id = "smollm2" if _is_smollm2(source) else str(Path(source).resolve())
    record = yaml.safe_dump({"convert": conv.to_dict(), "config": config, "teacher": source_id, "seed": seed},
                            sort_keys=False)  # fmt: skip
    _check_dir(run_dir, record, fresh)

    def say(line: str) -> None:
        if verbose:
            print(line, flush=True)  # a log file sees each line as it happens

    if (run_dir / "summary.json").is_file() and (run_dir / "model").is_dir():
        summary = json.loads((run_dir / "summary.json").read_text())
        say(f"{run_dir}: finished earlier: test ppl {summary['ppl']:.2f} ({summary['ppl_ratio']:.3f}x the teacher)")
        return summary
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    if not sys.stderr.isatty():  # a log file: no carriage-return progress bars (saving, loading)
        hf_logging.disable_progress_bar()
    try:
        return _run(source, source_id, conv, data, record, run_dir, seed, say)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _run(source, source_id, conv, data, record, run_dir, seed, say) -> dict[str, Any]:  # noqa: ANN001
    from ...convert.hf import convert_hf

    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_text, eval_text, what = _texts(data)  # everything read and checked before the run directory is written
    teacher, tokenizer = load_hf_teacher(source)
    _check_teacher(teacher, conv, data, source_id)
    teacher = teacher.to(device)
    train = token_stream(tokenizer, train_text, data.train_chars)
    test = token_stream(tokenizer, eval_text)
    for stream, which, least in ((train, "training", data.context + 2), (test, "evaluation", data.context)):
        if len(stream) < least:
            raise ConfigError(
                f"data: the {which} text has {len(stream)} tokens, fewer than one window of {data.context} "
                f"(data.context){'; lower data.eval_fraction' if which == 'training' and data.text != 'english' else ''}"
            )
    say(f"teacher {source_id}: {sum(p.numel() for p in teacher.parameters()):,} parameters; text "
        f"{what}: {len(train)} training tokens, evaluation {data.eval_windows} x {data.context}")  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(run_dir, "primaldual convert"):
        if not (run_dir / MARK).is_file():
            atomic_write_text(run_dir / MARK, json.dumps({"primaldual": "convert"}) + "\n")
        atomic_write_text(run_dir / "convert.yaml", record)
        info_path = run_dir / "convert" / "stage1.json"
        torch.manual_seed(seed)
        if info_path.is_file():
            info = json.loads(info_path.read_text())
            model = _load_converted(run_dir / "convert" / "stage1").to(device)
            say(f"stage 1: done earlier (ppl after it {info['ppl_after_stage1']:.2f})")
        else:
            partial = run_dir / "convert" / "stage1.partial.pt"  # every tenth of stage 1: a kill continues there
            resume = load_checkpoint(partial, weights_key="params") if partial.is_file() else None
            if resume is not None and "teacher_ppl" in resume:  # measured before the kill: deterministic, kept
                teacher_ppl = float(resume["teacher_ppl"])
            else:
                teacher_ppl = perplexity(teacher, test, data.context, data.eval_windows)["ppl"]
            say(f"teacher: test ppl {teacher_ppl:.2f}")
            steps1 = _steps(conv.stage1.tokens, data) if conv.student != "window" else 0
            batch = windows(train, data.batch_size, data.context, seed, device)
            calib = [next(batch)[0] for _ in range(conv.calibration_batches)] if conv.init == "teacher" else []

            def feed():
                if calib:
                    yield torch.cat(calib), None  # (calibration_batches * B, N): the initialisation's batch
                yield from batch

            def log(row: dict[str, float]) -> None:
                say(f"stage 1 step {int(row['step'])}/{steps1}: loss {row['loss']:.4f}")

            if resume is not None:
                say(f"stage 1: resuming at step {resume['step']}/{steps1}")

            def keep(state: dict[str, Any]) -> None:
                data = io.BytesIO()
                torch.save({**state, "teacher_ppl": teacher_ppl}, data)
                (run_dir / "convert").mkdir(exist_ok=True)
                atomic_write_bytes(partial, data.getvalue())

            model, report = convert_hf(teacher, conv.student, conv.layers, batches=feed(), steps=steps1,
                                       init=conv.init, lr=conv.stage1.lr, log_every=max(1, steps1 // 10), on_log=log,
                                       resume=resume, on_checkpoint=keep, **conv.options)  # fmt: skip
            after = perplexity(model, test, data.context, data.eval_windows)["ppl"]
            say(f"stage 1: {steps1} updates; test ppl {after:.2f}")
            (run_dir / "convert").mkdir(exist_ok=True)
            _save_model(model, None, run_dir / "convert" / "stage1")
            info = {"layers": report["layers"], "init": report["init"], "history": report["history"],
                    "steps": steps1, "teacher_ppl": teacher_ppl, "ppl_after_stage1": after}  # fmt: skip
            atomic_write_json(info_path, info)
            partial.unlink(missing_ok=True)  # its own file: convert/stage1/ holds the result now
        summary = _stage2(model, teacher, tokenizer, conv, data, info, train, test, run_dir, seed, say)
    return summary


def _stage2(model, teacher, tokenizer, conv, data, info, train, test, run_dir, seed, say) -> dict[str, Any]:  # noqa: ANN001
    from transformers import TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    steps = _steps(conv.stage2.tokens, data)
    if conv.stage2.lora:  # adapters on the converted layers' projections; their new parameters in full
        from ...convert import add_lora
        from ...convert.hf import hf_student_layers

        add_lora(
            model, r=conv.stage2.lora, alpha=2.0 * conv.stage2.lora, layers=hf_student_layers(model, info["layers"])
        )
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in _attention_parameters(model, info["layers"]):
            p.requires_grad_(True)
    ckpt = run_dir / "checkpoints"
    args = TrainingArguments(
        output_dir=str(ckpt),
        max_steps=steps,
        per_device_train_batch_size=data.batch_size,
        learning_rate=conv.stage2.lr,
        weight_decay=0.0,
        warmup_steps=min(conv.stage2.warmup_steps, steps),
        lr_scheduler_type=SCHEDULES[conv.stage2.decay],
        max_grad_norm=1.0,
        save_strategy="steps",
        save_steps=max(1, steps // 4),
        save_total_limit=1,
        logging_steps=max(1, min(10, steps // 4)),
        report_to="none",
        disable_tqdm=not sys.stderr.isatty(),
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    trainer = _stage2_trainer(teacher, conv.stage2.kl)(
        model=model, args=args, train_dataset=_Windows(train, steps * data.batch_size, data.context, seed)
    )
    last = get_last_checkpoint(str(ckpt)) if ckpt.is_dir() else None
    say(
        f"stage 2: {steps} updates of {data.batch_size} x {data.context} tokens"
        + (f", resuming from {last}" if last else "")
    )
    trainer.train(resume_from_checkpoint=last)
    if conv.stage2.lora:
        from ...convert import merge_lora

        merge_lora(model)  # the saved model has the converted layers' own parameter names
    model.eval()
    final = perplexity(model, test, data.context, data.eval_windows)
    _save_model(model, tokenizer, run_dir / "model")
    summary = {
        **final,
        "teacher_ppl": info["teacher_ppl"],
        "ppl_ratio": final["ppl"] / info["teacher_ppl"],
        "ppl_after_stage1": info["ppl_after_stage1"],
        "layers": info["layers"],
        "stage1_tokens": info["steps"] * data.batch_size * data.context,
        "stage2_tokens": steps * data.batch_size * data.context,
        "stage2": [r for r in trainer.state.log_history if "loss" in r],
        "data": asdict(data),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    say(f"converted: test ppl {final['ppl']:.2f} ({summary['ppl_ratio']:.3f}x the teacher's {info['teacher_ppl']:.2f}); "
        f"the model: {run_dir / 'model'} (primaldual.integrations.hf.from_pretrained)")  # fmt: skip
    return summary
