"""The shipped conversion configs, ``configs/<family>/_convert/<dataset>/<name>.yaml``, by their names
``<family>/<dataset>/convert/<name>`` (``lm/english/convert/primal_plus``, ``vision/fashion_mnist/convert/primal_plus``):
a light module, so that ``primaldual convert --help`` lists them without importing the conversion code."""

from __future__ import annotations

from pathlib import Path

__all__ = ["convert_config_names", "shipped_convert_config"]

_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def convert_config_names(family: str | None = None) -> list[str]:
    """Every shipped conversion config's name (of one ``family``, ``lm``, ``uea``, ..., when given), sorted."""
    found = (f"{p.parents[2].name}/{p.parent.name}/convert/{p.stem}" for p in _CONFIGS.glob("*/_convert/*/*.yaml"))
    return sorted(n for n in found if family is None or n.split("/")[0] == family)


def shipped_convert_config(spec: str) -> Path | None:
    """The file of the shipped name ``spec`` (``<family>/<dataset>/convert/<name>``), or None."""
    parts = spec.split("/")
    if len(parts) == 4 and parts[2] == "convert" and all(p and "." not in p for p in parts):
        path = _CONFIGS / parts[0] / "_convert" / parts[1] / f"{parts[3]}.yaml"
        return path if path.is_file() else None
    return None
