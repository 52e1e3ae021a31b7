"""Name -> attention-layer registry with capability metadata.

``build_attention("primal", dim=64, num_heads=2, s=20)`` is the single way configs, encoders and
benchmarks create attentions, so every registered name goes through the same registry-wide tests.
Unknown names and unknown options raise errors that list what is valid.

A layer's options are the keyword arguments of its constructors along the MRO (up to the first one without
``**kwargs``) plus the fields of the frozen option dataclasses it lists in ``option_types`` (how the SVR family
declares each option group once).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from .capabilities import Capabilities

__all__ = [
    "AttentionInfo",
    "Capabilities",
    "attention_class",
    "attention_options",
    "attention_table",
    "build_attention",
    "list_attentions",
    "register_attention",
]


@dataclass(frozen=True)
class AttentionInfo:
    name: str
    cls: type
    capabilities: Capabilities
    summary: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary, **asdict(self.capabilities)}


_REGISTRY: dict[str, AttentionInfo] = {}


def register_attention(name: str, capabilities: Capabilities):
    """Class decorator: register an :class:`AttentionLayer` subclass under ``name``."""

    def deco(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"attention name {name!r} is already registered to {_REGISTRY[name].cls}")
        doc = inspect.getdoc(cls) or ""
        _REGISTRY[name] = AttentionInfo(name, cls, capabilities, doc.splitlines()[0] if doc else "")
        cls.registry_name = name
        cls.capabilities = capabilities
        return cls

    return deco


def _info(name: str) -> AttentionInfo:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise KeyError(f"unknown attention {name!r}; registered attentions: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def attention_class(name: str) -> type[nn.Module]:
    return _info(name).cls


def attention_options(name: str) -> dict[str, Any]:
    """The constructor keyword options of ``name`` with their defaults (dim and num_heads excluded).

    Options forwarded through ``**kwargs`` to base classes are collected along the MRO; a class's
    ``option_types`` (frozen dataclasses) contribute their fields.
    """
    cls = _info(name).cls
    options: dict[str, Any] = {}
    for group in getattr(cls, "option_types", ()):
        for f in dataclasses.fields(group):
            options.setdefault(f.name, f.default)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        for p in params:
            if p.name in ("self", "dim", "num_heads") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            options.setdefault(p.name, None if p.default is inspect.Parameter.empty else p.default)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    for refused in getattr(cls, "not_options", ()):
        options.pop(refused, None)
    if "causal" in options and not _info(name).capabilities.non_causal:
        options["causal"] = True  # a causal-only mechanism: True is the one value it takes
    return options


def build_attention(name: str, dim: int, num_heads: int, **options: Any) -> nn.Module:
    """Instantiate the attention registered as ``name`` for ``(B, N, dim)`` inputs (a causal-only mechanism is
    causal unless ``causal`` says otherwise, which it then refuses).

    Raises:
        KeyError: unknown name (the message lists the registered ones).
        TypeError: unknown option (the message lists the valid ones).
    """
    info = _info(name)
    valid = attention_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(
            f"unknown option(s) {unknown} for attention {name!r}; valid options: {', '.join(sorted(valid))}"
        )
    if "causal" not in options and not info.capabilities.non_causal:
        options = {**options, "causal": True}
    return info.cls(dim, num_heads, **options)


def list_attentions() -> list[AttentionInfo]:
    """All registered attentions, sorted by name."""
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def attention_table() -> str:
    """A plain-text table of the registry (name, capabilities, complexity)."""
    rows = [("name", "causal", "weights", "aux loss", "time", "memory")]
    for info in list_attentions():
        c = info.capabilities
        causal = "yes" if c.causal and c.non_causal else ("only" if c.causal else "no")
        rows.append((info.name, causal, _yn(c.weights), _yn(c.aux_loss), c.time, c.memory))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def _yn(flag: bool) -> str:
    return "yes" if flag else "no"
