"""Jane Austen's six novels from ``r-cran-janeaustenr``, one document per chapter.

The novels are R character vectors (one element per line) in the package's lazy-load database
``data/Rdata.rdx`` (index) + ``data/Rdata.rdb`` (values). Each value is an R serialisation (XDR, versions 2 / 3),
read with the ``rdata`` library (:func:`r_unserialize`). ``rdata`` reads ``.rds`` / ``.rda`` files but not the
lazy-load database around them, so :func:`read_r_lazyload` keeps the few lines of framing: the index is a
serialised list ``(variables = list(name = c(offset, length)), references, compressed)``, and each value in the
``.rdb`` is a 4-byte big-endian length followed by a zlib (or, with ``compressed`` 2 / 3, a type byte and a bzip2
/ xz / uncompressed) stream.
"""

from __future__ import annotations

import bz2
import lzma
import re
import struct
import warnings
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from ...data.cache import MissingDataError
from .document import Document, collapse_whitespace

__all__ = [
    "AUSTEN_NOVELS",
    "RSerializationError",
    "austen_documents",
    "character_vector",
    "r_unserialize",
    "read_r_lazyload",
]

# janeaustenr object name -> (title, year)
AUSTEN_NOVELS: dict[str, tuple[str, int]] = {
    "sensesensibility": ("Sense and Sensibility", 1811),
    "prideprejudice": ("Pride and Prejudice", 1813),
    "mansfieldpark": ("Mansfield Park", 1814),
    "emma": ("Emma", 1815),
    "northangerabbey": ("Northanger Abbey", 1817),
    "persuasion": ("Persuasion", 1817),
}


class RSerializationError(ValueError):
    """The bytes are not an R serialisation (or lazy-load database) that can be read."""


def r_unserialize(data: bytes) -> Any:
    """Read one R object from serialisation bytes (``serialize()`` / ``saveRDS()``; gzip, bzip2 or xz wrapping is
    undone) with ``rdata``, converted to Python: character vectors are numpy arrays of ``str`` (``None`` for NA),
    named lists ``dict``, integer / double / logical vectors numpy arrays (masked where NA).

    Raises:
        RSerializationError: not an R serialisation, or an object ``rdata`` cannot read (the message says why).
    """
    try:
        import rdata
    except ImportError:
        raise MissingDataError("reading R data needs rdata: `pip install rdata` (in the data extra)") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rdata warns about R versions and classes it converts loosely
            return rdata.conversion.convert(rdata.parser.parse_data(data, extension=".rds"))
    except Exception as e:  # rdata signals malformed input with ValueError, NotImplementedError, IndexError, ...
        raise RSerializationError(f"not a readable R serialisation ({type(e).__name__}: {e})") from None


def character_vector(value: Any, name: str = "value") -> list[str | None]:
    """A converted R character vector as a list of ``str`` (``None`` for NA); anything else is an error."""
    arr = np.asarray(value) if isinstance(value, (list, np.ndarray)) else None
    if (
        arr is None
        or arr.ndim != 1
        or arr.dtype.kind not in "UO"
        or any(v is not None and not isinstance(v, str) for v in arr)
    ):
        raise RSerializationError(f"{name}: expected an R character vector, got {type(value).__name__}")
    return [None if v is None else str(v) for v in arr]


def _lazyload_blob(blob: bytes, compressed: int) -> bytes:
    """One value of a lazy-load database: a 4-byte big-endian length, then (type 2/3: a type byte and) the data."""
    if len(blob) < 4:
        raise RSerializationError("lazy-load entry shorter than its 4-byte length header")
    size = struct.unpack(">I", blob[:4])[0]
    body = blob[4:]
    kind = "Z"
    if compressed in (2, 3):
        kind, body = chr(body[0]), body[1:]
    try:
        out = {"Z": zlib.decompress, "2": bz2.decompress, "X": lzma.decompress, "0": bytes}[kind](body)
    except KeyError:
        raise RSerializationError(f"unknown lazy-load compression type {kind!r}") from None
    except (zlib.error, OSError, lzma.LZMAError) as e:
        raise RSerializationError(f"lazy-load entry does not decompress: {e}") from None
    if len(out) != size:
        raise RSerializationError(f"lazy-load entry decompressed to {len(out)} bytes, header says {size}")
    return out


def read_r_lazyload(rdx: bytes, rdb: bytes, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The objects of an R lazy-load database (``<name>.rdx`` index + ``<name>.rdb`` data), by name, each converted
    by :func:`r_unserialize`.

    Raises:
        RSerializationError: not a lazy-load index, a name not in it, or an entry that does not decode.
    """
    index = r_unserialize(rdx)
    if not isinstance(index, dict) or "variables" not in index or not isinstance(index["variables"], dict):
        raise RSerializationError("not a lazy-load index: expected a list with 'variables'")
    comp = index.get("compressed")
    compressed = int(np.asarray(comp).ravel()[0]) if comp is not None and np.size(comp) else 1
    variables = {str(k): v for k, v in index["variables"].items()}
    out = {}
    for name in list(variables) if names is None else list(names):
        if name not in variables:
            raise RSerializationError(f"object {name!r} not in the lazy-load database (has {sorted(variables)})")
        off, length = (int(v) for v in np.asarray(variables[name]).ravel()[:2])
        if off < 0 or off + length > len(rdb):
            raise RSerializationError(f"object {name!r}: bytes {off}..{off + length} outside the .rdb")
        out[name] = r_unserialize(_lazyload_blob(rdb[off : off + length], compressed))
    return out


_CHAPTER = re.compile(r"^\s*chapter\s+([ivxlcdm]+|\d+)\.?\s*$", re.IGNORECASE)
_VOLUME = re.compile(r"^\s*volume\s+([ivxlcdm]+|\d+)\.?\s*$", re.IGNORECASE)
_ITALIC = re.compile(r"(?<![\w_])_([^_]+?)_(?![\w_])")


def _lines_to_paragraphs(lines: Iterable[str]) -> list[str]:
    paras, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(collapse_whitespace(" ".join(cur)))
            cur = []
    if cur:
        paras.append(collapse_whitespace(" ".join(cur)))
    return [p for p in paras if p]


def austen_documents(novels: dict[str, list[str | None]]) -> list[Document]:
    """One document per chapter of each novel (``{name: lines}``, one string per line as in janeaustenr).

    Lines are grouped into paragraphs at blank lines; ``CHAPTER I`` / ``Chapter 1`` and ``VOLUME II`` heading lines
    start a new chapter or are dropped; ``_word_`` italics lose their underscores. The front matter before the first
    chapter (title, author, advertisement) is chapter 0. Ids: ``austen/<name>/<NNN>``.
    """
    docs = []
    for name in sorted(novels):
        chapters: list[list[str]] = [[]]
        for line in novels[name]:
            line = "" if line is None else line
            if _CHAPTER.match(line):
                chapters.append([])
            elif not _VOLUME.match(line):
                chapters[-1].append(line)
        for i, lines in enumerate(chapters):
            paras = [collapse_whitespace(_ITALIC.sub(r"\1", p)) for p in _lines_to_paragraphs(lines)]
            if paras:
                docs.append(Document(f"austen/{name}/{i:03d}", "austen", tuple(paras)))
    return docs
