"""ListOps (Long-Range Arena): the TSV reader and a torch Dataset (the generator is :mod:`primaldual.recipes.listops`).

An expression is a tree of operators over the digits 0-9, written in prefix form with a closing bracket::

    [MAX 2 9 [MIN 4 7 ] 0 ]          -> 9

Operators: ``MIN``, ``MAX``, ``MED`` (the median; for an even count the mean of the two middle values rounded
down, as the public generator's ``int(median)``), ``SM`` (sum modulo 10). The label is the expression's value
(10 classes).

Tokenisations (the choice is recorded in :attr:`ListOpsDataset.info` and must be recorded with every result):

* ``"brackets"``: operators, digits and ``]`` are tokens, so the tree is recoverable from the sequence.
* ``"no_brackets"``: ``]`` is dropped, as in the widely used released LRA preprocessing; the sequence is then
  ambiguous (several trees give the same tokens), which caps the reachable accuracy.

Parentheses ``(`` / ``)`` that appear in the real LRA release files (artefacts of the original generator's
binary-tuple printing) carry no information and are dropped by both tokenisations.

Files: ``basic_train.tsv``, ``basic_val.tsv``, ``basic_test.tsv`` with the header ``Source<TAB>Target``, the names
and layout of the LRA release, so the reader serves both; :func:`primaldual.recipes.listops.write_listops` adds
``metadata.json`` (rules, seed, sizes, label histogram).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .cache import MissingDataError, dataset_dir

__all__ = [
    "LISTOPS_SPLITS",
    "OPERATORS",
    "TOKENISATIONS",
    "VOCAB",
    "VOCAB_SIZE",
    "ListOpsDataset",
    "read_listops_tsv",
    "tokenize_listops",
]

OPERATORS: tuple[str, ...] = ("MIN", "MAX", "MED", "SM")
TOKENISATIONS: tuple[str, ...] = ("brackets", "no_brackets")
LISTOPS_SPLITS: dict[str, str] = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}

# Token ids: 0 is padding; the same ids serve both tokenisations (``]`` is simply absent in "no_brackets").
VOCAB: dict[str, int] = {
    "<pad>": 0,
    **{str(d): 1 + d for d in range(10)},
    **{f"[{op}": 11 + i for i, op in enumerate(OPERATORS)},
    "]": 15,
}
VOCAB_SIZE: int = len(VOCAB)

FETCH_HINT = (
    "Generate it with `primaldual data generate listops` (96k/2k/2k, seeded), or place the LRA release files "
    "basic_train.tsv / basic_val.tsv / basic_test.tsv (from lra_release/listops-1000/) in {dir}"
)


def read_listops_tsv(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """Read a ListOps TSV (header ``Source<TAB>Target``), generated or from the LRA release.

    Args:
        path: the ``.tsv`` file.

    Returns:
        ``(sources, labels)`` with labels an int64 array of values 0-9.

    Raises:
        MissingDataError: the file does not exist (the message says how to get it).
        ValueError: a malformed header or row (the message names the file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"ListOps file {path} not found. " + FETCH_HINT.format(dir=path.parent))
    sources: list[str] = []
    labels: list[int] = []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\r\n").split("\t")
        if header[:2] != ["Source", "Target"]:
            raise ValueError(f"{path}:1: expected the header 'Source<TAB>Target', got {header!r}")
        for lineno, line in enumerate(f, start=2):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise ValueError(f"{path}:{lineno}: expected 2 tab-separated fields, got {len(parts)}")
            try:
                label = int(parts[1])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: Target must be an integer 0-9, got {parts[1]!r}") from None
            if not 0 <= label <= 9:
                raise ValueError(f"{path}:{lineno}: Target must be in 0-9, got {label}")
            sources.append(parts[0])
            labels.append(label)
    return sources, np.asarray(labels, dtype=np.int64)


def tokenize_listops(source: str, tokenisation: str = "brackets") -> list[int]:
    """Map a ListOps source string to token ids (see :data:`VOCAB`).

    Args:
        source: space-separated tokens (``(`` / ``)`` are ignored).
        tokenisation: ``"brackets"`` keeps ``]``; ``"no_brackets"`` drops it.

    Returns:
        The token ids, without padding.
    """
    if tokenisation not in TOKENISATIONS:
        raise ValueError(f"tokenisation: expected one of {TOKENISATIONS}, got {tokenisation!r}")
    keep_close = tokenisation == "brackets"
    ids = []
    for tok in source.split():
        if tok in ("(", ")"):
            continue
        if tok == "]" and not keep_close:
            continue
        try:
            ids.append(VOCAB[tok])
        except KeyError:
            raise ValueError(f"source: unknown ListOps token {tok!r}") from None
    return ids


class ListOpsDataset(Dataset):
    """One split of ListOps as fixed-length token sequences.

    Items are tuples ``(tokens (L,) int64 padded with 0, mask (L,) bool (True = real token), label int64)``, the
    batch layout ``(tokens, mask, y)`` of :class:`~primaldual.models.SequenceClassifier` training.

    Args:
        root: directory holding ``basic_{train,val,test}.tsv`` (default: ``<cache>/listops``).
        split: ``"train"``, ``"val"`` or ``"test"``.
        tokenisation: ``"brackets"`` or ``"no_brackets"`` (recorded in :attr:`info`).
        max_len: padded length L (LRA uses 2048; longer sequences are an error, never silently cut).
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        split: str = "train",
        *,
        tokenisation: str = "brackets",
        max_len: int = 2048,
    ) -> None:
        if split not in LISTOPS_SPLITS:
            raise ValueError(f"split: expected one of {list(LISTOPS_SPLITS)}, got {split!r}")
        if tokenisation not in TOKENISATIONS:
            raise ValueError(f"tokenisation: expected one of {TOKENISATIONS}, got {tokenisation!r}")
        root = Path(root) if root is not None else dataset_dir("listops")
        path = root / LISTOPS_SPLITS[split]
        sources, labels = read_listops_tsv(path)
        tokens = np.zeros((len(sources), max_len), dtype=np.uint8)  # (M, L); vocab < 256
        lengths = np.zeros(len(sources), dtype=np.int64)
        for i, src in enumerate(sources):
            ids = tokenize_listops(src, tokenisation)
            if len(ids) > max_len:
                raise ValueError(f"{path}: example {i} has {len(ids)} tokens > max_len={max_len}")
            tokens[i, : len(ids)] = ids
            lengths[i] = len(ids)
        self.tokens, self.lengths, self.labels = tokens, lengths, labels
        meta_path = root / "metadata.json"
        generated = meta_path.is_file()
        self.info: dict = {
            "dataset": "listops",
            "split": split,
            "source": "generated" if generated else "LRA release files",
            "tokenisation": tokenisation,
            "max_len": max_len,
            "vocab_size": VOCAB_SIZE,
            "num_classes": 10,
            "size": len(sources),
        }
        if generated:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            self.info["seed"] = meta.get("seed")
            self.info["generator"] = meta.get("generator")

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    @property
    def num_classes(self) -> int:
        return 10

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.from_numpy(self.tokens[i].astype(np.int64))  # (L,)
        mask = torch.arange(tokens.shape[0]) < int(self.lengths[i])  # (L,) True = real token
        return tokens, mask, torch.tensor(self.labels[i])
