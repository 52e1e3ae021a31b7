"""Real English prose for causal language modelling, extracted from three Debian packages (``data fetch english``).

The WikiText files cannot be downloaded from here, so this corpus stands in for them: it is obtainable on any
Debian 12 machine (``apt-get download``, no installation, no root needed for the download itself) or from
``.deb`` files placed in a folder (``primaldual data fetch english --from DIR``).

Sources, one *document* each:

* ``linux-doc-6.1``: every kernel documentation file ``Documentation/**/*.rst`` (translations left out), one
  document per file. reStructuredText is turned into prose paragraphs by :func:`rst_to_paragraphs`: comments,
  directives with their bodies (``code-block``, ``kernel-doc``, ``toctree``, ``table``, ``image``, ...),
  literal blocks after ``::``, grid and simple tables, field lists and section adornments are dropped; the bodies
  of admonitions (``note``, ``warning``, ...) and section titles are kept; inline markup is reduced to its text;
  a paragraph is kept only when it reads as prose (:func:`is_prose`).
* ``r-cran-janeaustenr``: Jane Austen's six novels, stored as R character vectors (one element per line) inside
  the package's lazy-load database ``data/Rdata.rdb`` / ``Rdata.rdx``: zlib-compressed, XDR-serialised R objects.
  No PyPI package reads that format offline, so :func:`read_r_lazyload` / :func:`r_unserialize` are a small
  hand-written reader of R's serialisation format (versions 2 and 3), enough for data objects (vectors, lists,
  pairlists, attributes, references). One document per chapter (``CHAPTER I`` / ``Chapter 1`` lines; the front
  matter before the first chapter is document 0); chapter and volume heading lines are dropped and ``_italic_``
  underscores removed.
* ``bible-kjv-text``: the King James Bible in ``/usr/lib/bible.data``, an ``EC02`` file of independently
  LZW-compressed 64 KiB windows (the ``compress(1)`` algorithm, 16-bit codes, block mode); decoded by
  :func:`decode_kjv_data`. One document per book (66), one verse per paragraph, the ``Ge1:1`` references dropped.

Every document is a list of paragraphs (one line each, whitespace collapsed). Documents are assigned to
``train`` / ``valid`` / ``test`` by a seeded hash of their id (:func:`split_of`, 90 / 5 / 5), so no document is in
two splits, and written in sorted id order, one paragraph per line and a blank line between documents
(``train.txt``, ``valid.txt``, ``test.txt``; ``documents.tsv`` lists which document went where). A byte-level BPE
tokenizer (Hugging Face ``tokenizers``) is trained on ``train.txt`` only and saved as ``tokenizer.json``; each split's
token stream is stored as ``{split}.u16.npy`` (:func:`encode_lines`). ``metadata.json`` records the packages
(name, version, ``.deb`` SHA-256), the rules, per-split sizes and the SHA-256 of every file. Extraction and ordering
are deterministic: the same ``.deb`` files give the same bytes.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.io import atomic_dir, sha256_file
from .cache import MissingDataError, data_root, dataset_dir

__all__ = [
    "AUSTEN_NOVELS",
    "DEFAULT_VOCAB_SIZE",
    "ENGLISH_HINT",
    "ENGLISH_SPLITS",
    "KJV_BOOKS",
    "PACKAGES",
    "DebInfo",
    "Document",
    "RObject",
    "RSerializationError",
    "austen_documents",
    "clean_inline",
    "deb_info",
    "decode_kjv_data",
    "download_debs",
    "encode_lines",
    "english_documents",
    "fetch_english",
    "find_debs",
    "is_prose",
    "iter_deb_files",
    "kernel_doc_documents",
    "kjv_documents",
    "load_english_metadata",
    "read_r_lazyload",
    "rst_to_paragraphs",
    "r_unserialize",
    "split_documents",
    "split_of",
    "split_text",
    "train_bpe_tokenizer",
    "unlzw",
    "write_english",
]

ENGLISH_SPLITS: tuple[str, ...] = ("train", "valid", "test")
SPLIT_FRACTIONS: tuple[float, float, float] = (0.90, 0.05, 0.05)
DEFAULT_VOCAB_SIZE = 8192
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>",)  # id 0; reserved, not used in the token streams
GENERATOR = "primaldual.data.english v1"

KERNEL_DOC_PACKAGE = "linux-doc-6.1"
AUSTEN_PACKAGE = "r-cran-janeaustenr"
KJV_PACKAGE = "bible-kjv-text"
PACKAGES: tuple[str, ...] = (KERNEL_DOC_PACKAGE, AUSTEN_PACKAGE, KJV_PACKAGE)

ENGLISH_HINT = (
    "Fetch it with `primaldual data fetch english` (apt-get downloads the Debian packages "
    f"{', '.join(PACKAGES)}; nothing is installed), or place those .deb files in a folder and run "
    "`primaldual data fetch english --from DIR`"
)

# janeaustenr object name -> (title, year)
AUSTEN_NOVELS: dict[str, tuple[str, int]] = {
    "sensesensibility": ("Sense and Sensibility", 1811),
    "prideprejudice": ("Pride and Prejudice", 1813),
    "mansfieldpark": ("Mansfield Park", 1814),
    "emma": ("Emma", 1815),
    "northangerabbey": ("Northanger Abbey", 1817),
    "persuasion": ("Persuasion", 1817),
}

# The 66 book abbreviations of bible.data, in canonical order, with the usual English names ("_" = space).
_KJV = (
    "Ge=Genesis Exo=Exodus Lev=Leviticus Num=Numbers Deu=Deuteronomy Josh=Joshua Jdgs=Judges Ruth=Ruth "
    "1Sm=1_Samuel 2Sm=2_Samuel 1Ki=1_Kings 2Ki=2_Kings 1Chr=1_Chronicles 2Chr=2_Chronicles Ezra=Ezra "
    "Neh=Nehemiah Est=Esther Job=Job Psa=Psalms Prv=Proverbs Eccl=Ecclesiastes SSol=Song_of_Solomon "
    "Isa=Isaiah Jer=Jeremiah Lam=Lamentations Eze=Ezekiel Dan=Daniel Hos=Hosea Joel=Joel Amos=Amos "
    "Obad=Obadiah Jonah=Jonah Mic=Micah Nahum=Nahum Hab=Habakkuk Zep=Zephaniah Hag=Haggai Zec=Zechariah "
    "Mal=Malachi Mat=Matthew Mark=Mark Luke=Luke John=John Acts=Acts Rom=Romans 1Cor=1_Corinthians "
    "2Cor=2_Corinthians Gal=Galatians Eph=Ephesians Phi=Philippians Col=Colossians 1Th=1_Thessalonians "
    "2Th=2_Thessalonians 1Tim=1_Timothy 2Tim=2_Timothy Titus=Titus Phmn=Philemon Heb=Hebrews Jas=James "
    "1Pet=1_Peter 2Pet=2_Peter 1Jn=1_John 2Jn=2_John 3Jn=3_John Jude=Jude Rev=Revelation"
)
KJV_BOOKS: tuple[tuple[str, str], ...] = tuple(
    (abbr, name.replace("_", " ")) for abbr, name in (item.split("=") for item in _KJV.split())
)


@dataclass(frozen=True)
class Document:
    """One document of the corpus: an id (``source/...``, unique, used for the split) and its paragraphs."""

    doc_id: str
    source: str
    paragraphs: tuple[str, ...]

    @property
    def text(self) -> str:
        """The paragraphs, one per line, each ending with a newline."""
        return "".join(p + "\n" for p in self.paragraphs)


def _collapse(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------------------------- Debian packages
@dataclass(frozen=True)
class DebInfo:
    """A ``.deb`` file: package name and version (from its ``control`` file), SHA-256 and path."""

    package: str
    version: str
    sha256: str
    path: Path

    def record(self) -> dict[str, Any]:
        return {"package": self.package, "version": self.version, "deb_file": self.path.name, "deb_sha256": self.sha256}


def _ar_members(path: Path) -> dict[str, bytes]:
    """The members of an ``ar`` archive (the container of a ``.deb``), by name."""
    data = path.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{path}: not a Debian package (no ar archive header)")
    out, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        if header[58:60] != b"`\n":
            raise ValueError(f"{path}: corrupt ar member header at byte {pos}")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        out[name] = data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size & 1)
    return out


def _tar_stream(path: Path, prefix: str) -> tarfile.TarFile:
    """Open the ``{prefix}.tar.*`` member of a ``.deb`` as a streaming tar file."""
    members = _ar_members(path)
    name = next((n for n in sorted(members) if n.startswith(prefix + ".tar")), None)
    if name is None:
        raise ValueError(f"{path}: no {prefix}.tar.* member")
    blob = members[name]
    if name.endswith(".zst"):
        try:
            import zstandard

            blob = zstandard.ZstdDecompressor().decompress(blob, max_output_size=1 << 34)
        except ImportError:
            if shutil.which("dpkg-deb") is None:
                raise MissingDataError(f"{path}: {name} is zstd-compressed; `pip install zstandard`") from None
            flag = "--ctrl-tarfile" if prefix == "control" else "--fsys-tarfile"
            blob = subprocess.run(["dpkg-deb", flag, str(path)], capture_output=True, check=True).stdout
        return tarfile.open(fileobj=io.BytesIO(blob), mode="r|")
    return tarfile.open(fileobj=io.BytesIO(blob), mode="r|*")  # gz, bz2, xz or plain


def deb_info(path: str | os.PathLike) -> DebInfo:
    """Package name, version and SHA-256 of a ``.deb`` file."""
    path = Path(path)
    fields: dict[str, str] = {}
    with _tar_stream(path, "control") as tar:
        for m in tar:
            if m.isfile() and m.name.lstrip("./") == "control":
                for line in tar.extractfile(m).read().decode("utf-8", "replace").splitlines():
                    key, sep, value = line.partition(":")
                    if sep and not line[:1].isspace():
                        fields[key.strip()] = value.strip()
                break
    if "Package" not in fields or "Version" not in fields:
        raise ValueError(f"{path}: no Package / Version in the control file")
    return DebInfo(fields["Package"], fields["Version"], sha256_file(path), path)


def iter_deb_files(path: str | os.PathLike, select: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """``(path, content)`` of the regular files of a ``.deb`` whose path (``usr/...``, no leading ``./``) is
    selected, in archive order. Links and directories are skipped."""
    with _tar_stream(Path(path), "data") as tar:
        for m in tar:
            name = m.name[2:] if m.name.startswith("./") else m.name.lstrip("/")
            if m.isfile() and select(name):
                yield name, tar.extractfile(m).read()


# ----------------------------------------------------------------------------------------------- R serialisation
class RSerializationError(ValueError):
    """The bytes are not an R serialisation this reader understands."""


@dataclass
class RObject:
    """An R value: ``rtype`` is R's SEXP type name (``"character"``, ``"integer"``, ``"list"``, ``"pairlist"``,
    ``"symbol"``, ...); ``value`` a Python list (vectors: ``str`` / ``None`` for NA, ``int``, ``float``, ``bool``;
    pairlists: ``(tag, value)`` pairs), ``str`` (symbols) or ``bytes`` (raw); ``attributes`` a dict."""

    rtype: str
    value: Any = None
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str] | None:
        n = self.attributes.get("names")
        return list(n.value) if isinstance(n, RObject) else None

    def as_dict(self) -> dict[str, Any]:
        """A named list or vector as ``{name: element}``."""
        names = self.names
        if names is None:
            raise RSerializationError(f"{self.rtype} object has no names")
        return dict(zip(names, self.value))


_R_SPECIAL = {
    242: "emptyenv",
    241: "baseenv",
    253: "globalenv",
    252: "unbound",
    251: "missingarg",
    250: "basenamespace",
}
_R_VECTORS = {10: "logical", 13: "integer", 14: "double", 15: "complex", 16: "character", 19: "list", 20: "expression"}
_R_PAIRS = {2: "pairlist", 6: "language", 3: "closure", 5: "promise", 17: "dots"}


class _RReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.refs = data, 0, []
        self.native = "utf-8"

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise RSerializationError(f"truncated R serialisation at byte {self.pos} (need {n} more)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def length(self) -> int:
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        if n < 0:
            raise RSerializationError(f"negative vector length {n} at byte {self.pos}")
        return n

    def header(self) -> int:
        if self.take(2) != b"X\n":
            raise RSerializationError("not an XDR (binary, big-endian) R serialisation: expected 'X\\n'")
        version = self.int()
        self.int(), self.int()  # writer R version, minimal reader version
        if version == 3:
            self.native = self.take(self.int()).decode("ascii", "replace") or "utf-8"
        elif version != 2:
            raise RSerializationError(f"R serialisation version {version} is not supported (2 and 3 are)")
        return version

    def string_vec(self) -> list[str | None]:
        if self.int() != 0:
            raise RSerializationError("bad string vector in a persistent / namespace reference")
        return [self.item() for _ in range(self.int())]

    def charsxp(self, levels: int) -> str | None:
        n = self.int()
        if n == -1:
            return None  # NA_character_
        raw = self.take(n)
        if levels & (1 << 2) or levels & (1 << 1):  # latin1, bytes
            return raw.decode("latin-1")
        try:
            return raw.decode("utf-8" if levels & ((1 << 3) | (1 << 6)) else self.native)
        except (UnicodeDecodeError, LookupError):
            return raw.decode("utf-8", "replace")

    def attributes(self) -> dict[str, Any]:
        attr = self.item()
        if not isinstance(attr, RObject) or attr.rtype != "pairlist":
            return {}
        return {str(k): v for k, v in attr.value}

    def item(self) -> Any:
        flags = self.int()
        t, levels = flags & 0xFF, flags >> 12
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t == 254:
            return None  # NULL
        if t in _R_SPECIAL:
            return RObject(_R_SPECIAL[t])
        if t == 255:  # reference to an earlier symbol / environment
            i = flags >> 8 or self.int()
            if not 1 <= i <= len(self.refs):
                raise RSerializationError(f"bad reference index {i}")
            return self.refs[i - 1]
        if t in (247, 248, 249):  # persistent, package and namespace references: kept as their name
            obj = RObject({247: "persistent", 248: "package", 249: "namespace"}[t], self.string_vec())
            self.refs.append(obj)
            return obj
        if t == 1:  # symbol
            obj = RObject("symbol", self.item())
            self.refs.append(obj)
            return obj
        if t == 4:  # environment
            self.int()  # locked
            obj = RObject("environment")
            self.refs.append(obj)
            enclos, frame, hashtab = self.item(), self.item(), self.item()
            obj.value = {"enclos": enclos, "frame": frame, "hashtab": hashtab}
            obj.attributes = self.attributes()
            return obj
        if t in (239, 240):  # ATTRLISTSXP, ATTRLANGSXP (old encodings with attributes)
            t, has_attr = (2 if t == 239 else 6), True
        if t in _R_PAIRS:
            obj = RObject(_R_PAIRS[t], [])
            while True:  # iterate along the CDR chain instead of recursing
                attrs = self.attributes() if has_attr else {}
                if not obj.attributes:
                    obj.attributes = attrs
                tag = self.item() if has_tag else None
                obj.value.append((tag.value if isinstance(tag, RObject) else tag, self.item()))
                flags = self.int()
                t, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
                if t in (239, 240):
                    t, has_attr = (2 if t == 239 else 6), True
                if t == 254:
                    return obj
                if t not in _R_PAIRS:
                    self.pos -= 4
                    obj.value.append((None, self.item()))  # a dotted pair: the CDR is not a pairlist
                    return obj
        if t == 238:  # ALTREP: class info, state, attributes
            info, state, attrs = self.item(), self.item(), self.item()
            obj = self._altrep(info, state)
            if isinstance(attrs, RObject) and attrs.rtype == "pairlist":
                obj.attributes = {str(k): v for k, v in attrs.value}
            return obj
        if t == 9:
            obj = self.charsxp(levels)
        elif t in (10, 13):
            n = self.length()
            vals = struct.unpack(f">{n}i", self.take(4 * n))
            na = -(2**31)
            if t == 10:
                obj = RObject("logical", [None if v == na else bool(v) for v in vals])
            else:
                obj = RObject("integer", [None if v == na else v for v in vals])
        elif t == 14:
            n = self.length()
            obj = RObject("double", list(struct.unpack(f">{n}d", self.take(8 * n))))
        elif t == 15:
            n = self.length()
            v = struct.unpack(f">{2 * n}d", self.take(16 * n))
            obj = RObject("complex", [complex(v[2 * i], v[2 * i + 1]) for i in range(n)])
        elif t in (16, 19, 20):
            obj = RObject(_R_VECTORS[t], [self.item() for _ in range(self.length())])
        elif t == 24:
            obj = RObject("raw", self.take(self.length()))
        elif t in (7, 8):
            obj = RObject("builtin", self.take(self.int()).decode("ascii", "replace"))
        elif t == 25:
            obj = RObject("S4")
        elif t == 22:  # external pointer
            obj = RObject("externalptr")
            self.refs.append(obj)
            obj.value = (self.item(), self.item())
        elif t == 23:
            obj = RObject("weakref")
            self.refs.append(obj)
        else:
            raise RSerializationError(f"R object type {t} at byte {self.pos - 4} is not supported by this reader")
        if has_attr:
            attrs = self.attributes()
            if isinstance(obj, RObject):
                obj.attributes = attrs
        return obj

    @staticmethod
    def _altrep(info: Any, state: Any) -> RObject:
        cls = info.value[0][1].value if isinstance(info, RObject) and info.value else None
        if cls in ("compact_intseq", "compact_realseq") and isinstance(state, RObject):
            n, start, step = state.value[:3]
            kind = "integer" if cls == "compact_intseq" else "double"
            conv = int if kind == "integer" else float
            return RObject(kind, [conv(start + i * step) for i in range(int(n))])
        if isinstance(cls, str) and cls.startswith("wrap_") and isinstance(state, RObject):
            inner = state.value[0]
            return RObject(inner.rtype, inner.value) if isinstance(inner, RObject) else RObject("NULL")
        if cls == "deferred_string" and isinstance(state, RObject):
            arg = state.value[0][1] if state.rtype == "pairlist" else state.value[0]
            return RObject("character", [None if v is None else str(v) for v in arg.value])
        raise RSerializationError(f"ALTREP class {cls!r} is not supported by this reader")


def _decompress_r(data: bytes) -> bytes:
    """Undo the gzip / bzip2 / xz wrapping ``saveRDS`` may add (plain serialisations pass through)."""
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:3] == b"BZh":
        return bz2.decompress(data)
    if data[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(data)
    return data


def r_unserialize(data: bytes) -> Any:
    """Read one R object from XDR serialisation bytes (``serialize()`` / ``saveRDS()``, versions 2 and 3; gzip,
    bzip2 or xz wrapping is undone). Returns :class:`RObject` values, ``str`` / ``None`` for CHARSXPs, ``None``
    for ``NULL``.

    Raises:
        RSerializationError: not an XDR serialisation, truncated, or an object type outside data objects
        (byte code, ...).
    """
    reader = _RReader(_decompress_r(data))
    reader.header()
    try:
        return reader.item()
    except (struct.error, RecursionError) as e:
        raise RSerializationError(f"corrupt R serialisation: {e}") from None


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
    """The objects of an R lazy-load database (``<name>.rdx`` index + ``<name>.rdb`` data), by name.

    The index is a serialised list ``(variables = list(name = c(offset, length)), references, compressed)``;
    each value in the ``.rdb`` is a length-prefixed zlib (or bzip2 / xz) stream of one serialised object.
    """
    index = r_unserialize(rdx)
    if not isinstance(index, RObject) or index.names is None or "variables" not in index.names:
        raise RSerializationError("not a lazy-load index: expected a list with 'variables'")
    parts = index.as_dict()
    comp = parts.get("compressed")
    compressed = int(comp.value[0]) if isinstance(comp, RObject) and comp.value else 1
    variables = parts["variables"].as_dict() if isinstance(parts["variables"], RObject) else {}
    wanted = list(variables) if names is None else list(names)
    out = {}
    for name in wanted:
        if name not in variables:
            raise RSerializationError(f"object {name!r} not in the lazy-load database (has {sorted(variables)})")
        off, length = (int(v) for v in variables[name].value[:2])
        if off < 0 or off + length > len(rdb):
            raise RSerializationError(f"object {name!r}: bytes {off}..{off + length} outside the .rdb")
        out[name] = r_unserialize(_lazyload_blob(rdb[off : off + length], compressed))
    return out


# ----------------------------------------------------------------------------------------------- bible.data (LZW)
def unlzw(data: bytes, maxbits: int = 16, block_mode: bool = True) -> bytes:
    """Decode one stream of ``compress(1)`` LZW codes (no ``1f 9d`` header): codes of 9 to ``maxbits`` bits, packed
    little-endian in groups of ``n_bits`` bytes (a code-width change or a CLEAR code (256, block mode) skips the rest
    of the group), a table reset on CLEAR."""
    out = bytearray()
    top = 1 << maxbits
    prefix = [0] * top
    suffix = bytearray(range(256)) + bytearray(top - 256)
    n_bits, free = 9, 257 if block_mode else 256
    maxcode = (1 << n_bits) - 1
    pos, old, fin = 0, -1, 0
    while pos < len(data):
        group = data[pos : pos + n_bits]
        pos += len(group)
        bits, usable = int.from_bytes(group, "little"), len(group) * 8 - (n_bits - 1)
        off, mask = 0, (1 << n_bits) - 1
        while off < usable:
            code = (bits >> off) & mask
            off += n_bits
            if old < 0:  # first code of the stream: a literal
                if code > 255:
                    raise ValueError(f"corrupt LZW stream: first code {code} is not a literal")
                out.append(code)
                old = fin = code
                continue
            if code == 256 and block_mode:  # CLEAR: back to 9 bits; the next code starts a new group
                free, n_bits = 256, 9
                maxcode = (1 << n_bits) - 1
                break
            incode = code
            stack = bytearray()
            if code >= free:  # the KwKwK case
                if code > free:
                    raise ValueError(f"corrupt LZW stream: code {code} beyond the table ({free})")
                stack.append(fin)
                code = old
            while code >= 256:
                stack.append(suffix[code])
                code = prefix[code]
            fin = code
            stack.append(fin)
            stack.reverse()
            out += stack
            if free < top:
                prefix[free], suffix[free] = old, fin
                free += 1
            old = incode
            if free > maxcode and n_bits < maxbits:
                n_bits += 1
                maxcode = top if n_bits == maxbits else (1 << n_bits) - 1
                break
    return bytes(out)


def decode_kjv_data(data: bytes) -> str:
    """Decode ``bible.data`` of ``bible-kjv-text``: header ``EC02`` + 80-byte description, big-endian window size and
    count, the window offsets, then one LZW stream per window (each full window decodes to exactly the window size)."""
    if data[:2] != b"EC" or len(data) < 92:
        raise ValueError("not a bible.data file (expected the 'EC' magic and a 92-byte header)")
    if data[2:4] != b"02":
        raise ValueError(f"bible.data format version {data[2:4]!r} is not supported (expected b'02')")
    wsize, wnum = struct.unpack(">ii", data[84:92])
    if wsize <= 0 or not 0 < wnum < 1 << 20 or 92 + 4 * (wnum + 1) > len(data):
        raise ValueError(f"bible.data: implausible window table ({wnum} windows of {wsize} bytes)")
    table = struct.unpack(f">{wnum + 1}i", data[92 : 92 + 4 * (wnum + 1)])
    parts = []
    for w in range(wnum):
        if not 0 < table[w] <= table[w + 1] <= len(data):
            raise ValueError(f"bible.data: window {w} offsets {table[w]}..{table[w + 1]} out of range")
        text = unlzw(data[table[w] : table[w + 1]])
        if w < wnum - 1 and len(text) != wsize:
            raise ValueError(f"bible.data: window {w} decoded to {len(text)} bytes, expected {wsize}")
        parts.append(text)
    return b"".join(parts).decode("ascii")


_VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def kjv_documents(text: str) -> list[Document]:
    """One document per book from the decoded ``bible.data`` text (``Ge1:1 In the beginning ...`` lines): the
    verses, references dropped, one per paragraph; the title line is skipped."""
    names = dict(KJV_BOOKS)
    order = {abbr: i for i, (abbr, _) in enumerate(KJV_BOOKS)}
    books: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _VERSE.match(line)
        if m is None:
            continue
        abbr = m.group(1)
        if abbr not in names:
            raise ValueError(f"bible.data: unknown book abbreviation {abbr!r} in {line[:40]!r}")
        verse = _collapse(m.group(4))
        if verse:
            books.setdefault(abbr, []).append(verse)
    if not books:
        raise ValueError("bible.data: no verses found")
    return [
        Document(f"kjv/{order[a] + 1:02d}-{names[a].replace(' ', '_')}", "kjv", tuple(v))
        for a, v in sorted(books.items(), key=lambda kv: order[kv[0]])
    ]


# ----------------------------------------------------------------------------------------------- Austen
_CHAPTER = re.compile(r"^\s*chapter\s+([ivxlcdm]+|\d+)\.?\s*$", re.IGNORECASE)
_VOLUME = re.compile(r"^\s*volume\s+([ivxlcdm]+|\d+)\.?\s*$", re.IGNORECASE)
_ITALIC = re.compile(r"(?<![\w_])_([^_]+?)_(?![\w_])")


def _lines_to_paragraphs(lines: Iterable[str]) -> list[str]:
    paras, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(_collapse(" ".join(cur)))
            cur = []
    if cur:
        paras.append(_collapse(" ".join(cur)))
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
            paras = [_collapse(_ITALIC.sub(r"\1", p)) for p in _lines_to_paragraphs(lines)]
            if paras:
                docs.append(Document(f"austen/{name}/{i:03d}", "austen", tuple(paras)))
    return docs


# ----------------------------------------------------------------------------------------------- kernel rst
_DIRECTIVE = re.compile(r"^\.\.\s+([\w:.+-]+)::(?:\s+(.*))?$")
_ADMONITIONS = frozenset(
    ["note", "warning", "attention", "caution", "danger", "error", "hint", "important", "tip", "admonition", "seealso"]
)
_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1{2,}$")
_GRID = re.compile(r"^\+([-=]+\+)+$")
_SIMPLE_TABLE = re.compile(r"^=+( +=+)+$")
_FIELD = re.compile(r"^:[^:\s][^:]*:(\s|$)")
_BULLET = re.compile(r"^([-*+\u2022]|#\.|\d{1,3}[.)]|\(\d{1,3}\)|[a-z][.)])\s+")
_WORD = re.compile(r"[(\"'\u201c\u2018]*[A-Za-z][a-z]*(?:['\u2019-][A-Za-z]+)*[)\"'\u201d\u2019.,;:!?]*")
_INLINE = [
    (re.compile(r":[\w:+.-]+:`~?([^`<]*?)\s*(?:<[^`>]*>)?`"), r"\1"),  # :role:`text <target>` -> text
    (re.compile(r"``(.+?)``"), r"\1"),  # ``literal``
    (re.compile(r"`([^`<]*?)\s*<[^`>]*>`_{1,2}"), r"\1"),  # `text <url>`_
    (re.compile(r"`([^`]+)`_{0,2}"), r"\1"),  # `text`_ or interpreted text
    (re.compile(r"\*\*(.+?)\*\*"), r"\1"),  # **strong**
    (re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])"), r"\1"),  # *emphasis*
    (re.compile(r"\s*\[(?:#\w*|\*|\d+|[A-Za-z][\w.-]*)\]_"), ""),  # footnote / citation references
    (re.compile(r"\|([^|\s][^|]*?)\|_{0,2}"), r"\1"),  # |substitution|
    (re.compile(r"\\ "), ""),  # escaped space
    (re.compile(r"\\(.)"), r"\1"),  # other escapes
]


def clean_inline(text: str) -> str:
    """Reduce reStructuredText inline markup to its text (roles, literals, links, emphasis, references)."""
    for pattern, repl in _INLINE:
        text = pattern.sub(repl, text)
    return _collapse(text)


def is_prose(paragraph: str) -> bool:
    """Whether a paragraph reads as English prose: at least 4 words, at least 75% of its non-space characters are
    letters, and at least 60% of its words look like words (letters, an optional capital, apostrophes / hyphens and
    surrounding punctuation), one of them lower-case. Code, tables of numbers, paths, and register lists fail."""
    words = paragraph.split()
    if len(words) < 4:
        return False
    letters = sum(c.isalpha() for c in paragraph)
    if letters < 0.75 * sum(not c.isspace() for c in paragraph):
        return False
    wordish = [w for w in words if _WORD.fullmatch(w)]
    return len(wordish) >= 0.6 * len(words) and any(w.strip("(\"'.,;:!?)").islower() for w in wordish)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rst_to_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a reStructuredText document (see the module docstring for the rules).

    Returns one string per paragraph (section titles included as their own paragraphs), whitespace collapsed, inline
    markup reduced to its text, non-prose paragraphs (:func:`is_prose`) dropped.
    """
    lines = [line.rstrip() for line in text.replace("\ufeff", "").expandtabs(8).splitlines()]
    n = len(lines)
    out: list[str] = []
    para: list[str] = []
    col = -1  # content column of the current paragraph
    literal_base = -1  # indent a literal block must exceed (after a '::' paragraph); -1 = none pending

    def flush(title: bool = False) -> None:
        nonlocal para, col
        if para:
            p = clean_inline(" ".join(para))
            if (title and any(_WORD.fullmatch(w) for w in p.split())) or is_prose(p):
                out.append(p)
        para, col = [], -1

    def skip_block(i: int, base: int) -> int:
        """First index after the lines that are blank or indented more than ``base``."""
        while i < n and (not lines[i].strip() or _indent(lines[i]) > base):
            i += 1
        return i

    i = 0
    while i < n:
        line = lines[i]
        s, ind = line.strip(), _indent(line)
        if not s:
            flush()
            i += 1
            continue
        if literal_base >= 0:
            base, literal_base = literal_base, -1
            if ind > base:  # the literal block after '::'
                i = skip_block(i, base)
                continue
        if s == ".." or s.startswith(".. "):  # comment, target, substitution or directive
            flush()
            m = _DIRECTIVE.match(s)
            if m and m.group(1).lower() in _ADMONITIONS:
                if m.group(2):
                    para, col = [m.group(2)], ind + 3
                i += 1
                while i < n and lines[i].strip() and _FIELD.match(lines[i].strip()) and _indent(lines[i]) > ind:
                    i += 1  # directive options
                continue
            i = skip_block(i + 1, ind)
            continue
        if _GRID.match(s):  # grid table: through the last line starting with '+' or '|'
            flush()
            while i < n and lines[i].strip()[:1] in ("+", "|"):
                i += 1
            continue
        if _SIMPLE_TABLE.match(s):  # simple table: to the border followed by a blank line
            flush()
            i += 1
            while i < n:
                if _SIMPLE_TABLE.match(lines[i].strip()) and (i + 1 >= n or not lines[i + 1].strip()):
                    i += 1
                    break
                i += 1
            continue
        if _ADORNMENT.match(s):  # section over/underline or transition
            flush(title=len(para) == 1)
            i += 1
            continue
        if not para and _FIELD.match(s):  # field list (:Author: ...), with its continuation lines
            i = skip_block(i + 1, ind)
            continue
        if s.startswith("| "):
            s = s[2:]
        m = _BULLET.match(s)
        content, ccol = (s[m.end() :], ind + m.end()) if m else (s, ind)
        if para and (m or ccol != col):
            flush()
        if not para:
            col = ccol
        if content.endswith("::"):
            literal_base = ind
            content = content[:-2].rstrip() if content == "::" or content.endswith(" ::") else content[:-1]
            if content:
                para.append(content)
            flush()
        else:
            para.append(content)
        i += 1
    flush()
    return out


def kernel_doc_documents(files: Iterable[tuple[str, bytes]]) -> list[Document]:
    """One document per ``Documentation/**/*.rst[.gz]`` file (``path``, content) with at least one prose paragraph;
    ``Documentation/translations/`` is skipped. Ids: ``linux-doc/<path under Documentation without .gz>``."""
    docs = []
    for path, content in files:
        rel = path.split("Documentation/", 1)[-1]
        if rel.startswith("translations/"):
            continue
        if rel.endswith(".gz"):
            content, rel = gzip.decompress(content), rel[:-3]
        if not rel.endswith(".rst"):
            continue
        paras = rst_to_paragraphs(content.decode("utf-8", "replace"))
        if paras:
            docs.append(Document(f"linux-doc/{rel}", "linux-doc", tuple(paras)))
    return docs


def _is_kernel_rst(name: str) -> bool:
    return "/Documentation/" in name and name.endswith((".rst", ".rst.gz")) and "/translations/" not in name


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
    bad = [k for k, v in objects.items() if not (isinstance(v, RObject) and v.rtype == "character")]
    if bad or not objects:
        raise RSerializationError(f"janeaustenr: expected the novels {sorted(AUSTEN_NOVELS)} as character vectors")
    out[AUSTEN_PACKAGE] = austen_documents({k: v.value for k, v in objects.items()})
    tick(len(out[AUSTEN_PACKAGE]))
    kernel = [k for k in debs if k not in (KJV_PACKAGE, AUSTEN_PACKAGE)]
    if len(kernel) != 1:
        raise ValueError(f"expected one kernel documentation package besides {KJV_PACKAGE}, {AUSTEN_PACKAGE}")
    docs = []
    for path, content in iter_deb_files(debs[kernel[0]], _is_kernel_rst):
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

        with tqdm(desc="english documents", unit="doc", smoothing=0.05) as bar:

            def status(line: str) -> None:  # the bar covers the extraction; close it before the next stage
                bar.close()
                say(line)

            return write_english(
                debs, out_dir, vocab_size=vocab_size, seed=seed, overwrite=True, progress=bar.update, log=status
            )
    return write_english(debs, out_dir, vocab_size=vocab_size, seed=seed, overwrite=True, log=say)


def load_english_metadata(root: str | os.PathLike | None = None) -> dict[str, Any]:
    """``metadata.json`` of the corpus, or a :class:`MissingDataError` that says how to fetch it."""
    d = Path(root) if root is not None else dataset_dir("english")
    meta = d / "metadata.json"
    if not meta.is_file():
        raise MissingDataError(f"English corpus not found in {d}. " + ENGLISH_HINT)
    return json.loads(meta.read_text(encoding="utf-8"))
