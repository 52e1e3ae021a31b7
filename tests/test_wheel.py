"""The wheel is the product: built from the checkout, it holds every module and every config, and an installed copy
finds its configs from any working directory (no checkout, no ./configs)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (path,) = out.glob("primaldual-*.whl")
    return path


def test_the_wheel_holds_every_module_and_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "primaldual").rglob("*.py")}
    configs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "primaldual" / "configs").rglob("*.yaml")}
    assert modules <= names, sorted(modules - names)
    assert len(configs) > 40 and configs <= names, sorted(configs - names)
    assert "primaldual/configs/uea/default.yaml" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))]
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "Requires-Dist: omegaconf" in text and "jsonargparse" not in text


def test_an_installed_wheel_finds_its_configs_from_an_empty_directory(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    empty = tmp_path / "empty"
    empty.mkdir()
    code = (
        "import primaldual, sys; from primaldual.train.config import list_configs, load_config; "
        "print(primaldual.__file__); print(len(list_configs())); print(load_config('uea/default').name)"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    res = subprocess.run([sys.executable, "-c", code], cwd=empty, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    where, count, name = res.stdout.split()
    assert Path(where).is_relative_to(site)  # the unpacked wheel, not the checkout
    from primaldual.train.config import list_configs

    assert int(count) == len(list_configs()) and name == "primalformer-30ep"  # every name the checkout has
    res = subprocess.run(
        [sys.executable, "-m", "primaldual.cli", "configs"], cwd=empty, capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and "uea/JapaneseVowels/primalformer" in res.stdout, res.stderr[-2000:]
