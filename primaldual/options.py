"""Option validation shared by the layers, the registry and the training config: checked, never coerced.

A YAML file or a command line hands over strings and numbers of any type; ``bool("false")`` is True and
``float("0.1")`` silently accepts a string. Every option therefore goes through one of these checks, which
raise an error naming the option, the value and what is allowed, and return the value unchanged (ints
stay ints; numbers are returned as ``float`` only by :func:`check_number`).

Hand-written: a dozen lines per rule, and the messages are part of the project's contract.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import field, fields
from typing import Any

import torch

__all__ = [
    "UnusedOptionWarning",
    "check_bool",
    "check_choice",
    "check_device",
    "check_fields",
    "check_int",
    "check_name",
    "check_number",
    "check_optional_str",
    "checked",
]


class UnusedOptionWarning(UserWarning):
    """An option was given that the object built will not read in its mode (e.g. primal's token sampling on a causal
    layer): it is named, never silently dropped. ``warnings.simplefilter("error", UnusedOptionWarning)`` makes it an
    error."""


_PATH_PART = re.compile(r"[^./\\\x00-\x1f][^/\\\x00-\x1f]*")  # one path component: no separator, no leading dot


def check_bool(name: str, value: Any) -> bool:
    """``value`` must be ``True`` or ``False`` (not ``"false"``, not ``0``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (true or false), got {value!r} ({type(value).__name__})")
    return value


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
) -> float | None:
    """A finite real number in ``[low, high]`` (``low_open`` / ``high_open`` exclude the ends); returns a float."""
    if value is None and allow_none:
        return None
    if torch.compiler.is_compiling():  # a float traced with dynamic=True is symbolic; the eager calls check it
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number{_range(low, high, low_open, high_open)}, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number{_range(low, high, low_open, high_open)}, got {value!r}")
    if (low is not None and (v < low or (low_open and v == low))) or (
        high is not None and (v > high or (high_open and v == high))
    ):
        raise ValueError(f"{name} must be a number{_range(low, high, low_open, high_open)}, got {value!r}")
    return v


def check_int(
    name: str, value: Any, *, low: int | None = None, high: int | None = None, allow_none: bool = False
) -> int | None:
    """An int (not a bool, not a float such as ``2.0``) in ``[low, high]``."""
    if value is None and allow_none:
        return None
    bounds = _range(low, high, False, False)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{bounds}, got {value!r} ({type(value).__name__})")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be an int{bounds}, got {value!r}")
    return value


def check_name(name: str, value: Any) -> str:
    """A string usable as one directory name (no separator, not starting with '.'): run directories are named after
    it."""
    if not isinstance(value, str) or not _PATH_PART.fullmatch(value):
        raise ValueError(
            f"{name}: expected a name usable as a directory name (no '/', not starting with '.'), got {value!r}"
        )
    return value


def check_optional_str(name: str, value: Any) -> str | None:
    """A non-empty string, or None."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name}: expected a non-empty string or null, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` must be one of ``choices`` (compared by equality, types included: ``1`` is not ``"1"``)."""
    options = tuple(choices)
    if not any(type(value) is type(c) and value == c for c in options):
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in options)}; got {value!r}")
    return value


def check_device(name: str, value: Any) -> Any:
    """``value`` (a string such as ``cpu`` or ``cuda:1``) as a ``torch.device`` this machine has."""
    import torch

    if not isinstance(value, str):
        raise TypeError(f"{name} must be a device name such as cpu or cuda:0, got {value!r} ({type(value).__name__})")
    try:
        device = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name}: expected a torch device such as cpu or cuda:0, got {value!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}: {value} was asked for but no CUDA device is available")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{name}: {value}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    lo, hi = _num(low), _num(high)
    if low is None and high is None:
        return ""
    if high is None:
        return f" {'>' if low_open else '>='} {lo}"
    if low is None:
        return f" {'<' if high_open else '<='} {hi}"
    return f" in {'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"


def _num(v: float | None) -> str:
    """Ints in full (a seed bound of 2**32 - 1 reads as 4294967295), floats compactly."""
    return str(v) if isinstance(v, int) else f"{v:g}" if v is not None else ""


def checked(default: Any, check: Callable[..., Any], note: str = "", **how: Any) -> Any:
    """A dataclass field whose value ``check(key + note, value, **how)`` validates (see :func:`check_fields`);
    ``note`` is said after the key (``" (null for no clipping)"``)."""
    return field(default=default, metadata={"check": (check, note, how)})


def check_fields(obj: Any, prefix: str) -> None:
    """Run the checks declared with :func:`checked` on the fields of dataclass ``obj``, keys named ``prefix.field``."""
    for f in fields(obj):
        if "check" in f.metadata:
            check, note, how = f.metadata["check"]
            check(f"{prefix}.{f.name}{note}", getattr(obj, f.name), **how)
