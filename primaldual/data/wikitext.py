"""WikiText-103 / WikiText-2 for word-level causal language modelling, read exactly as fairseq binarises them.

Files: ``wiki.train.tokens``, ``wiki.valid.tokens``, ``wiki.test.tokens`` of the Salesforce WikiText release
(``wikitext-103-v1.zip`` / ``wikitext-2-v1.zip``: the *tokenised* version, not ``-raw-``), unzipped into one folder
(default ``<cache>/wikitext-103`` / ``<cache>/wikitext-2``). primaldual does not download them; the obtainable
stand-in is ``primaldual data fetch english`` (:mod:`primaldual.recipes.english`).

The rule implemented is fairseq's (``fairseq-preprocess --only-source`` then the ``language_modeling`` task with
``--sample-break-mode none``: ``Dictionary.add_file_to_dictionary`` and ``Dictionary.encode_line(...,
append_eos=True)`` with ``tokenize_line``):

* a file is read as UTF-8 text and cut into lines at ``\\n``, ``\\r\\n`` or ``\\r`` (Python's universal newlines);
* **every line, including empty and whitespace-only ones**, becomes its words (``line.split()``: runs of Unicode
  whitespace separate words, leading and trailing whitespace is dropped) followed by one end-of-sentence symbol
  ``</s>`` (the ``<eos>``). A blank line is therefore a lone ``</s>``; WikiText's `` = Title = `` heading lines
  and `` @-@ `` / `` @,@ `` tokens are ordinary words;
* the dictionary comes from the train split: the specials ``<s>`` = 0, ``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3,
  then every train word by decreasing count, ties in code-point order, then ``madeupword0000``, ``madeupword0001``,
  ... until the size is a multiple of 8 (``padding_factor``; 1 turns it off);
* ``<unk>``, already in the WikiText text, is the special ``<unk>``; a valid / test word absent from the train
  dictionary also maps to ``<unk>``;
* a split's token stream is all its lines' ids concatenated; ``--sample-break-mode none`` cuts it into blocks of
  ``tokens_per_sample`` regardless of line and article boundaries (:class:`primaldual.data.lm.TokenChunkDataset`).

Reading is plain Python, about 1M words per second: WikiText-103's train split (about 103M words) takes about
2 minutes and 0.4 GB as int32.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..utils.io import atomic_write_text
from .cache import MissingDataError, dataset_dir

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "UNK",
    "WIKITEXT_FILES",
    "WikiText",
    "WordDictionary",
    "find_wikitext_files",
    "load_wikitext",
    "read_lines",
    "tokenize_line",
]

BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"
WIKITEXT_FILES: dict[str, str] = {
    "train": "wiki.train.tokens",
    "valid": "wiki.valid.tokens",
    "test": "wiki.test.tokens",
}
WIKITEXT_HINT = (
    "get wikitext-103-v1.zip or wikitext-2-v1.zip (the tokenised release, not -raw-) from the Salesforce WikiText "
    "release (https://blog.salesforceairesearch.com/the-wikitext-long-term-dependency-language-modeling-dataset/) "
    "and unzip it there; primaldual does not download it (obtainable stand-in: `primaldual data fetch english`)"
)


def tokenize_line(line: str) -> list[str]:
    """fairseq's ``tokenize_line``: whitespace runs collapse, leading / trailing whitespace goes, split on it."""
    return line.split()


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a WikiText file (universal newlines, UTF-8, line endings removed).

    Raises:
        MissingDataError: the file does not exist. ValueError: not UTF-8, or binary (a NUL byte), with the line.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"WikiText file {path} not found: {WIKITEXT_HINT}")
    try:
        with open(path, encoding="utf-8", newline=None) as f:
            for lineno, line in enumerate(f, start=1):
                if "\x00" in line:
                    raise ValueError(f"{path}:{lineno}: NUL byte; this is a binary file, not WikiText tokens")
                yield line.rstrip("\n")
    except UnicodeDecodeError:
        with open(path, "rb") as f:  # find the first bad line for the message
            for lineno, raw in enumerate(f, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not UTF-8 ({e.reason} at byte {e.start} of the line)") from None
        raise ValueError(f"{path}: not UTF-8") from None


@dataclass
class WordDictionary:
    """A fairseq-compatible word dictionary: ``symbols[i]`` is the word of id ``i``, ``counts[i]`` its train count.

    Build it with :meth:`from_files` / :meth:`from_counts`; :meth:`save` writes fairseq's ``dict.txt`` layout
    (``word count`` per line, specials omitted) and :meth:`load` reads it back.
    """

    symbols: list[str] = field(default_factory=lambda: [BOS, PAD, EOS, UNK])
    counts: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    nspecial: int = 4

    bos_index, pad_index, eos_index, unk_index = 0, 1, 2, 3

    def __post_init__(self) -> None:
        self.indices = {s: i for i, s in enumerate(self.symbols)}
        if len(self.indices) != len(self.symbols):
            raise ValueError("duplicate symbols in the dictionary")

    def __len__(self) -> int:
        return len(self.symbols)

    def __contains__(self, word: str) -> bool:
        return word in self.indices

    def index(self, word: str) -> int:
        """The id of ``word``; ``<unk>`` (3) for a word outside the dictionary."""
        return self.indices.get(word, self.unk_index)

    @classmethod
    def from_counts(cls, counts: Counter, padding_factor: int = 8) -> WordDictionary:
        """Specials, then words by decreasing count (ties in code-point order), then ``madeupwordNNNN`` padding."""
        special = [BOS, PAD, EOS, UNK]
        symbols, cnt = list(special), [counts.get(s, 0) for s in special]
        for word, c in sorted(((w, c) for w, c in counts.items() if w not in special), key=lambda wc: (-wc[1], wc[0])):
            symbols.append(word)
            cnt.append(c)
        i = 0
        while padding_factor > 1 and len(symbols) % padding_factor:
            symbols.append(f"madeupword{i:04d}")
            cnt.append(0)
            i += 1
        return cls(symbols, cnt)

    @staticmethod
    def count_lines(lines: Iterable[str]) -> Counter:
        """Word counts of ``lines`` plus one ``</s>`` per line (fairseq's ``add_file_to_dictionary``)."""
        counts: Counter = Counter()
        n = 0
        for line in lines:
            counts.update(tokenize_line(line))
            n += 1
        counts[EOS] += n
        return counts

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike], padding_factor: int = 8) -> WordDictionary:
        counts: Counter = Counter()
        for p in paths:
            counts.update(cls.count_lines(read_lines(p)))
        return cls.from_counts(counts, padding_factor)

    def encode_line(self, line: str, append_eos: bool = True) -> list[int]:
        """Ids of the words of ``line`` (unknown words -> ``<unk>``), then ``</s>``."""
        ids = [self.indices.get(w, self.unk_index) for w in tokenize_line(line)]
        if append_eos:
            ids.append(self.eos_index)
        return ids

    def encode_lines(self, lines: Iterable[str]) -> np.ndarray:
        """The concatenated ids of ``lines`` (each with its ``</s>``) as int32."""
        get, unk, eos = self.indices.get, self.unk_index, self.eos_index

        def ids() -> Iterator[int]:
            for line in lines:
                for w in line.split():
                    yield get(w, unk)
                yield eos

        return np.fromiter(ids(), dtype=np.int32)

    def string(self, ids: Iterable[int]) -> str:
        """The words of ``ids``, joined by spaces within a line; each ``</s>`` ends a line."""
        lines, cur = [], []
        for i in ids:
            if int(i) == self.eos_index:
                lines.append(" ".join(cur))
                cur = []
            else:
                cur.append(self.symbols[int(i)])
        return "\n".join(lines + ([" ".join(cur)] if cur else []))

    def save(self, path: str | os.PathLike) -> Path:
        """fairseq's ``dict.txt``: ``word count`` per line for the non-special symbols (atomic write)."""
        lines = [f"{s} {c}\n" for s, c in zip(self.symbols[self.nspecial :], self.counts[self.nspecial :])]
        return atomic_write_text(path, "".join(lines))

    @classmethod
    def load(cls, path: str | os.PathLike) -> WordDictionary:
        """Read a ``dict.txt`` written by :meth:`save` (or by fairseq) back."""
        symbols, counts = [BOS, PAD, EOS, UNK], [0, 0, 0, 0]
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                word, sep, count = line.rstrip("\n").rpartition(" ")
                if not sep or not count.lstrip("-").isdigit():
                    raise ValueError(f"{path}:{lineno}: expected '<word> <count>', got {line.rstrip()!r}")
                if word in (BOS, PAD, EOS, UNK):
                    counts[symbols.index(word)] = int(count)
                    continue
                symbols.append(word)
                counts.append(int(count))
        return cls(symbols, counts)


@dataclass
class WikiText:
    """A loaded WikiText: the train dictionary, each split's token stream (int32) and a description."""

    dictionary: WordDictionary
    tokens: dict[str, np.ndarray]
    info: dict

    @property
    def vocab_size(self) -> int:
        return len(self.dictionary)


def find_wikitext_files(root: str | os.PathLike, splits: Iterable[str] = tuple(WIKITEXT_FILES)) -> dict[str, Path]:
    """``{split: path}`` of the WikiText files in ``root`` (or ``root/wikitext-103``, ``root/wikitext-2``).

    Raises:
        MissingDataError: a file is missing (one line: the file and where to get it).
    """
    root = Path(root)
    splits = list(splits)
    bad = [s for s in splits if s not in WIKITEXT_FILES]
    if bad:
        raise ValueError(f"splits: expected among {list(WIKITEXT_FILES)}, got {bad}")
    candidates = [root, root / "wikitext-103", root / "wikitext-2"]
    base = next((c for c in candidates if (c / WIKITEXT_FILES["train"]).is_file()), root)
    out = {}
    for s in splits:
        p = base / WIKITEXT_FILES[s]
        if not p.is_file():
            raise MissingDataError(f"WikiText file {p} not found: {WIKITEXT_HINT}")
        out[s] = p
    return out


def load_wikitext(
    root: str | os.PathLike | None = None,
    *,
    name: str = "wikitext-103",
    splits: Iterable[str] = tuple(WIKITEXT_FILES),
    padding_factor: int = 8,
) -> WikiText:
    """Read WikiText from ``root`` (default ``<cache>/<name>``): the dictionary from ``wiki.train.tokens``, then the
    token stream of every split in ``splits`` (see the module docstring for the exact rule).

    Raises:
        MissingDataError: a file is missing. ValueError: a file is not UTF-8, binary, or the train split has no words.
    """
    root = Path(root) if root is not None else dataset_dir(name)
    splits = list(splits)
    files = find_wikitext_files(root, ["train", *[s for s in splits if s != "train"]])
    counts = WordDictionary.count_lines(read_lines(files["train"]))
    if sum(c for w, c in counts.items() if w != EOS) == 0:
        raise ValueError(f"{files['train']}: the train split has no words (empty or blank lines only)")
    d = WordDictionary.from_counts(counts, padding_factor)
    tokens = {s: d.encode_lines(read_lines(files[s])) for s in splits}
    info = {
        "dataset": name,
        "source": str(files["train"].parent),
        "rule": "fairseq: words of every line (empty lines too) + </s>; train dictionary; unknown words -> <unk>",
        "vocab_size": len(d),
        "padding_factor": padding_factor,
        "tokens": {s: int(t.size) for s, t in tokens.items()},
        "unk_tokens": {s: int((t == d.unk_index).sum()) for s, t in tokens.items()},
    }
    return WikiText(d, tokens, info)
