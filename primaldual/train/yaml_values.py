"""YAML as users write it: the safe loader, with floats spelled ``1e-3``, no duplicate keys, and a cap on aliases.

PyYAML implements YAML 1.1, where a float needs a dot (``1.0e-3``): ``1e-3`` and ``3E-4``, the spellings every user
types, load as strings and were refused as "not a number". :class:`ConfigLoader` adds YAML 1.2's float form to the
implicit resolvers, so they load as floats wherever they appear (a string that is not a number stays a string, and
is still refused where a number is expected). It also refuses two things the safe loader accepts silently:

* a **duplicate key** in one mapping (the later value would win without a word);
* an **alias bomb**: nested anchors that expand to millions of nodes (a few hundred bytes of ``vars:`` that hang the
  config engine). Every alias counts the nodes it stands for; more than :data:`MAX_EXPANDED_NODES` in one document
  is an error.

Hand-written because PyYAML has no option for any of the three; ``ruamel.yaml`` refuses duplicates but reads
``1e-3`` as a string too, and would be a new dependency of the config engine.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["MAX_EXPANDED_NODES", "ConfigLoader", "YAMLValueError", "load_yaml", "override_value"]

#: the most nodes one document may expand to through its aliases (configs hold a few hundred)
MAX_EXPANDED_NODES = 100_000

# YAML 1.2 core schema floats with an exponent and no dot (1e-3, -3E+4); the dotted forms are YAML 1.1's already
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$")


class YAMLValueError(yaml.YAMLError):
    """A duplicate key or an alias bomb (a :class:`yaml.YAMLError`, so callers' YAML error handling covers it)."""


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with exponent floats without a dot, duplicate keys refused and alias expansion capped."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the safe loader's own error follows
                break
            if duplicate:
                line = key_node.start_mark.line + 1
                raise YAMLValueError(f"duplicate key {key!r} (line {line}); each key may appear once per mapping")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        total = self._size(node)
        if total > MAX_EXPANDED_NODES:
            raise YAMLValueError(
                f"the document expands to {total:,} nodes through its aliases (at most {MAX_EXPANDED_NODES:,}): "
                "an alias bomb or a runaway anchor"
            )
        return node

    def _size(self, node: yaml.Node) -> int:
        """Nodes ``node`` stands for, aliases expanded (memoised per node, so shared anchors are counted cheaply)."""
        key = id(node)
        if key in self._sizes:
            return self._sizes[key]
        self._sizes[key] = 1  # a recursive structure counts once (the safe loader refuses it later anyway)
        if isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._size(v) for v in node.value)
        else:
            size = 1
        self._sizes[key] = min(size, MAX_EXPANDED_NODES + 1)
        return self._sizes[key]


ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """Parse ``text`` with :class:`ConfigLoader` (raises :class:`yaml.YAMLError` subclasses)."""
    loader = ConfigLoader(text)  # a SafeLoader: no Python objects are constructed
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def override_value(text: str, flag: str) -> Any:
    """The value of a command-line override ``--flag text``, parsed as YAML; a malformed one (an unclosed bracket, a
    control character) is a :class:`~primaldual.utils.errors.ConfigError` naming the flag."""
    from ..utils.errors import ConfigError

    if not text.strip():  # YAML reads it as null: a default the user did not ask for
        raise ConfigError(f"{flag}: empty value; give a value, or null for none")
    try:
        return load_yaml(text)
    except yaml.YAMLError as e:
        reason = " ".join(str(e).split())[:160]
        raise ConfigError(f"{flag}: {text!r} is not a valid YAML value ({reason})") from None
