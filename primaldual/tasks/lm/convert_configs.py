"""The shipped conversion configs, ``configs/lm/_convert/<corpus>/<name>.yaml``, by their names
``lm/<corpus>/convert/<name>``: a light module, so that ``primaldual convert --help`` lists them without importing the
conversion code."""

from __future__ import annotations

from pathlib import Path

__all__ = ["convert_config_names", "shipped_convert_config"]

_SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "lm" / "_convert"


def convert_config_names() -> list[str]:
    """Every shipped conversion config's name, sorted."""
    return sorted(f"lm/{p.parent.name}/convert/{p.stem}" for p in _SHIPPED.glob("*/*.yaml"))


def shipped_convert_config(spec: str) -> Path | None:
    """The file of the shipped name ``spec`` (``lm/<corpus>/convert/<name>``), or None."""
    parts = spec.split("/")
    if len(parts) == 4 and parts[0] == "lm" and parts[2] == "convert" and "." not in parts[1] + parts[3]:
        path = _SHIPPED / parts[1] / f"{parts[3]}.yaml"
        return path if path.is_file() else None
    return None
