"""The King James Bible from ``bible-kjv-text``, one document per book (66), one verse per paragraph.

``usr/lib/bible.data`` is an ``EC02`` file: a 92-byte header (magic, description, big-endian window size and
count), the window offsets, then independently LZW-compressed 64 KiB windows (the ``compress(1)`` algorithm,
16-bit codes, block mode) after one ``.Z`` header. Each window is decoded by ``unlzw3`` (:func:`unlzw` gives it
the ``.Z`` header each window lacks); the window table is read here (:func:`decode_kjv_data`).
"""

from __future__ import annotations

import re
import struct

from ...data.cache import MissingDataError
from .document import Document, collapse_whitespace

__all__ = ["KJV_BOOKS", "decode_kjv_data", "kjv_documents", "unlzw"]

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


def unlzw(data: bytes, maxbits: int = 16, block_mode: bool = True) -> bytes:
    """Decode one stream of ``compress(1)`` LZW codes that has no ``1f 9d`` header (codes of 9 to ``maxbits`` bits,
    CLEAR code 256 in block mode) with ``unlzw3``.

    Raises:
        ValueError: ``maxbits`` outside 9..16, or a corrupt stream (``corrupt LZW stream: <unlzw3's reason>``).
    """
    if not 9 <= maxbits <= 16:
        raise ValueError(f"maxbits: expected 9..16, got {maxbits}")
    if not data:
        return b""
    try:
        import unlzw3
    except ImportError:
        raise MissingDataError("decoding bible.data needs unlzw3: `pip install unlzw3` (in the data extra)") from None
    header = bytes([0x1F, 0x9D, (0x80 if block_mode else 0) | maxbits])  # .Z magic, then flags: block mode, maxbits
    try:
        return bytes(unlzw3.unlzw(header + data))
    except ValueError as e:
        raise ValueError(f"corrupt LZW stream: {e}") from None


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
        verse = collapse_whitespace(m.group(4))
        if verse:
            books.setdefault(abbr, []).append(verse)
    if not books:
        raise ValueError("bible.data: no verses found")
    return [
        Document(f"kjv/{order[a] + 1:02d}-{names[a].replace(' ', '_')}", "kjv", tuple(v))
        for a, v in sorted(books.items(), key=lambda kv: order[kv[0]])
    ]
