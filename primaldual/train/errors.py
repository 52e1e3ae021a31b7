"""The harness's error for a bad config (kept apart so that the task registry and the config module share it)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A bad config file, key or value; the message names it."""
