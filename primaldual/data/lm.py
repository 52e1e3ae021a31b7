"""Causal language modelling data: contiguous token chunks, the unigram floor, and bits per byte.

* :class:`TokenChunkDataset` cuts a split's token stream (``N`` ids) into contiguous chunks of ``T =
  tokens_per_sample`` (default 512): sample ``i`` is ``tokens = stream[i*T : i*T + T]`` and ``targets =
  stream[i*T + 1 : i*T + T + 1]`` (the same window shifted by one), both ``int64`` tensors of length ``T``.
  Chunks do not overlap; the target of a chunk's last position is the first token of the next chunk. There are
  ``(N - 1) // T`` full chunks. The remainder (``(N - 1) % T`` targets) is dropped (``last="drop"``, the default,
  for training) or kept as one more sample (``last="pad"``, for evaluation: then every token but the first is a
  target once), its inputs padded with ``pad_id`` and its targets with :data:`IGNORE_INDEX` (-100, the default
  ``ignore_index`` of ``torch.nn.functional.cross_entropy``). Map-style and deterministic, so the harness's
  ``TrainerEpochSampler`` shuffles it per epoch and resumes it exactly mid-epoch.
* :func:`unigram_perplexity`: the floor any language model must beat. The add-one smoothed unigram distribution of
  the train stream, ``p(w) = (count_train(w) + 1) / (N_train + V)``, evaluated on a split: ``exp(-mean over the
  split's tokens of log p(w))`` (the exponential of the cross-entropy of the split under the train unigram model).
* :func:`bits_per_byte`: a tokenizer-independent score, ``nats_per_token * n_tokens / n_bytes / ln 2`` where
  ``n_tokens`` are the predicted tokens and ``n_bytes`` the UTF-8 bytes of the text they cover (for a whole split
  evaluated with ``last="pad"``: ``N - 1`` targets and the split file's size, the first token's bytes included,
  a negligible difference).

:func:`load_english_lm` gives the three splits of ``primaldual data fetch english`` (built by
:mod:`primaldual.recipes.english`) as datasets, :func:`load_english_metadata` its ``metadata.json``; WikiText token
streams (:func:`primaldual.data.wikitext.load_wikitext`) go through :func:`chunk_splits`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .cache import MissingDataError, dataset_dir
from .npy import load_npy

__all__ = [
    "ENGLISH_HINT",
    "IGNORE_INDEX",
    "TokenChunkDataset",
    "bits_per_byte",
    "chunk_splits",
    "load_english_lm",
    "load_english_metadata",
    "load_token_file",
    "nats_per_token_from_bits_per_byte",
    "unigram_baseline",
    "unigram_nll",
    "unigram_perplexity",
]

IGNORE_INDEX = -100

# How to obtain the corpus; the package names are those of primaldual.recipes.english.PACKAGES (a test checks it).
ENGLISH_HINT = (
    "Fetch it with `primaldual data fetch english` (apt-get downloads the Debian packages "
    "linux-doc-6.1, r-cran-janeaustenr, bible-kjv-text; nothing is installed), or place those .deb files in a "
    "folder and run `primaldual data fetch english --from DIR`"
)


def load_token_file(path: str | os.PathLike) -> np.ndarray:
    """A 1-D token stream saved with ``np.save`` (``.npy``), memory-mapped read-only (``allow_pickle=False``)."""
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"token file {path} not found")
    arr = load_npy(path, mmap_mode="r")
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{path}: expected a 1-D integer array, got {arr.dtype} {arr.shape}")
    return arr


class TokenChunkDataset(Dataset):
    """Contiguous ``(tokens, targets)`` chunks of a token stream (see the module docstring).

    Args:
        tokens: the split's token ids, 1-D (a NumPy array, memory-mapped or not, or a tensor).
        tokens_per_sample: chunk length ``T`` (default 512).
        last: ``"drop"`` the final partial chunk (default) or ``"pad"`` it (inputs with ``pad_id``, targets with
            :data:`IGNORE_INDEX`).
        pad_id: input id of padded positions (``last="pad"``).
        info: description kept in :attr:`info` (dataset, split, tokenizer, ...).
    """

    def __init__(
        self,
        tokens: np.ndarray | torch.Tensor,
        tokens_per_sample: int = 512,
        *,
        last: str = "drop",
        pad_id: int = 0,
        info: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.numpy()
        if tokens.ndim != 1:
            raise ValueError(f"tokens: expected a 1-D stream, got shape {tuple(tokens.shape)}")
        if tokens_per_sample < 1:
            raise ValueError(f"tokens_per_sample must be >= 1, got {tokens_per_sample}")
        if last not in ("drop", "pad"):
            raise ValueError(f"last: expected 'drop' or 'pad', got {last!r}")
        self.tokens, self.T, self.last, self.pad_id = tokens, int(tokens_per_sample), last, int(pad_id)
        n_targets = max(len(tokens) - 1, 0)
        self.full, rest = divmod(n_targets, self.T)
        self.length = self.full + (1 if last == "pad" and rest else 0)
        #: targets that count (not IGNORE_INDEX) over the whole dataset
        self.num_targets = self.full * self.T + (rest if last == "pad" else 0)
        self.info = dict(info or {}, tokens_per_sample=self.T, last=last, size=self.length, targets=self.num_targets)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = int(i)
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(f"chunk {i} out of range for {self.length} chunks")
        start = i * self.T
        window = np.asarray(self.tokens[start : start + self.T + 1], dtype=np.int64)
        x, y = window[:-1], window[1:]
        if len(y) < self.T:  # the padded last chunk
            n = len(y)
            x = np.concatenate([x, np.full(self.T - n, self.pad_id, dtype=np.int64)])
            y = np.concatenate([y, np.full(self.T - n, IGNORE_INDEX, dtype=np.int64)])
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))


def chunk_splits(
    tokens: dict[str, np.ndarray],
    tokens_per_sample: int = 512,
    *,
    eval_last: str = "pad",
    pad_id: int = 0,
    info: dict[str, Any] | None = None,
) -> dict[str, TokenChunkDataset]:
    """One :class:`TokenChunkDataset` per split: ``train`` drops its partial chunk, the others use ``eval_last``."""
    return {
        s: TokenChunkDataset(
            t,
            tokens_per_sample,
            last="drop" if s == "train" else eval_last,
            pad_id=pad_id,
            info=dict(info or {}, split=s),
        )
        for s, t in tokens.items()
    }


def load_english_metadata(root: str | os.PathLike | None = None) -> dict[str, Any]:
    """``metadata.json`` of the English corpus (default ``<cache>/english``), or a :class:`MissingDataError` that
    says how to fetch it."""
    d = Path(root) if root is not None else dataset_dir("english")
    meta = d / "metadata.json"
    if not meta.is_file():
        raise MissingDataError(f"English corpus not found in {d}. " + ENGLISH_HINT)
    try:
        values = json.loads(meta.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise ValueError(f"{meta}: not readable JSON ({e})") from None
    splits = values.get("splits") if isinstance(values, dict) else None
    vocab = values.get("tokenizer", {}).get("vocab_size") if isinstance(values, dict) else None
    if not isinstance(splits, dict) or not all(isinstance(v, dict) and "token_file" in v for v in splits.values()):
        raise ValueError(f"{meta}: expected 'splits' mapping each split to its 'token_file'")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise ValueError(f"{meta}: expected tokenizer.vocab_size, a positive int, got {vocab!r}")
    return values


def load_english_lm(
    root: str | os.PathLike | None = None,
    tokens_per_sample: int = 512,
    *,
    splits: tuple[str, ...] = ("train", "valid", "test"),
    eval_last: str = "pad",
) -> dict[str, TokenChunkDataset]:
    """The English corpus of ``primaldual data fetch english`` (default ``<cache>/english``) as chunk datasets.

    Raises:
        MissingDataError: the corpus is not there (says how to fetch it).
    """
    d = Path(root) if root is not None else dataset_dir("english")
    meta = load_english_metadata(d)
    aliases = {"val": "valid", "validation": "valid"}
    tokens, info = {}, {}
    for s in splits:
        key = aliases.get(s, s)
        if key not in meta["splits"]:
            raise ValueError(f"split: expected among {list(meta['splits'])}, got {s!r}")
        file = d / meta["splits"][key]["token_file"]
        if not file.resolve().is_relative_to(d.resolve()):
            raise ValueError(f"{d / 'metadata.json'}: splits.{key}.token_file points outside the corpus ({file})")
        tokens[s] = load_token_file(file)
        vocab = meta["tokenizer"]["vocab_size"]
        if tokens[s].size and (int(tokens[s].min()) < 0 or int(tokens[s].max()) >= vocab):
            raise ValueError(
                f"{file}: token ids must lie in [0, {vocab}) (tokenizer.vocab_size), got "
                f"[{int(tokens[s].min())}, {int(tokens[s].max())}]"
            )
        info[s] = meta["splits"][key]
    out = chunk_splits(tokens, tokens_per_sample, eval_last=eval_last, info={"dataset": "english", "root": str(d)})
    for s, ds in out.items():
        ds.info.update(bytes=info[s]["bytes"], stream_tokens=info[s]["tokens"])
        ds.vocab_size = int(meta["tokenizer"]["vocab_size"])
    return out


# ----------------------------------------------------------------------------------------------- baselines, units
def _counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got [{int(tokens.min())}, {int(tokens.max())}]")
    return np.bincount(tokens.astype(np.int64, copy=False), minlength=vocab_size)


def unigram_nll(train_tokens: np.ndarray, eval_tokens: np.ndarray, vocab_size: int) -> float:
    """Mean negative log-likelihood (nats per token) of ``eval_tokens`` under the add-one smoothed unigram model of
    ``train_tokens``: ``p(w) = (count_train(w) + 1) / (N_train + vocab_size)``."""
    if len(eval_tokens) == 0:
        raise ValueError("eval_tokens is empty")
    log_p = np.log(_counts(train_tokens, vocab_size) + 1.0) - math.log(len(train_tokens) + vocab_size)
    eval_counts = _counts(eval_tokens, vocab_size)
    return float(-(eval_counts * log_p).sum() / eval_counts.sum())


def unigram_perplexity(train_tokens: np.ndarray, eval_tokens: np.ndarray, vocab_size: int) -> float:
    """``exp(unigram_nll(...))``: the perplexity floor any language model must beat on ``eval_tokens``."""
    return math.exp(unigram_nll(train_tokens, eval_tokens, vocab_size))


def bits_per_byte(nats_per_token: float, n_tokens: int, n_bytes: int) -> float:
    """``nats_per_token * n_tokens / n_bytes / ln 2``: the same loss per byte of text, in bits."""
    if n_bytes <= 0:
        raise ValueError(f"n_bytes must be positive, got {n_bytes}")
    return nats_per_token * n_tokens / n_bytes / math.log(2)


def nats_per_token_from_bits_per_byte(bpb: float, n_tokens: int, n_bytes: int) -> float:
    """The inverse of :func:`bits_per_byte`."""
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    return bpb * n_bytes * math.log(2) / n_tokens


def unigram_baseline(
    train_tokens: np.ndarray, eval_tokens: np.ndarray, vocab_size: int, n_bytes: int | None = None
) -> dict[str, float]:
    """``{"nats_per_token", "perplexity"[, "bits_per_byte"]}`` of the add-one unigram floor on ``eval_tokens``
    (bits per byte when the split's UTF-8 size ``n_bytes`` is given)."""
    nll = unigram_nll(train_tokens, eval_tokens, vocab_size)
    out = {"nats_per_token": nll, "perplexity": math.exp(nll)}
    if n_bytes is not None:
        out["bits_per_byte"] = bits_per_byte(nll, len(eval_tokens), n_bytes)
    return out
