"""The registry of fetchable data sources: what ``primaldual data fetch NAME`` and ``primaldual data list`` know.

A source is a name, a one-line description, a ``fetch`` function and a ``status`` function (what ``data list``
shows). The built-in ones (UEA JapaneseVowels, the image idx files, the text stand-ins, the English LM corpus, the
SmolLM2 teacher) are listed in :mod:`primaldual.recipes.sources`, loaded by name on first use (the registry imports
none of them), each importing its module only when used. Other packages add theirs without editing
primaldual, as tasks are added:

* in code: ``register_source(DataSource("mydata", "what it is", fetch=..., status=...))``;
* installed: an entry point in the group ``primaldual.data_sources`` whose object, when loaded, registers the
  source(s) (e.g. ``mydata = "mypkg.primaldual_sources"``). Plugins are loaded only when a name is not built in, or
  for the full listing; one that fails to load is named in a ``RuntimeWarning`` and skipped, so it cannot break
  ``data fetch`` of another source.

Written by hand: a dictionary and an entry-point lookup, the same shape as the task registry.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

__all__ = ["DataSource", "FetchRequest", "get_source", "list_sources", "register_source", "unregister_source"]


@dataclass(frozen=True)
class FetchRequest:
    """What ``primaldual data fetch`` was asked: the source's dataset name (if it takes one), the target folder
    (None: the cache), ``force``, and the source-specific options it declared (``options``)."""

    dataset: str | None = None
    out: str | None = None
    force: bool = False
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataSource:
    """A fetchable data source.

    Attributes:
        name: what ``data fetch NAME`` takes.
        help: one line for ``data fetch --help`` and ``data list``.
        fetch: obtains the data for a :class:`FetchRequest`; returns the line to print (what and where).
        status: ``() -> [(label, state, where), ...]`` for ``data list`` (None: not listed).
        dataset: the source takes a dataset name after its own (``uea JapaneseVowels``).
        options: the source-specific ``data fetch`` flags it reads (``"from_dir"``, ``"vocab_size"``); any other
            one given is an error naming the source.
    """

    name: str
    help: str
    fetch: Callable[[FetchRequest], str]
    status: Callable[[], list[tuple[str, str, str]]] | None = None
    dataset: bool = False
    options: tuple[str, ...] = ()


_REGISTRY: dict[str, DataSource] = {}


def register_source(source: DataSource, *, replace: bool = False) -> DataSource:
    """Add ``source``; registering a taken name is an error unless ``replace``."""
    if not isinstance(source, DataSource):
        raise TypeError(f"source must be a DataSource, got {type(source).__name__}")
    if not source.name or not source.name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"source name: expected letters, digits, '_' or '-', got {source.name!r}")
    if source.name in _REGISTRY and not replace:
        raise ValueError(f"data source {source.name!r} is already registered")
    _REGISTRY[source.name] = source
    return source


def unregister_source(name: str) -> None:
    """Remove a source registered at run time (tests, notebooks); built-in ones come back on their next use."""
    _REGISTRY.pop(name, None)


@cache
def _plugins() -> dict[str, Any]:
    """Entry points of the group ``primaldual.data_sources`` (scanned once per process)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group="primaldual.data_sources")}


def _load_plugin(name: str) -> None:
    ep = _plugins().get(name)
    if ep is None:
        return
    try:
        ep.load()
    except Exception as err:  # noqa: BLE001 - a broken plugin is named and skipped, never fatal to other sources
        warnings.warn(
            f"data source plugin {name!r} ({ep.value}) failed to load and is skipped: {type(err).__name__}: {err}",
            RuntimeWarning,
            stacklevel=3,
        )


def _builtins() -> None:
    if "english" not in _REGISTRY:
        # by name, as a plugin's entry point: the registry imports none of the sources it lists
        builtin = importlib.import_module("primaldual.recipes.sources")  # registers on import
        if "english" not in _REGISTRY:  # unregistered by a test: register again
            builtin.register_all()


def get_source(name: str) -> DataSource:
    """The source registered as ``name`` (a plugin's is loaded); ``ValueError`` naming the known ones otherwise."""
    _builtins()
    if name not in _REGISTRY:
        _load_plugin(name)
    if name not in _REGISTRY:
        raise ValueError(f"data fetch: unknown source {name!r}; known: {', '.join(list_sources())}")
    return _REGISTRY[name]


def list_sources(*, load_plugins: bool = False) -> list[str]:
    """The registered source names, built-in and declared by installed plugins (``load_plugins`` loads those, for
    their status rows)."""
    _builtins()
    if load_plugins:
        for name in _plugins():
            if name not in _REGISTRY:
                _load_plugin(name)
    return sorted({*_REGISTRY, *_plugins()})
