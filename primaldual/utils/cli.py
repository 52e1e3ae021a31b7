"""Building blocks of the ``primaldual`` command line shared by the subcommand modules (``argparse`` only).

* :func:`examples` formats the ``Examples:`` epilog every subcommand's ``--help`` ends with (use it with
  :data:`FORMATTER`, which keeps the line breaks);
* :func:`add_deprecated_alias` adds an old option spelling that still works, is hidden from ``--help`` and prints a
  one-line deprecation notice on stderr when used;
* :func:`iter_subparsers` walks the parser tree (used to give every subcommand the global ``--debug`` flag).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["FORMATTER", "DeprecatedAlias", "add_deprecated_alias", "examples", "iter_subparsers"]

FORMATTER = argparse.RawDescriptionHelpFormatter


def examples(*lines: str, note: str = "") -> str:
    """An ``Examples:`` block, one command per line (indented), followed by ``note`` if given."""
    text = "Examples:\n" + "\n".join(f"  {line}" for line in lines)
    return f"{text}\n\n{note}" if note else text


class DeprecatedAlias(argparse.Action):
    """Store like the option it stands for, and say on stderr which spelling replaces it."""

    def __init__(self, option_strings: list[str], dest: str, *, replacement: str, **kwargs: Any) -> None:
        self.replacement = replacement
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated, use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, **kwargs: Any) -> None:
    """Accept option ``old`` as a hidden, deprecated spelling of the (already added) option ``new``.

    Both write the same destination; ``kwargs`` (e.g. ``type``) are passed on to ``add_argument``.
    """
    dest = next(a.dest for a in parser._actions if new in a.option_strings)
    parser.add_argument(
        old,
        dest=dest,
        action=DeprecatedAlias,
        replacement=new,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
        **kwargs,
    )


def iter_subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every sub-parser below ``parser`` (depth first, each once even when it has aliases)."""
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield sub
                    yield from iter_subparsers(sub)
