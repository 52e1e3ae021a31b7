"""Causal language modelling on the harness (task ``lm``): data module, Lightning module, results, generation.

* **Data** (:class:`LMDataModule`): ``data.name`` ``english`` (the corpus of ``primaldual data fetch english``,
  byte-level BPE; a missing corpus is a one-line error naming that command) or ``wikitext-103`` / ``wikitext-2``
  (the user's WikiText files in ``data.root`` or the cache, read by :func:`~primaldual.data.wikitext.load_wikitext`:
  word-level vocabulary, fairseq's rule). Each split's token stream is cut into contiguous, non-overlapping chunks
  of ``data.max_len`` tokens (:class:`~primaldual.data.lm.TokenChunkDataset`); training drops the final partial
  chunk, validation and test pad it (targets ``-100``), so every token of an evaluated split but its first is a
  target exactly once. Batches are ``(tokens (B, T), targets (B, T))``.
* **Model**: :class:`~primaldual.models.CausalLM` (``model.kind: lm``), or Hugging Face's GPT-2 at the same sizes
  (``hf_gpt2``, :class:`~primaldual.integrations.hf.peers.HFGPT2LM`, a peer to compare with); vocabulary from the
  data.
* **Loss** (:class:`LanguageModelModule`): mean token cross-entropy over the batch's targets (``ignore_index``
  -100) + ``collect_aux_loss(model)`` (the primal layers' KSVD term).
* **Evaluation**: the summed negative log-likelihood over every target token of the split divided by their count
  (accumulated over batches in float64, not a mean of per-batch means); perplexity ``exp`` of it; bits per byte
  from the split's UTF-8 size (:func:`~primaldual.data.lm.bits_per_byte`), when the whole split was evaluated.
  The lowest validation loss selects the checkpoint (:data:`~primaldual.tasks.protocols.LM_HELDOUT`), which is
  tested once. :func:`lm_results` adds the add-one unigram perplexity of the test targets
  (:func:`~primaldual.data.lm.unigram_baseline`), the floor a model must beat, and test ppl / unigram ppl.
* **Generation** (:func:`generate_text`, ``primaldual generate RUN_DIR --prompt TEXT``): the model rebuilt from the
  run's ``config.yaml``, the checkpoint read in the safe mode, the prompt encoded with the run's own tokenizer
  (``tokenizer.json`` or ``dict.txt``, copied into the run directory by ``fit``), decoded by
  :meth:`~primaldual.models.CausalLM.generate`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Subset

from ...aux_loss import collect_aux_loss, collect_aux_loss_parts
from ...data.cache import MissingDataError, dataset_dir
from ...data.lm import IGNORE_INDEX, bits_per_byte, chunk_splits, unigram_baseline
from ...models.graphed import check_graphable
from ...options import check_bool, check_device, check_int, check_number
from ...train.config import ConfigError, OptimConfig, RunConfig, ScheduleConfig
from ...train.datamodule import SplitDataModule
from ...train.module import ClassificationModule, log_ksvd
from ...utils.io import atomic_write_bytes

__all__ = [
    "LMDataModule",
    "LanguageModelModule",
    "RunTokenizer",
    "load_run_lm",
    "build_lm",
    "generate_text",
    "lm_results",
    "lm_report",
]

_SPLITS = {"train": "train", "val": "valid", "test": "test"}  # harness split -> corpus split
_VAL_SUBSET_SEED = 0  # data.val_size: the same chunks whatever the run seed
TOKENIZER_FILE, DICTIONARY_FILE = "tokenizer.json", "dict.txt"  # the run directory's copy of the tokenizer


class LMDataModule(SplitDataModule):
    """Token chunks of one corpus: ``datasets`` ``{"train", "val", "test"}``, ``vocab_size``, ``max_len`` (tokens
    per sample), ``streams`` (each split's token ids), ``split_bytes`` (UTF-8 size of each split's text) and
    ``info``. Shuffling as :class:`~primaldual.tasks.uea.data.UEADataModule` (seeded, resumable mid-epoch).

    Args:
        cfg: data settings (``name``, ``root``, ``max_len``, batch sizes, ``val_size``). seed: shuffle seed.
    """

    def prepare_data(self) -> None:
        """Nothing to download: the English corpus is fetched by ``primaldual data fetch english``, WikiText by you."""

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        cfg, T = self.cfg, self.cfg.max_len
        if T is None:
            raise ConfigError("data.max_len: task 'lm' needs the tokens per sample (e.g. 512)")
        if cfg.name == "english":
            from ...data.lm import load_english_lm, load_english_metadata

            root = Path(cfg.root) if cfg.root is not None else dataset_dir("english")
            chunks = load_english_lm(root, T)  # a missing corpus: MissingDataError naming `data fetch english`
            meta = load_english_metadata(root)
            self.tokenizer_source: Path = root / meta["tokenizer"]["file"]
            self.dictionary = None
            vocab = int(meta["tokenizer"]["vocab_size"])
            split_bytes = {s: int(meta["splits"][c]["bytes"]) for s, c in _SPLITS.items()}
            info: dict[str, Any] = {
                "dataset": "english",
                "source": str(root),
                "tokenizer": meta["tokenizer"].get("type", "byte-level BPE"),
                "tokenizer_sha256": meta["tokenizer"].get("sha256", ""),
            }
        else:
            from ...data.wikitext import find_wikitext_files, load_wikitext

            root = Path(cfg.root) if cfg.root is not None else dataset_dir(cfg.name)
            try:
                wt = load_wikitext(root, name=cfg.name)
            except MissingDataError as e:
                raise MissingDataError(f"{e}; or train on it: --data.name english") from None
            files = find_wikitext_files(root)
            chunks = chunk_splits(wt.tokens, T, pad_id=wt.dictionary.pad_index, info={"dataset": cfg.name})
            self.tokenizer_source = files["train"]
            self.dictionary = wt.dictionary
            vocab = wt.vocab_size
            split_bytes = {s: files[c].stat().st_size for s, c in _SPLITS.items()}
            info = {"dataset": cfg.name, "source": str(files["train"].parent), "tokenizer": "words (fairseq dict)"}
        self.datasets = {s: chunks[c] for s, c in _SPLITS.items()}
        self.streams = {s: ds.tokens for s, ds in self.datasets.items()}
        self.split_targets = {s: int(ds.num_targets) for s, ds in self.datasets.items()}
        self.split_bytes = split_bytes
        if cfg.val_size is not None and len(self.datasets["val"]) > cfg.val_size:
            g = torch.Generator().manual_seed(_VAL_SUBSET_SEED)
            pick = torch.randperm(len(self.datasets["val"]), generator=g)[: cfg.val_size].sort().values
            self.datasets["val"] = Subset(self.datasets["val"], pick.tolist())
        self.vocab_size, self.max_len = vocab, T
        self.num_classes = None
        self.sizes = {k: len(v) for k, v in self.datasets.items()}
        self.info = dict(
            info,
            vocab_size=vocab,
            tokens_per_sample=T,
            **{f"{s}_tokens": int(len(t)) for s, t in self.streams.items()},
            **{f"{s}_bytes": b for s, b in split_bytes.items()},
        )

    def save_tokenizer(self, run_dir: str | os.PathLike) -> Path:
        """Copy the tokenizer into the run directory (``tokenizer.json``, or WikiText's ``dict.txt``) if absent, so
        that ``primaldual generate`` needs only the run directory."""
        run_dir = Path(run_dir)
        if self.dictionary is not None:
            path = run_dir / DICTIONARY_FILE
            if not path.is_file():
                self.dictionary.save(path)
            return path
        path = run_dir / TOKENIZER_FILE
        if not path.is_file():
            atomic_write_bytes(path, self.tokenizer_source.read_bytes())
        return path


def build_lm(cfg: RunConfig, vocab_size: int) -> nn.Module:
    """The language model of ``cfg.model`` with ``data.max_len`` positions: :class:`~primaldual.models.CausalLM`
    (``model.kind: lm``) or Hugging Face's GPT-2 (``hf_gpt2``, :class:`~primaldual.integrations.hf.peers.HFGPT2LM`);
    ``vocab_size`` from the data (``model.vocab_size``, when set, must be at least that)."""
    from ...models import CausalLM

    m = cfg.model
    vocab = m.vocab_size if m.vocab_size is not None else vocab_size
    if vocab < vocab_size:
        raise ConfigError(f"model.vocab_size: {vocab} is smaller than the data's vocabulary ({vocab_size})")
    if m.resolved_kind(cfg.task) == "hf_gpt2":
        try:
            from ...integrations.hf.peers import HFGPT2LM
        except ImportError as e:
            raise ConfigError(f"model.kind: 'hf_gpt2' needs the hf extra ({e})") from None
        return HFGPT2LM(
            vocab,
            cfg.data.max_len,
            dim=m.dim,
            depth=m.depth,
            num_heads=m.num_heads,
            ffn_dim=m.ffn_dim,
            dropout=m.dropout,
            tie_embeddings=m.tie_embeddings,
        )
    return CausalLM(
        vocab,
        cfg.data.max_len,
        positions=m.positions,
        **m.backbone_kwargs(),
        tie_embeddings=m.tie_embeddings,
        init=m.init,
    )


class LanguageModelModule(ClassificationModule):
    """A causal LM on batches ``(tokens, targets)``: token cross-entropy + the layers' auxiliary (KSVD) losses.

    Logged: ``train/loss`` (with the aux term), ``train/task_loss``, ``train/aux_loss``, and per evaluated split
    ``<split>/loss`` (nats per target token: summed NLL / token count over the whole split), ``<split>/ppl``,
    ``<split>/tokens`` and, when the whole split was evaluated and its byte count is known, ``<split>/bpb``.
    The optimiser and schedule are :class:`~primaldual.train.module.ClassificationModule`'s.

    Args:
        model: ``model(ids, mask) -> logits (B, T, V)``. optim, schedule, total_steps: as the base class.
        split_bytes: UTF-8 bytes of each split's text. split_targets: target tokens of each whole split.
    """

    def __init__(
        self,
        model: nn.Module,
        optim: OptimConfig,
        schedule: ScheduleConfig | None = None,
        total_steps: int | None = None,
        split_bytes: dict[str, int] | None = None,
        split_targets: dict[str, int] | None = None,
    ) -> None:
        super().__init__(model, optim, ["val"], schedule, total_steps)
        self.split_bytes = dict(split_bytes or {})
        self.split_targets = dict(split_targets or {})
        self._totals: dict[str, list[float]] = {}
        #: the last evaluation of each split, exact (float64): {"nll": summed NLL, "tokens": count, "loss": nll/count}
        self.results: dict[str, dict[str, float]] = {}

    def _nll(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """Summed token NLL (float32) and the number of target tokens of a batch."""
        nll, count, _, _ = self._forward_nll(batch)
        return nll, count

    def _forward_nll(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """``(summed NLL, target count, logits (B, T, V), mask (B, T) or None)`` of a batch."""
        ids, targets = batch
        real = targets != IGNORE_INDEX  # (B, T); padding only at the end of the split's last chunk
        mask = None if bool(real.all()) else real
        logits = self.model(ids, mask)  # (B, T, V)
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        return nll, real.sum(), logits, mask

    def distill_from(self, teacher: nn.Module, weight: float) -> None:
        """Add ``weight * KL(teacher || model)`` over the target tokens to the training loss (``primaldual convert``'s
        stage 2). The teacher is kept out of the module's parameters, state dict and checkpoints, in eval mode and
        without gradients; it follows the module to its device at the start of training."""
        check_number("kl weight", weight, low=0.0, low_open=True)
        for p in teacher.parameters():
            p.requires_grad_(False)
        self.__dict__["_distill"] = (teacher.eval(), float(weight))

    def on_fit_start(self) -> None:
        distill = self.__dict__.get("_distill")
        if distill is not None:
            distill[0].to(self.device)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # adapters (a conversion's stage 2 with stage2.lora): the weights merged under their own names, so every
        # reader loads the checkpoint as a plain CausalLM; the adapters themselves travel beside the state dict
        from ...convert.lora import fold_lora

        if folded := fold_lora(self, checkpoint["state_dict"]):
            checkpoint["lora"] = folded

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from ...convert.lora import has_lora, unfold_lora

        if "lora" in checkpoint and has_lora(self):  # a resume of an adapted run: the adapters back in place
            unfold_lora(checkpoint["state_dict"], checkpoint["lora"])

    def training_loss(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> tuple[Tensor, Tensor, Tensor | None, None]:
        """``(loss, task loss, aux loss or None, None)`` of one training batch (no accuracy for a language model): the
        training step without logging (``primaldual bench steps`` times it)."""
        nll, count, logits, mask = self._forward_nll(batch)
        task = nll / count.clamp_min(1)
        aux, self.aux_parts = collect_aux_loss_parts(self.model)
        loss = task if aux is None else task + aux
        distill = self.__dict__.get("_distill")
        if distill is not None:
            teacher, weight = distill
            with torch.no_grad():
                target = teacher(batch[0], mask).float().log_softmax(-1)  # (B, T, V)
            kl = F.kl_div(logits.float().log_softmax(-1), target, log_target=True, reduction="none").sum(-1)  # (B, T)
            kl = kl.mean() if mask is None else kl[mask].mean()
            self.aux_parts = {**self.aux_parts, "kl": kl.detach()}
            loss = loss + weight * kl
        return loss, task, aux, None

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss, task, aux, _ = self.training_loss(batch, batch_idx)
        kw: dict[str, Any] = {"batch_size": batch[0].shape[0], "sync_dist": True}
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, **kw)
        self.log("train/task_loss", task, on_step=False, on_epoch=True, **kw)
        self.log("train/aux_loss", 0.0 if aux is None else aux.detach(), on_step=False, on_epoch=True, **kw)
        log_ksvd(self, kw)
        if "kl" in self.aux_parts:
            self.log("train/kl", self.aux_parts["kl"], on_step=False, on_epoch=True, **kw)
        return loss

    # evaluation: exact split totals, not means of batch means
    def _start(self, split: str) -> None:
        self._totals[split] = [0.0, 0]

    def _add(self, split: str, batch: tuple[Tensor, Tensor]) -> None:
        nll, count = self._nll(batch)
        collect_aux_loss(self.model)  # nothing is recorded without gradients; cleared all the same
        total = self._totals.setdefault(split, [0.0, 0])
        total[0] += float(nll)
        total[1] += int(count)

    def _finish(self, split: str) -> None:
        nll, count = self._totals.pop(split, [0.0, 0])
        if count == 0:
            return
        loss = nll / count
        self.results[split] = {"nll": nll, "tokens": count, "loss": loss}
        kw: dict[str, Any] = {"sync_dist": True}  # every rank evaluates the whole split: equal values
        self.log(f"{split}/loss", loss, prog_bar=split == "val", **kw)
        self.log(f"{split}/ppl", math.exp(min(loss, 700.0)), **kw)
        self.log(f"{split}/tokens", float(count), **kw)
        if self.split_bytes.get(split) and self.split_targets.get(split) == count:
            self.log(f"{split}/bpb", bits_per_byte(loss, count, self.split_bytes[split]), **kw)

    def on_validation_epoch_start(self) -> None:
        self._start("val")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._add(self.eval_splits[dataloader_idx], batch)

    def on_validation_epoch_end(self) -> None:
        for split in self.eval_splits:
            self._finish(split)

    def on_test_epoch_start(self) -> None:
        self._start("test")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._add("test", batch)

    def on_test_epoch_end(self) -> None:
        self._finish("test")


def lm_results(dm: LMDataModule, test: dict[str, float], best: dict[str, Any]) -> dict[str, Any]:
    """The language-modelling part of ``summary.json``: test loss / perplexity / bits per byte of the selected
    checkpoint, its validation figures, and the unigram floor of the test targets with test ppl / unigram ppl.

    ``test``: :attr:`LanguageModelModule.results` ``["test"]`` (exact) or the metrics ``trainer.test`` returned."""
    vocab = dm.vocab_size
    targets = dm.streams["test"][1:]  # the tokens the model is scored on (every token but the first)
    floor = unigram_baseline(dm.streams["train"], targets, vocab, dm.split_bytes["test"])
    loss = float(test["loss"] if "loss" in test else test["test/loss"])
    tokens = int(test["tokens"] if "tokens" in test else test["test/tokens"])
    ppl = math.exp(loss)
    out: dict[str, Any] = {
        "tokens_per_sample": dm.max_len,
        "vocab_size": vocab,
        "val_loss": float(best["val/loss"]),
        "val_ppl": math.exp(float(best["val/loss"])),
        "test_loss": loss,
        "test_ppl": ppl,
        "test_bpb": bits_per_byte(loss, tokens, dm.split_bytes["test"]),
        "test_tokens": tokens,
        "test_bytes": dm.split_bytes["test"],
        "unigram_test_ppl": floor["perplexity"],
        "unigram_test_bpb": floor["bits_per_byte"],
        "test_ppl_over_unigram": ppl / floor["perplexity"],
        "evaluation": (
            "non-overlapping chunks of tokens_per_sample; loss = summed NLL over every test target token / their count"
        ),
    }
    return out


def lm_report(cfg: RunConfig, summary: dict[str, Any], label: str) -> str:
    """The lines ``fit`` prints at the end of a language-modelling run."""
    s = summary
    return (
        f"\n{cfg.data.name} {cfg.name} [{label}]: test perplexity {s['test_ppl']:.2f}, {s['test_bpb']:.4f} bits per "
        f"byte (step {s['best_step']} of {s['steps']}); unigram perplexity {s['unigram_test_ppl']:.2f}, "
        f"test ppl / unigram ppl {s['test_ppl_over_unigram']:.4f}\nrun directory: {s['run_dir']} "
        "(config.yaml, history.csv, logs/*/metrics.csv, checkpoints/, summary.json)"
    )


# ----------------------------------------------------------------------------------------------- generation
class RunTokenizer:
    """The tokenizer of a language-model run: ``encode(text) -> ids``, ``decode(ids) -> text``, ``vocab_size``.

    English (byte-level BPE): the run's ``tokenizer.json`` (else the corpus's). WikiText: the run's ``dict.txt``
    (words split on whitespace, unknown words -> ``<unk>``; ``</s>`` decodes as a line break).
    """

    def __init__(self, cfg: RunConfig, run_dir: str | os.PathLike) -> None:
        run_dir = Path(run_dir)
        self.kind = "bpe" if cfg.data.name == "english" else "words"
        if self.kind == "bpe":
            path = run_dir / TOKENIZER_FILE
            if not path.is_file():
                root = Path(cfg.data.root) if cfg.data.root is not None else dataset_dir("english")
                path = root / TOKENIZER_FILE
            if not path.is_file():
                raise FileNotFoundError(
                    f"{run_dir}: no {TOKENIZER_FILE} in the run directory or the corpus ({path}); "
                    "fetch the corpus with `primaldual data fetch english`"
                )
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise MissingDataError(
                    "the BPE tokenizer needs Hugging Face tokenizers: `pip install tokenizers`"
                ) from None
            self._tok = Tokenizer.from_file(str(path))
            self.vocab_size = int(self._tok.get_vocab_size())
        else:
            from ...data.wikitext import WordDictionary

            path = run_dir / DICTIONARY_FILE
            if not path.is_file():
                raise FileNotFoundError(
                    f"{run_dir}: no {DICTIONARY_FILE} (the word dictionary `primaldual fit` writes into the run "
                    "directory); run the same `primaldual fit` command once to write it"
                )
            self._dict = WordDictionary.load(path)
            self.vocab_size = len(self._dict)
        self.path = path

    def encode(self, text: str) -> list[int]:
        if self.kind == "bpe":
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return self._dict.encode_line(text, append_eos=False)

    def decode(self, ids: list[int]) -> str:
        if self.kind == "bpe":
            return self._tok.decode(ids, skip_special_tokens=False)
        return self._dict.string(ids)


def load_run_lm(
    run_dir: str | os.PathLike, ckpt: str = "best", *, what: str = "this reads"
) -> tuple[nn.Module, RunConfig, RunTokenizer]:
    """The trained :class:`~primaldual.models.CausalLM` of a language-model run (eval mode), its config and its
    tokenizer. The model is rebuilt from the run's ``config.yaml`` and the checkpoint (``best``, ``last`` or a path)
    read in the safe mode and checked against it. ``what`` completes the refusal of another model kind.

    Raises:
        FileNotFoundError: no such run directory, config or checkpoint. ValueError: not a ``model.kind: lm`` run.
    """
    from ...train.checkpoints import check_fits, load_checkpoint
    from ...train.rundir import run_config

    run_dir = Path(run_dir)
    cfg = run_config(run_dir)  # FileNotFoundError for a directory that is not a run
    kind = cfg.model.resolved_kind(cfg.task)
    if kind == "hf_gpt2":
        raise ValueError(
            f"{run_dir}: a model.kind 'hf_gpt2' run (Hugging Face's GPT-2); {what} primaldual's CausalLM "
            "(model.kind 'lm') only"
        )
    if kind != "lm":
        raise ValueError(f"{run_dir}: a {cfg.task!r} run, not a language model (task 'lm')")
    tok = RunTokenizer(cfg, run_dir)
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if ckpt in ("best", "last") else Path(ckpt)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    state = load_checkpoint(path)  # safe: refuses anything but tensors and plain data
    holder = nn.Module()
    holder.model = build_lm(cfg, tok.vocab_size)  # keys "model.*", as in the Lightning module
    check_fits(holder, state, path, str(run_dir / "config.yaml"))
    holder.load_state_dict(state["state_dict"])
    return holder.model.eval(), cfg, tok


def generate_text(
    run_dir: str | os.PathLike,
    prompt: str,
    max_new_tokens: int = 50,
    *,
    ckpt: str = "best",
    seed: int | None = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    device: str = "cpu",
    cuda_graph: bool = False,
) -> str:
    """Continue ``prompt`` with the language model of a run; returns the decoded prompt and continuation.

    The model is rebuilt from the run's ``config.yaml``, the checkpoint (``best``, ``last`` or a path) read in the
    safe mode and checked against it, and the prompt encoded with the run's tokenizer (:class:`RunTokenizer`).
    ``device``: where the model decodes; ``cuda_graph``: each decoding step replayed from a CUDA graph (a CUDA
    device, and a run whose every layer keeps a constant-size state: :meth:`CausalLM.generate`).

    Raises:
        FileNotFoundError: no such run directory, config or checkpoint. ValueError: an empty prompt, a prompt that
            with ``max_new_tokens`` needs more positions than the model has, a bad number, or not an LM run.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("--prompt: empty; give the text to continue")
    check_int("--max-new-tokens", max_new_tokens, low=0)
    check_number("--temperature", temperature, low=0.0)
    check_int("--top-k", top_k, low=1, allow_none=True)
    check_int("--seed", seed, low=0, high=2**64 - 1, allow_none=True)  # what torch.Generator takes
    check_bool("--cuda-graph", cuda_graph)
    where = check_device("--device", device)
    model, cfg, tok = load_run_lm(run_dir, ckpt, what="primaldual generate decodes")
    if cuda_graph:
        check_graphable(model, where, what="--cuda-graph")
    model = model.to(where)
    ids = tok.encode(prompt)
    if not ids:
        raise ValueError(f"--prompt: {prompt!r} encodes to no tokens")
    positions = cfg.data.max_len
    if len(ids) + max_new_tokens > positions:
        raise ValueError(
            f"--prompt: {len(ids)} tokens + --max-new-tokens {max_new_tokens} = {len(ids) + max_new_tokens} exceeds "
            f"the model's {positions} positions (data.max_len); shorten the prompt or generate fewer tokens"
        )
    out, mask = model.generate(
        torch.tensor([ids], dtype=torch.long, device=where),
        None,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        cuda_graph=cuda_graph,
    )
    return tok.decode(out[0][mask[0]].tolist())
