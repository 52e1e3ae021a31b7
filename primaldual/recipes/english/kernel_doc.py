"""The Linux kernel documentation from ``linux-doc-6.1``: one document per ``Documentation/**/*.rst`` file.

reStructuredText is turned into prose paragraphs by :func:`rst_to_paragraphs`: comments, directives with their
bodies (``code-block``, ``kernel-doc``, ``toctree``, ``table``, ``image``, ...), literal blocks after ``::``, grid
and simple tables, field lists and section adornments are dropped; the bodies of admonitions (``note``,
``warning``, ...) and section titles are kept; inline markup is reduced to its text; a paragraph is kept only when
it reads as prose (:func:`is_prose`).

Why this scraper is hand-written rather than built on ``docutils``: the corpus (generator ``v1``) is defined by
these line rules, and the same ``.deb`` must keep giving the same bytes. ``docutils.core.publish_doctree`` (0.23)
with its ``paragraph`` / ``title`` nodes, ``astext()`` and the same :func:`is_prose` filter gives different
paragraphs for 147 of the first 300 kernel files (for example it keeps ``(1) not claimed by ...`` inside the
preceding paragraph where these rules start a list item, and the kernel's Sphinx-only directives and roles are
unknown to plain docutils), so adopting it would change the corpus; it was also about 9 times slower (4.1 s
against 0.45 s for those 300 files).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable

from .document import Document, collapse_whitespace

__all__ = ["clean_inline", "is_kernel_rst", "is_prose", "kernel_doc_documents", "rst_to_paragraphs"]

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
    return collapse_whitespace(text)


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


def is_kernel_rst(name: str) -> bool:
    """Whether a path inside the package is a kernel documentation ``.rst[.gz]`` file (translations excluded)."""
    return "/Documentation/" in name and name.endswith((".rst", ".rst.gz")) and "/translations/" not in name
