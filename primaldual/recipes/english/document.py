"""The unit of the English corpus: a :class:`Document` (an id and its prose paragraphs), shared by every source."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Document", "collapse_whitespace"]


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


def collapse_whitespace(text: str) -> str:
    """``text`` with every run of whitespace replaced by one space, stripped at both ends."""
    return " ".join(text.split())
