"""Real English prose for causal language modelling, built from three Debian packages (``data fetch english``).

The WikiText files are not downloadable by this library, so this corpus stands in for them: it is obtainable on
any Debian 12 machine (``apt-get download``, no installation, no root needed for the download itself) or from
``.deb`` files placed in a folder (``primaldual data fetch english --from DIR``, for a machine without apt or
without internet).

Sources, one *document* each, one module each (the ``.deb`` files are read by :mod:`.deb`, with python-debian):

* ``linux-doc-6.1`` (:mod:`.kernel_doc`): every kernel documentation file ``Documentation/**/*.rst``
  (translations left out), reStructuredText reduced to prose paragraphs by hand-written line rules (the module
  says why not docutils).
* ``r-cran-janeaustenr`` (:mod:`.austen`): Jane Austen's six novels, R character vectors in the package's
  lazy-load database, read with ``rdata``; one document per chapter.
* ``bible-kjv-text`` (:mod:`.kjv`): the King James Bible in ``/usr/lib/bible.data``, LZW windows decoded with
  ``unlzw3``; one document per book, one verse per paragraph.

Every document is a list of paragraphs (one line each, whitespace collapsed). Documents are assigned to
``train`` / ``valid`` / ``test`` by a seeded hash of their id (:func:`split_of`, 90 / 5 / 5), so no document is in
two splits, and written in sorted id order, one paragraph per line and a blank line between documents
(``train.txt``, ``valid.txt``, ``test.txt``; ``documents.tsv`` lists which document went where). A byte-level BPE
tokenizer (Hugging Face ``tokenizers``) is trained on ``train.txt`` only and saved as ``tokenizer.json``; each split's
token stream is stored as ``{split}.u16.npy`` (:func:`encode_lines`). ``metadata.json`` records the packages
(name, version, ``.deb`` SHA-256), the rules, per-split sizes and the SHA-256 of every file. Extraction and ordering
are deterministic: the same ``.deb`` files give the same bytes. The corpus is read back by
:func:`primaldual.data.lm.load_english_lm` and :func:`primaldual.data.lm.load_english_metadata`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ...data.cache import MissingDataError, data_root, dataset_dir
from ...utils.io import atomic_dir, sha256_file
from .austen import AUSTEN_NOVELS, RSerializationError, austen_documents, character_vector, read_r_lazyload
from .deb import deb_info, iter_deb_files
from .document import Document
from .kernel_doc import is_kernel_rst, kernel_doc_documents
from .kjv import decode_kjv_data, kjv_documents

__all__ = [
    "AUSTEN_PACKAGE",
    "DEFAULT_VOCAB_SIZE",
    "ENGLISH_SPLITS",
    "GENERATOR",
    "KERNEL_DOC_PACKAGE",
    "KJV_PACKAGE",
    "PACKAGES",
    "Document",
    "download_debs",
    "encode_lines",
    "english_documents",
    "fetch_english",
    "find_debs",
    "split_documents",
    "split_of",
    "split_text",
    "train_bpe_tokenizer",
    "write_english",
]

ENGLISH_SPLITS: tuple[str, ...] = ("train", "valid", "test")
SPLIT_FRACTIONS: tuple[float, float, float] = (0.90, 0.05, 0.05)
DEFAULT_VOCAB_SIZE = 8192
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>",)  # id 0; reserved, not used in the token streams
# The module moved from primaldual.data.english; the identifier in metadata.json keeps its old name so that existing
# corpora stay valid (a new identifier would mean other bytes).
GENERATOR = "primaldual.data.english v1"

KERNEL_DOC_PACKAGE = "linux-doc-6.1"
AUSTEN_PACKAGE = "r-cran-janeaustenr"
KJV_PACKAGE = "bible-kjv-text"
PACKAGES: tuple[str, ...] = (KERNEL_DOC_PACKAGE, AUSTEN_PACKAGE, KJV_PACKAGE)


# ----------------------------------------------------------------------------------------------- corpus
def english_documents(
    debs: dict[str, str | os.PathLike], progress: Callable[[int], None] | None = None
) -> dict[str, list[Document]]:
    """Extract the documents of each package (``{package: .deb path}`` for the three :data:`PACKAGES`; the kernel
    documentation may come from another ``linux-doc-<version>`` package). ``progress(n)`` is called per document."""
    out: dict[str, list[Document]] = {}
    tick = progress or (lambda n: None)
    kjv = dict(iter_deb_files(debs[KJV_PACKAGE], lambda n: n.endswith("usr/lib/bible.data")))
    if not kjv:
        raise ValueError(f"{debs[KJV_PACKAGE]}: no usr/lib/bible.data in the package")
    out[KJV_PACKAGE] = kjv_documents(decode_kjv_data(next(iter(kjv.values()))))
    tick(len(out[KJV_PACKAGE]))
    files = dict(
        iter_deb_files(debs[AUSTEN_PACKAGE], lambda n: n.endswith(("janeaustenr/data/Rdata.rdx", "data/Rdata.rdb")))
    )
    rdx = next((v for k, v in files.items() if k.endswith(".rdx")), None)
    rdb = next((v for k, v in files.items() if k.endswith(".rdb")), None)
    if rdx is None or rdb is None:
        raise ValueError(f"{debs[AUSTEN_PACKAGE]}: no janeaustenr/data/Rdata.rdx + Rdata.rdb in the package")
    objects = {k: v for k, v in read_r_lazyload(rdx, rdb).items() if k in AUSTEN_NOVELS}
    if not objects:
        raise RSerializationError(f"janeaustenr: expected the novels {sorted(AUSTEN_NOVELS)} as character vectors")
    out[AUSTEN_PACKAGE] = austen_documents({k: character_vector(v, f"janeaustenr {k}") for k, v in objects.items()})
    tick(len(out[AUSTEN_PACKAGE]))
    kernel = [k for k in debs if k not in (KJV_PACKAGE, AUSTEN_PACKAGE)]
    if len(kernel) != 1:
        raise ValueError(f"expected one kernel documentation package besides {KJV_PACKAGE}, {AUSTEN_PACKAGE}")
    docs = []
    for path, content in iter_deb_files(debs[kernel[0]], is_kernel_rst):
        docs += kernel_doc_documents([(path, content)])
        tick(1)
    if not docs:
        raise ValueError(f"{debs[kernel[0]]}: no Documentation/**/*.rst files with prose")
    out[kernel[0]] = sorted(docs, key=lambda d: d.doc_id)
    return out


def split_of(doc_id: str, seed: int = 0, fractions: tuple[float, float, float] = SPLIT_FRACTIONS) -> str:
    """``train`` / ``valid`` / ``test`` for a document: ``u = first 8 bytes of sha256(f"{seed}:{doc_id}")`` read as
    a big-endian integer / 2**64, then ``u < 0.90`` train, ``< 0.95`` valid, else test (for the default fractions)."""
    digest = hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    if u < fractions[0]:
        return "train"
    return "valid" if u < fractions[0] + fractions[1] else "test"


def split_documents(docs: Iterable[Document], seed: int = 0) -> dict[str, list[Document]]:
    """Documents by split (:func:`split_of`), each split in sorted id order. Duplicate ids are an error."""
    out: dict[str, list[Document]] = {s: [] for s in ENGLISH_SPLITS}
    seen: set[str] = set()
    for d in docs:
        if d.doc_id in seen:
            raise ValueError(f"duplicate document id {d.doc_id!r}")
        seen.add(d.doc_id)
        out[split_of(d.doc_id, seed)].append(d)
    return {s: sorted(v, key=lambda d: d.doc_id) for s, v in out.items()}


def split_text(docs: Iterable[Document]) -> str:
    """The text of a split: each document's paragraphs, one per line, and an empty line between documents."""
    return "\n".join(d.text for d in docs)


# ----------------------------------------------------------------------------------------------- tokenizer
def train_bpe_tokenizer(lines: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, min_frequency: int = 2):
    """Train a byte-level BPE tokenizer (Hugging Face ``tokenizers``; GPT-2 pre-tokenisation, no prefix space, all
    256 byte symbols in the initial alphabet, ``<|endoftext|>`` as id 0) on ``lines``.

    The trainer has no random state; the same lines give the same ``tokenizer.json``.
    """
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise MissingDataError("the BPE tokenizer needs Hugging Face tokenizers: `pip install tokenizers`") from None
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def encode_lines(tokenizer, text: str, batch: int = 4096) -> np.ndarray:
    """Token ids of ``text``: each line (with its ``\\n``) encoded on its own, the ids concatenated. Decoding the
    stream gives ``text`` back byte for byte (byte-level BPE is lossless)."""
    lines = text.splitlines(keepends=True)
    parts = []
    for i in range(0, len(lines), batch):
        for enc in tokenizer.encode_batch(lines[i : i + batch], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _token_dtype(vocab_size: int) -> tuple[np.dtype, str]:
    return (np.dtype(np.uint16), "u16") if vocab_size <= 1 << 16 else (np.dtype(np.uint32), "u32")


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------- writer
EXTRACTION_RULES = {
    KERNEL_DOC_PACKAGE: (
        "one document per Documentation/**/*.rst file (translations/ skipped); comments, directives with their "
        "bodies (admonition bodies kept), literal blocks after '::', grid and simple tables, field lists and "
        "section adornments dropped; section titles kept; inline markup reduced to its text; paragraphs kept when "
        "prose (>= 4 words, >= 75% letters among non-space characters, >= 60% word-like tokens, one lower-case)"
    ),
    AUSTEN_PACKAGE: (
        "the six novels' character vectors from data/Rdata.rdb (R lazy-load database); one document per chapter "
        "(front matter = chapter 0); chapter / volume heading lines dropped; paragraphs at blank lines; _italic_ "
        "underscores removed"
    ),
    KJV_PACKAGE: (
        "usr/lib/bible.data (EC02, LZW windows) decoded; one document per book; one verse per paragraph, "
        "references dropped"
    ),
}


def write_english(
    debs: dict[str, str | os.PathLike],
    out_dir: str | os.PathLike | None = None,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Extract, split, tokenise and write the corpus atomically into ``out_dir`` (default ``<cache>/english``).

    Args:
        debs: ``{package: .deb path}`` (see :func:`find_debs`). vocab_size: BPE vocabulary (default 8192).
        seed: seed of the document split. overwrite: replace an existing directory.
        progress: called with the number of documents extracted so far (for a progress bar). log: status lines.

    Returns:
        The directory: ``{train,valid,test}.txt``, ``{split}.u16.npy`` (token ids), ``tokenizer.json``,
        ``documents.tsv``, ``metadata.json``.
    """
    import tokenizers

    say = log or (lambda s: None)
    out_dir = Path(out_dir) if out_dir is not None else dataset_dir("english")
    infos = {pkg: deb_info(p) for pkg, p in sorted(debs.items())}
    for pkg, info in infos.items():
        if info.package != pkg:
            raise ValueError(f"{info.path}: contains package {info.package!r}, expected {pkg!r}")
    by_source = english_documents(debs, progress)
    splits = split_documents(d for docs in by_source.values() for d in docs)
    texts = {s: split_text(docs) for s, docs in splits.items()}
    if not texts["train"]:
        raise ValueError("the train split is empty")
    say(f"training a byte-level BPE tokenizer (vocabulary {vocab_size}) on train.txt")
    tok = train_bpe_tokenizer(texts["train"].splitlines(keepends=True), vocab_size)
    dtype, tag = _token_dtype(tok.get_vocab_size())
    meta: dict[str, Any] = {
        "dataset": "english",
        "description": "real English prose from Debian packages (kernel documentation, Jane Austen, KJV Bible)",
        "stand_in_for": "WikiText-103 / WikiText-2 (causal language modelling)",
        "generator": GENERATOR,
        "seed": seed,
        "split_rule": (
            "by document: u = int(sha256(f'{seed}:{doc_id}')[:8], big-endian) / 2**64; "
            f"train if u < {SPLIT_FRACTIONS[0]}, valid if u < {SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]}, else test"
        ),
        "text_format": "UTF-8; one paragraph per line; an empty line between documents; documents sorted by id",
        "sources": {},
        "tokenizer": {},
        "splits": {},
    }
    for pkg, info in infos.items():
        ids = {d.doc_id for d in by_source[pkg]}
        counts = {s: sum(d.doc_id in ids for d in splits[s]) for s in ENGLISH_SPLITS}
        meta["sources"][pkg] = dict(info.record(), documents=len(by_source[pkg]), per_split=counts)
        meta["sources"][pkg]["rule"] = EXTRACTION_RULES.get(pkg, EXTRACTION_RULES[KERNEL_DOC_PACKAGE])
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        tok.save(str(tmp / "tokenizer.json"))
        meta["tokenizer"] = {
            "file": "tokenizer.json",
            "type": f"byte-level BPE (Hugging Face tokenizers {tokenizers.__version__})",
            "vocab_size": tok.get_vocab_size(),
            "requested_vocab_size": vocab_size,
            "trained_on": "train.txt (each line with its newline)",
            "special_tokens": {t: tok.token_to_id(t) for t in SPECIAL_TOKENS},
            "encoding": "each line with its newline encoded on its own, ids concatenated (no special tokens)",
            "sha256": sha256_file(tmp / "tokenizer.json"),
        }
        rows = ["split\tdoc_id\tsource\tparagraphs\tbytes"]
        for split in ENGLISH_SPLITS:
            say(f"encoding {split}.txt")
            data = texts[split].encode("utf-8")
            (tmp / f"{split}.txt").write_bytes(data)
            ids = encode_lines(tok, texts[split])
            (tmp / f"{split}.{tag}.npy").write_bytes(_npy_bytes(ids.astype(dtype)))
            rows += [
                f"{split}\t{d.doc_id}\t{d.source}\t{len(d.paragraphs)}\t{len(d.text.encode())}" for d in splits[split]
            ]
            meta["splits"][split] = {
                "file": f"{split}.txt",
                "bytes": len(data),
                "documents": len(splits[split]),
                "paragraphs": sum(len(d.paragraphs) for d in splits[split]),
                "sha256": hashlib.sha256(data).hexdigest(),
                "tokens": int(ids.size),
                "token_file": f"{split}.{tag}.npy",
                "token_dtype": dtype.name,
                "token_sha256": sha256_file(tmp / f"{split}.{tag}.npy"),
                "bytes_per_token": len(data) / max(int(ids.size), 1),
            }
        (tmp / "documents.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
        meta["documents_file"] = {"file": "documents.tsv", "sha256": sha256_file(tmp / "documents.tsv")}
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out_dir


# ----------------------------------------------------------------------------------------------- fetching
def _deb_cache() -> Path:
    return dataset_dir("debs", data_root())


def find_debs(folder: str | os.PathLike) -> dict[str, Path]:
    """The three ``.deb`` files in ``folder`` (``<package>_<version>_<arch>.deb``; for the kernel documentation
    ``linux-doc-6.1`` is preferred, any other ``linux-doc-<version>`` package is accepted).

    Raises:
        MissingDataError: a package is missing or present in more than one version (names what to put where).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingDataError(f"--from {folder}: not a folder (put {', '.join(PACKAGES)} .deb files in one)")
    found: dict[str, Path] = {}
    for pkg in PACKAGES:
        hits = sorted(folder.glob(f"{pkg}_*.deb"))
        if not hits and pkg == KERNEL_DOC_PACKAGE:
            hits = sorted(p for p in folder.glob("linux-doc-*_*.deb") if re.match(r"linux-doc-\d", p.name))
        if len(hits) > 1:
            raise MissingDataError(
                f"{folder}: several .deb files for {pkg} ({', '.join(p.name for p in hits)}); keep one"
            )
        if hits:
            found[pkg if pkg != KERNEL_DOC_PACKAGE else hits[0].name.split("_")[0]] = hits[0]
    kernel = [k for k in found if k.startswith("linux-doc-")]
    missing = [p for p in PACKAGES if p not in found and not (p == KERNEL_DOC_PACKAGE and kernel)]
    if missing:
        raise MissingDataError(
            f"{folder}: missing .deb file(s) for {', '.join(missing)}; download them on a Debian 12 machine with "
            f"`apt-get download {' '.join(missing)}` (or from packages.debian.org) and place them there"
        )
    return found


def download_debs(dest: str | os.PathLike) -> dict[str, Path]:
    """``apt-get download`` the three packages into ``dest`` (kept there as a cache) and return their paths.

    Raises:
        MissingDataError: no ``apt-get``, or the download failed (one line: the cause and the ``--from`` way out).
    """
    dest = Path(dest)
    way_out = (
        f"or download {', '.join(PACKAGES)} .deb files elsewhere and run `primaldual data fetch english --from DIR`"
    )
    if shutil.which("apt-get") is None:
        raise MissingDataError(f"apt-get not found (not a Debian / Ubuntu system): {way_out}")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        res = subprocess.run(["apt-get", "download", *PACKAGES], cwd=tmp, capture_output=True, text=True)
        if res.returncode != 0:
            errors = [line for line in res.stderr.splitlines() if line.startswith("E:")] or res.stderr.splitlines()
            cause = errors[0].strip() if errors else f"exit status {res.returncode}"
            hint = " (run `apt-get update` as root first)" if "Unable to locate" in cause else ""
            raise MissingDataError(f"`apt-get download {' '.join(PACKAGES)}` failed: {cause}{hint}; {way_out}")
        for p in sorted(Path(tmp).glob("*.deb")):
            for old in dest.glob(p.name.split("_")[0] + "_*.deb"):  # an older cached version of the package
                old.unlink()
            os.replace(p, dest / p.name)
    return find_debs(dest)


def fetch_english(
    out: str | os.PathLike | None = None,
    *,
    from_dir: str | os.PathLike | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    force: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
) -> Path:
    """``primaldual data fetch english``: obtain the packages and write the corpus (see :func:`write_english`).

    The ``.deb`` files come from ``from_dir`` if given, else from ``<cache>/debs`` if all three are there, else from
    ``apt-get download`` (kept in ``<cache>/debs``, so a second fetch needs no network). An existing corpus is
    returned as it is unless ``force``.
    """
    from ...options import check_int

    check_int("--vocab-size", vocab_size, low=256 + len(SPECIAL_TOKENS))  # before minutes of extraction
    out_dir = Path(out) if out is not None else dataset_dir("english")
    if (out_dir / "metadata.json").is_file() and not force:
        return out_dir
    say = log or (lambda s: None)
    if from_dir is not None:
        debs = find_debs(from_dir)
    else:
        try:
            debs = find_debs(_deb_cache())
        except MissingDataError:
            say(f"apt-get download {' '.join(PACKAGES)} -> {_deb_cache()}")
            debs = download_debs(_deb_cache())
    for pkg, path in sorted(debs.items()):
        say(f"{pkg}: {path}")
    if progress:
        from tqdm import tqdm

        with tqdm(desc="english documents", unit="doc", smoothing=0.05, disable=None) as bar:  # None: a terminal only

            def status(line: str) -> None:  # the bar covers the extraction; close it before the next stage
                bar.close()
                say(line)

            return write_english(
                debs, out_dir, vocab_size=vocab_size, seed=seed, overwrite=True, progress=bar.update, log=status
            )
    return write_english(debs, out_dir, vocab_size=vocab_size, seed=seed, overwrite=True, log=say)
