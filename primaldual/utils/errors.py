"""The harness's error for a bad config (its own module, on the floor under the task registry and the config engine)."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "yaml_hint"]


class ConfigError(ValueError):
    """A bad config file, key or value; the message names it."""


def yaml_hint(key: Any) -> str:
    """A hint for a key such as ``'s:4'``, which YAML reads from ``{s:4}`` (no space after the colon)."""
    if isinstance(key, str) and ":" in key:
        k, _, v = key.partition(":")
        return f" (YAML reads {{{key}}} as the key {key!r}; write {{{k}: {v}}} with a space after the colon)"
    return ""
