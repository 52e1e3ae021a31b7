"""The English LM corpus: .deb reading, the R lazy-load reader, bible.data LZW, rst prose extraction, splits, BPE,
the writer's determinism and the ``primaldual data fetch english`` command (all on synthetic packages)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import shutil
import struct
import subprocess
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from primaldual.cli import main
from primaldual.data.cache import MissingDataError, data_root
from primaldual.data.lm import ENGLISH_HINT
from primaldual.recipes import english as E
from primaldual.recipes.english import austen, deb, kernel_doc, kjv

# ----------------------------------------------------------------------------------------------- fixtures: LZW


def lzw_codes(data: bytes, maxbits: int = 16, clear_after: int | None = None) -> list[int]:
    """Plain LZW code sequence (block mode: 256 = CLEAR, first free code 257), optionally with CLEAR codes."""
    top, table, free, codes, cur, since = 1 << maxbits, {}, 257, [], None, 0
    for b in data:
        if cur is None:
            cur = b
            continue
        if (cur, b) in table:
            cur = table[(cur, b)]
            continue
        codes.append(cur)
        since += 1
        if free < top:
            table[(cur, b)] = free
            free += 1
        cur = b
        if clear_after and since >= clear_after:
            codes += [cur, 256]
            table, free, cur, since = {}, 257, None, 0
    if cur is not None:
        codes.append(cur)
    return codes


def lzw_pack(codes: list[int], maxbits: int = 16) -> bytes:
    """Pack codes as compress(1) does: little-endian bits, groups of n_bits bytes, a group padded out when the code
    width grows (the decoder's table passes 2**n_bits - 1) or at a CLEAR."""
    top, out, group = 1 << maxbits, bytearray(), []
    n_bits, maxcode, dfree, first = 9, 511, 257, True

    def flush(full: bool) -> None:
        if group:
            v = sum(c << (k * n_bits) for k, c in enumerate(group))
            out.extend(v.to_bytes(n_bits, "little")[: n_bits if full else (len(group) * n_bits + 7) // 8])
            group.clear()

    for c in codes:
        group.append(c)
        if c == 256:
            flush(True)
            n_bits, maxcode, dfree = 9, 511, 256
            continue
        if first:
            first = False
        elif dfree < top:
            dfree += 1
        if dfree > maxcode and n_bits < maxbits:
            flush(True)
            n_bits += 1
            maxcode = top if n_bits == maxbits else (1 << n_bits) - 1
        elif len(group) == 8:
            flush(True)
    flush(False)
    return bytes(out)


def lzw_compress(data: bytes, maxbits: int = 16, clear_after: int | None = None) -> bytes:
    return lzw_pack(lzw_codes(data, maxbits, clear_after), maxbits)


def random_text(n_words: int, seed: int = 0) -> bytes:
    r = random.Random(seed)
    vocab = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(1, 8))) for _ in range(800)]
    return " ".join(r.choice(vocab) for _ in range(n_words)).encode()


@pytest.mark.parametrize(("maxbits", "clear_after"), [(16, None), (12, None), (16, 700)])
def test_unlzw_round_trip(maxbits, clear_after):
    data = random_text(12000)  # ~60 kB: code widths 9..14 bits (or a full 12-bit table), CLEAR codes
    z = lzw_compress(data, maxbits, clear_after)
    assert kjv.unlzw(z, maxbits=maxbits) == data
    assert kjv.unlzw(b"") == b"" and kjv.unlzw(lzw_compress(b"a")) == b"a"
    if shutil.which("gzip"):  # an independent decoder of the same format (.Z files) agrees with our encoder
        res = subprocess.run(["gzip", "-dc"], input=bytes([0x1F, 0x9D, 0x80 | maxbits]) + z, capture_output=True)
        assert res.returncode == 0 and res.stdout == data


def test_unlzw_rejects_corrupt_streams():
    # unlzw3's reasons, prefixed with what failed
    with pytest.raises(ValueError, match="corrupt LZW stream: .*[Ff]irst code"):
        kjv.unlzw(lzw_pack([300, 1]))
    with pytest.raises(ValueError, match="corrupt LZW stream: .*[Ii]nvalid code"):
        kjv.unlzw(lzw_pack([97, 98, 400]))
    with pytest.raises(ValueError, match="maxbits: expected 9..16, got 17"):
        kjv.unlzw(b"\0", maxbits=17)


KJV_SNIPPET = (
    "Holy Bible, Authorized (King James) Version.  Textfile 930105.\n"
    "Ge1:1 In the beginning God created the heaven and the earth.\n"
    "Ge1:2 And the earth was without form, and void; and darkness was upon the face of the deep.\n"
    "Ge2:1 Thus the heavens and the earth were finished, and all the host of them.\n"
    "Exo1:1 Now these are the names of the children of Israel, which came into Egypt.\n"
    "Rev22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n"
)


def make_bible_data(text: str, wsize: int = 64) -> bytes:
    """An EC02 bible.data file: header, window table, then the .Z magic and one LZW stream per window (contiguous,
    as in the real file)."""
    raw = text.encode("ascii")
    streams = [lzw_compress(raw[i : i + wsize]) for i in range(0, len(raw), wsize)]
    pos = 92 + 4 * (len(streams) + 1) + 3  # after the header, the table and the 3-byte .Z header
    offsets = []
    for z in streams:
        offsets.append(pos)
        pos += len(z)
    offsets.append(pos)  # the table holds wnum + 1 offsets: the window starts, then the end of the data
    header = b"EC02" + b"Compressed Data File".ljust(80, b"\0") + struct.pack(">ii", wsize, len(streams))
    return header + struct.pack(f">{len(offsets)}i", *offsets) + b"\x1f\x9d\x90" + b"".join(streams)


def test_decode_kjv_data_and_books():
    data = make_bible_data(KJV_SNIPPET)
    assert kjv.decode_kjv_data(data) == KJV_SNIPPET
    docs = kjv.kjv_documents(kjv.decode_kjv_data(data))
    assert [d.doc_id for d in docs] == ["kjv/01-Genesis", "kjv/02-Exodus", "kjv/66-Revelation"]
    assert docs[0].paragraphs == (
        "In the beginning God created the heaven and the earth.",
        "And the earth was without form, and void; and darkness was upon the face of the deep.",
        "Thus the heavens and the earth were finished, and all the host of them.",
    )
    assert docs[2].text == "The grace of our Lord Jesus Christ be with you all. Amen.\n"
    with pytest.raises(ValueError, match="EC"):
        kjv.decode_kjv_data(b"garbage" * 20)
    bad = bytearray(data)
    bad[84:88] = struct.pack(">i", 32)  # wrong window size: the first window decodes to 64 bytes
    with pytest.raises(ValueError, match="window 0"):
        kjv.decode_kjv_data(bytes(bad))
    with pytest.raises(ValueError, match="unknown book"):
        kjv.kjv_documents("Xyz1:1 Not a book.\n")


# ----------------------------------------------------------------------------------------------- fixtures: R


class RWriter:
    """A minimal XDR serialiser (R serialisation versions 2 / 3) for character vectors, integer vectors and named
    lists: enough to build lazy-load databases like janeaustenr's."""

    def __init__(self, version: int = 3) -> None:
        self.out = io.BytesIO()
        self.version = version
        self.symbols: dict[str, int] = {}

    def int(self, v: int) -> None:
        self.out.write(struct.pack(">i", v))

    def header(self) -> None:
        self.out.write(b"X\n")
        self.int(self.version)
        self.int(0x040201)
        self.int(0x030500 if self.version == 3 else 0x020300)
        if self.version == 3:
            self.int(5)
            self.out.write(b"UTF-8")

    def charsxp(self, s: str | None, latin1: bool = False) -> None:
        if s is None:
            self.int(9)
            self.int(-1)
            return
        raw = s.encode("latin-1" if latin1 else "utf-8")
        levels = (1 << 2) if latin1 else ((1 << 6) if raw.isascii() else (1 << 3))
        self.int(9 | (levels << 12))
        self.int(len(raw))
        self.out.write(raw)

    def symbol(self, name: str) -> None:
        if name in self.symbols:  # a reference to the earlier symbol, index packed in the flags
            self.int(255 | (self.symbols[name] << 8))
            return
        self.int(1)
        self.charsxp(name)
        self.symbols[name] = len(self.symbols) + 1

    def names_attr(self, names: list[str]) -> None:
        self.int(2 | (1 << 10))  # pairlist cell with a tag
        self.symbol("names")
        self.strsxp(names)
        self.int(254)  # end of the attribute pairlist

    def strsxp(self, values: list[str | None], names: list[str] | None = None) -> None:
        self.int(16 | ((1 << 9) if names else 0))
        self.int(len(values))
        for v in values:
            self.charsxp(v)
        if names:
            self.names_attr(names)

    def intsxp(self, values: list[int]) -> None:
        self.int(13)
        self.int(len(values))
        for v in values:
            self.int(v)

    def vecsxp(self, items: list, names: list[str] | None = None) -> None:
        self.int(19 | ((1 << 9) if names else 0))
        self.int(len(items))
        for item in items:
            item(self)
        if names:
            self.names_attr(names)

    def value(self) -> bytes:
        return self.out.getvalue()


def serialize(build, version: int = 3) -> bytes:
    w = RWriter(version)
    w.header()
    build(w)
    return w.value()


def make_lazyload(objects: dict[str, list[str | None]], version: int = 3) -> tuple[bytes, bytes]:
    """(rdx, rdb) of a lazy-load database holding character vectors, like janeaustenr's data/Rdata.*."""
    rdb, index = b"", {}
    for name, lines in objects.items():
        blob = serialize(lambda w, lines=lines: w.strsxp(lines), version)
        entry = struct.pack(">I", len(blob)) + zlib.compress(blob)
        index[name] = (len(rdb), len(entry))
        rdb += entry
    names = list(index)

    def build(w: RWriter) -> None:
        variables = [lambda w, n=n: w.intsxp(list(index[n])) for n in names]
        w.vecsxp(
            [lambda w: w.vecsxp(variables, names), lambda w: w.vecsxp([], []), lambda w: w.intsxp([1])],
            ["variables", "references", "compressed"],
        )

    return gzip.compress(serialize(build, version), mtime=0), rdb


AUSTEN = {
    "emma": [
        "EMMA", "", "By Jane Austen", "", "", "VOLUME I", "", "CHAPTER I", "",
        "Emma Woodhouse, handsome, clever, and _rich_, with a comfortable home", "and happy disposition.", "",
        "She was the youngest of the two daughters.", "", "", "CHAPTER II", "", "Mr. Weston was a native of",
        "Highbury, and born of a respectable family.", None,
    ],
    "persuasion": ["Persuasion", "", "by", "", "Jane Austen", "", "Chapter 1", "", "Sir Walter Elliot, of Kellynch."],
}  # fmt: skip


@pytest.mark.parametrize("version", [2, 3])
def test_r_unserialize_vectors_and_lists(version):
    def build(w: RWriter) -> None:
        w.vecsxp(
            [lambda w: w.strsxp(["a", None, "caf\u00e9"]), lambda w: w.intsxp([1, -(2**31), 3])],
            ["text", "numbers"],
        )

    obj = austen.r_unserialize(serialize(build, version))  # rdata, converted: a named list is a dict
    assert list(obj) == ["text", "numbers"]
    assert austen.character_vector(obj["text"]) == ["a", None, "caf\u00e9"]
    assert np.ma.getmaskarray(obj["numbers"]).tolist() == [False, True, False]  # NA_integer_ is masked
    assert np.ma.compressed(obj["numbers"]).tolist() == [1, 3]
    w = RWriter(version)
    w.header()
    w.charsxp("na\u00efve", latin1=True)
    assert austen.r_unserialize(w.value()) == "na\u00efve"
    assert austen.character_vector(
        austen.r_unserialize(gzip.compress(serialize(lambda w: w.strsxp(["x"]), version)))
    ) == ["x"]
    with pytest.raises(austen.RSerializationError, match="numbers: expected an R character vector"):
        austen.character_vector(obj["numbers"], "numbers")


def test_r_unserialize_rejects_malformed():
    # rdata's reasons, in one RSerializationError (a ValueError) naming what failed
    with pytest.raises(austen.RSerializationError, match="not a readable R serialisation"):
        austen.r_unserialize(b"A\n3\n")
    with pytest.raises(austen.RSerializationError, match="version 7"):
        austen.r_unserialize(b"X\n" + struct.pack(">iii", 7, 0, 0))
    with pytest.raises(austen.RSerializationError, match="not a readable R serialisation"):  # byte code (type 21)
        austen.r_unserialize(serialize(lambda w: w.int(21)))


def test_read_r_lazyload_and_austen_chapters():
    rdx, rdb = make_lazyload(AUSTEN)
    objs = austen.read_r_lazyload(rdx, rdb)
    assert sorted(objs) == ["emma", "persuasion"] and austen.character_vector(objs["emma"]) == AUSTEN["emma"]
    with pytest.raises(austen.RSerializationError, match="not in the lazy-load"):
        austen.read_r_lazyload(rdx, rdb, ["mansfieldpark"])
    with pytest.raises(austen.RSerializationError, match="decompress"):
        austen.read_r_lazyload(rdx, b"\0" * len(rdb))
    rdx1, rdb1 = make_lazyload({"emma": AUSTEN["emma"]})
    with pytest.raises(austen.RSerializationError, match="decompress"):  # a damaged value: the zlib check fails
        austen.read_r_lazyload(rdx1, rdb1[:-3] + b"\0\0\0")
    docs = austen.austen_documents({k: austen.character_vector(v) for k, v in objs.items()})
    assert [d.doc_id for d in docs] == [
        "austen/emma/000",
        "austen/emma/001",
        "austen/emma/002",
        "austen/persuasion/000",
        "austen/persuasion/001",
    ]
    assert docs[0].paragraphs == ("EMMA", "By Jane Austen")  # front matter; "VOLUME I" dropped
    assert docs[1].paragraphs == (
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition.",
        "She was the youngest of the two daughters.",
    )
    assert docs[2].text == "Mr. Weston was a native of Highbury, and born of a respectable family.\n"


# ----------------------------------------------------------------------------------------------- fixtures: rst

KERNEL_RST = """\
.. SPDX-License-Identifier: GPL-2.0

.. _process_howto:

=================================
HOWTO do Linux kernel development
=================================

:Author: Someone <someone@example.org>
:Date: 2015

This is the be-all, end-all document on this topic. It explains how
to become a **Linux kernel** developer with :ref:`the process <process>`,
``git`` and `the list <https://lore.kernel.org>`_ [#f1]_.

Introduction
------------

Build the kernel with the following command::

    make -j8 bzImage
    make modules_install

.. code-block:: c

   static int foo(void)
   {
           return 0;
   }

A literal block follows here ::

    $ echo hi

.. note::
   Remember that *patches* must be sent to the right maintainers
   before the merge window opens.

+--------+--------+
| a      | b      |
+========+========+
| 1      | 2      |
+--------+--------+

=====  =====
A      B
=====  =====
x      y
=====  =====

 - The first item of the list is about coding style rules.
 - The second item talks about
   submitting patches by mail.

    ret = foo(bar, baz);

.. toctree::
   :maxdepth: 2

   intro
   howto
"""


def test_rst_to_paragraphs():
    assert kernel_doc.rst_to_paragraphs(KERNEL_RST) == [
        "HOWTO do Linux kernel development",
        "This is the be-all, end-all document on this topic. It explains how to become a Linux kernel developer "
        "with the process, git and the list.",
        "Introduction",
        "Build the kernel with the following command:",
        "A literal block follows here",
        "Remember that patches must be sent to the right maintainers before the merge window opens.",
        "The first item of the list is about coding style rules.",
        "The second item talks about submitting patches by mail.",
    ]


def test_inline_markup_and_prose_filter():
    assert kernel_doc.clean_inline(":c:func:`kmalloc` and ``GFP_KERNEL`` with *care*, see |sub|") == (
        "kmalloc and GFP_KERNEL with care, see sub"
    )
    assert (
        kernel_doc.clean_inline("see `Documentation <index.rst>`__ and `target`_ \\*x")
        == "see Documentation and target *x"
    )
    assert kernel_doc.is_prose("The kernel is written mostly in C, with some assembly.")
    assert not kernel_doc.is_prose("ret = foo(bar, baz);")
    assert not kernel_doc.is_prose("0x0000 0x1234 0xffff 0x0001 0x0002")
    assert not kernel_doc.is_prose("Too short here")
    assert not kernel_doc.is_prose("CONFIG_FOO CONFIG_BAR CONFIG_BAZ CONFIG_QUX")


def test_kernel_doc_documents_skips_translations_and_non_rst():
    files = [
        ("usr/share/doc/linux-doc-6.1/Documentation/process/howto.rst.gz", gzip.compress(KERNEL_RST.encode())),
        ("usr/share/doc/linux-doc-6.1/Documentation/translations/it_IT/howto.rst", b"Questo documento spiega come."),
        ("usr/share/doc/linux-doc-6.1/Documentation/index.rst", b".. toctree::\n\n   howto\n"),
        ("usr/share/doc/linux-doc-6.1/Documentation/conf.py", b"x = 1\n"),
    ]
    docs = kernel_doc.kernel_doc_documents(files)
    assert [d.doc_id for d in docs] == ["linux-doc/process/howto.rst"]  # index.rst has no prose
    assert docs[0].paragraphs[0] == "HOWTO do Linux kernel development"


def test_split_of_is_seeded_and_by_document():
    ids = [f"doc/{i}" for i in range(4000)]
    splits = [E.split_of(i) for i in ids]
    assert splits == [E.split_of(i) for i in ids]  # deterministic
    frac = {s: splits.count(s) / len(ids) for s in E.ENGLISH_SPLITS}
    assert 0.88 < frac["train"] < 0.92 and 0.035 < frac["valid"] < 0.065 and 0.035 < frac["test"] < 0.065
    assert [E.split_of(i, seed=1) for i in ids] != splits
    docs = [E.Document(i, "x", ("p",)) for i in ids[:50]]
    by_split = E.split_documents(reversed(docs))
    assert sorted(d.doc_id for v in by_split.values() for d in v) == sorted(ids[:50])
    assert all([d.doc_id for d in v] == sorted(d.doc_id for d in v) for v in by_split.values())
    with pytest.raises(ValueError, match="duplicate"):
        E.split_documents(docs + docs[:1])
    assert E.split_text(docs[:2]) == "p\n\np\n"


def test_bpe_round_trip_and_determinism():
    pytest.importorskip("tokenizers")
    text = KJV_SNIPPET * 3 + "Caf\u00e9 na\u00efve \u2014 \u201cquoted\u201d text, emoji \U0001f600.\n"
    lines = text.splitlines(keepends=True)
    tok = E.train_bpe_tokenizer(lines, vocab_size=300)
    assert tok.get_vocab_size() <= 300 and tok.token_to_id("<|endoftext|>") == 0
    assert E.train_bpe_tokenizer(lines, vocab_size=300).to_str() == tok.to_str()
    ids = E.encode_lines(tok, text)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < tok.get_vocab_size()
    assert tok.decode(ids.tolist()) == text  # lossless, unseen characters included (byte fallback)
    with pytest.raises(ValueError, match="at least"):
        E.train_bpe_tokenizer(lines, vocab_size=100)


# ----------------------------------------------------------------------------------------------- synthetic .debs


def _tar(files: dict[str, bytes], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("./usr/share/doc/link.rst")
        link.type, link.linkname = tarfile.SYMTYPE, "target.rst"
        tar.addfile(link)
    return buf.getvalue()


def make_deb(folder: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    """A real ar-format .deb (debian-binary, control.tar.gz, data.tar.xz)."""
    control = f"Package: {package}\nVersion: {version}\nArchitecture: all\nDescription: test\n".encode()
    members = [
        ("debian-binary", b"2.0\n"),
        ("control.tar.gz", _tar({"./control": control}, "w:gz")),
        ("data.tar.xz", _tar(files, "w:xz")),
    ]
    out = b"!<arch>\n"
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode() + data
        out += b"\n" if len(data) % 2 else b""
    path = folder / f"{package}_{version}_all.deb"
    path.write_bytes(out)
    return path


def make_debs(folder: Path, n_kernel_docs: int = 30) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rdx, rdb = make_lazyload(AUSTEN)
    base = "./usr/share/doc/linux-doc-6.1/Documentation"
    kernel = {f"{base}/process/howto.rst.gz": gzip.compress(KERNEL_RST.encode(), mtime=0)}
    r = random.Random(1)
    words = [
        "the",
        "kernel",
        "driver",
        "memory",
        "device",
        "process",
        "scheduler",
        "lock",
        "page",
        "file",
        "system",
        "user",
        "interface",
    ]
    for i in range(n_kernel_docs):
        paras = [" ".join(r.choice(words) for _ in range(12)).capitalize() + "." for _ in range(3)]
        kernel[f"{base}/area{i % 4}/doc{i:02d}.rst"] = f"Title {i}\n========\n\n" + "\n\n".join(paras) + "\n"
    kernel = {k: v.encode() if isinstance(v, str) else v for k, v in kernel.items()}
    kernel[f"{base}/translations/zh_CN/index.rst"] = "\u5185\u6838\u6587\u6863\u3002\n".encode()
    return {
        "linux-doc-6.1": make_deb(folder, "linux-doc-6.1", "6.1.1-1", kernel),
        "r-cran-janeaustenr": make_deb(
            folder,
            "r-cran-janeaustenr",
            "1.0.0-1",
            {
                "./usr/lib/R/site-library/janeaustenr/data/Rdata.rdx": rdx,
                "./usr/lib/R/site-library/janeaustenr/data/Rdata.rdb": rdb,
            },
        ),
        "bible-kjv-text": make_deb(
            folder, "bible-kjv-text", "4.38", {"./usr/lib/bible.data": make_bible_data(KJV_SNIPPET)}
        ),
    }


def test_deb_reading(tmp_path):
    debs = make_debs(tmp_path / "debs", n_kernel_docs=2)
    info = deb.deb_info(debs["bible-kjv-text"])
    assert (info.package, info.version) == ("bible-kjv-text", "4.38")
    assert info.sha256 == hashlib.sha256(debs["bible-kjv-text"].read_bytes()).hexdigest()
    names = [n for n, _ in deb.iter_deb_files(debs["linux-doc-6.1"], lambda n: True)]
    assert "usr/share/doc/linux-doc-6.1/Documentation/process/howto.rst.gz" in names
    assert "usr/share/doc/link.rst" not in names  # links are skipped
    (tmp_path / "x.deb").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="not a Debian package"):
        deb.deb_info(tmp_path / "x.deb")
    assert E.find_debs(tmp_path / "debs") == debs


def test_find_debs_names_what_is_missing(tmp_path):
    debs = make_debs(tmp_path, n_kernel_docs=1)
    debs["bible-kjv-text"].unlink()
    with pytest.raises(MissingDataError, match=r"missing .deb file\(s\) for bible-kjv-text.*apt-get download"):
        E.find_debs(tmp_path)
    with pytest.raises(MissingDataError, match="not a folder"):
        E.find_debs(tmp_path / "nope")


def test_write_english_is_deterministic(tmp_path):
    pytest.importorskip("tokenizers")
    debs = make_debs(tmp_path / "debs")
    a = E.write_english(debs, tmp_path / "a", vocab_size=320)
    b = E.write_english(debs, tmp_path / "b", vocab_size=320)
    files = sorted(p.name for p in a.iterdir())
    assert files == [
        ".primaldual-data",  # the mark: only a directory holding it is ever replaced
        "documents.tsv",
        "metadata.json",
        "test.txt",
        "test.u16.npy",
        "tokenizer.json",
        "train.txt",
        "train.u16.npy",
        "valid.txt",
        "valid.u16.npy",
    ]
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    meta = json.loads((a / "metadata.json").read_text())
    assert meta["sources"]["bible-kjv-text"]["deb_sha256"] == deb.deb_info(debs["bible-kjv-text"]).sha256
    assert meta["sources"]["linux-doc-6.1"]["documents"] == 31  # 30 + howto; translations skipped
    assert (
        meta["sources"]["r-cran-janeaustenr"]["documents"] == 5 and meta["sources"]["bible-kjv-text"]["documents"] == 3
    )
    rows = [line.split("\t") for line in (a / "documents.tsv").read_text().splitlines()[1:]]
    assert len(rows) == len({r[1] for r in rows}) == 39  # every document exactly once, in one split
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(a / "tokenizer.json"))
    for split in E.ENGLISH_SPLITS:
        m = meta["splits"][split]
        data = (a / m["file"]).read_bytes()
        assert m["sha256"] == hashlib.sha256(data).hexdigest() and m["bytes"] == len(data)
        assert m["documents"] == sum(r[0] == split for r in rows)
        ids = np.load(a / m["token_file"], allow_pickle=False)
        assert ids.dtype == np.uint16 and ids.size == m["tokens"]
        assert tok.decode(ids.tolist()).encode() == data
    train = (a / "train.txt").read_text()
    assert "kernel" in train or "Emma" in train or "beginning" in train
    assert (
        "make -j8" not in (a / "train.txt").read_text() + (a / "valid.txt").read_text() + (a / "test.txt").read_text()
    )
    with pytest.raises(FileExistsError):
        E.write_english(debs, tmp_path / "a", vocab_size=320)


def test_english_hint_names_every_package():
    assert all(p in ENGLISH_HINT for p in E.PACKAGES)  # the reader's hint (primaldual.data.lm) and the recipe agree


def test_download_debs_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(E.shutil, "which", lambda name: None)
    with pytest.raises(MissingDataError, match="apt-get not found.*--from DIR") as e:
        E.download_debs(tmp_path)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(E.shutil, "which", lambda name: "/usr/bin/" + name)
    failed = subprocess.CompletedProcess(
        [], 100, "", "Reading package lists...\nE: Unable to locate package linux-doc-6.1\n"
    )
    monkeypatch.setattr(E.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(MissingDataError, match="Unable to locate package linux-doc-6.1 .*apt-get update") as e:
        E.download_debs(tmp_path)
    assert "\n" not in str(e.value)


def test_download_debs_replaces_older_cached_versions(tmp_path, monkeypatch):
    make_debs(tmp_path / "new", n_kernel_docs=1)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "bible-kjv-text_4.37_all.deb").write_bytes(b"old")

    def fake_apt(cmd, cwd, **kwargs):
        assert cmd[:2] == ["apt-get", "download"] and sorted(cmd[2:]) == sorted(E.PACKAGES)
        for p in (tmp_path / "new").iterdir():
            shutil.copy(p, Path(cwd) / p.name)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(E.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(E.subprocess, "run", fake_apt)
    debs = E.download_debs(cache)
    assert debs["bible-kjv-text"].name == "bible-kjv-text_4.38_all.deb"
    assert sorted(p.name for p in cache.iterdir()) == sorted(p.name for p in (tmp_path / "new").iterdir())


def test_cli_fetch_english_from_dir(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tokenizers")
    monkeypatch.setenv("PRIMALDUAL_DATA", str(tmp_path / "cache"))
    assert main(["data", "list"]) == 0
    assert "missing: primaldual data fetch english" in capsys.readouterr().out
    make_debs(tmp_path / "debs", n_kernel_docs=3)
    argv = ["data", "fetch", "english", "--from", str(tmp_path / "debs"), "--vocab-size", "300"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    meta = json.loads((tmp_path / "cache" / "english" / "metadata.json").read_text())
    assert f"sha256 {meta['splits']['train']['sha256']}" in out and "english (LM corpus, BPE" in out
    assert main(["data", "list"]) == 0
    assert "present (LM corpus" in capsys.readouterr().out
    assert main(["data", "fetch", "english", "--from", str(tmp_path)]) == 0  # present: not rebuilt without --force
    capsys.readouterr()
    assert main(["data", "fetch", "english", "--from", str(tmp_path), "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("primaldual data fetch: error: ") and "missing .deb file(s)" in err[0]
    assert main(["data", "fetch", "shakespeare", "--from", str(tmp_path)]) == 2
    assert "--from is for `english` only" in capsys.readouterr().err


REAL_DEBS = data_root() / "debs"


@pytest.mark.slow
@pytest.mark.skipif(
    not all(list(REAL_DEBS.glob(f"{p}_*.deb")) for p in E.PACKAGES), reason="Debian packages not in <cache>/debs"
)
def test_real_packages(tmp_path):
    """The real corpus from the cached .debs (``primaldual data fetch english`` downloads them once)."""
    pytest.importorskip("tokenizers")
    debs = E.find_debs(REAL_DEBS)
    docs = E.english_documents(debs)
    assert len(docs["bible-kjv-text"]) == 66 and sum(len(d.paragraphs) for d in docs["bible-kjv-text"]) == 31102
    assert len(docs["r-cran-janeaustenr"]) == 275  # 269 chapters + 6 front matters
    assert len(docs["linux-doc-6.1"]) > 2000
    versions = {p: deb.deb_info(d).version for p, d in debs.items()}
    if versions == {"linux-doc-6.1": "6.1.192-2", "r-cran-janeaustenr": "1.0.0-1", "bible-kjv-text": "4.38"}:
        splits = E.split_documents(d for v in docs.values() for d in v)
        digest = hashlib.sha256(E.split_text(splits["valid"]).encode()).hexdigest()
        assert (
            digest == "beb0aad984c63655496b1baa5451d15f0bb00543509dbd46708d0ee750aec399"
        )  # docs/language_modelling.md
