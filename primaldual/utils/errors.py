"""The harness's error for a bad config (its own module, on the floor under the task registry and the config engine)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A bad config file, key or value; the message names it."""
