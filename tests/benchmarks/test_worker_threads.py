"""benchmarks/worker_threads.py: the two settings differ only in --threads; options are checked."""

from __future__ import annotations

import pytest

from .scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("worker_threads")


def test_the_settings_differ_only_in_threads(script, tmp_path):
    args = script.parse(["--rounds", "1", "--steps", "2"])
    default = script.command(args, tmp_path / "data", tmp_path / "run", "default")
    fewer = script.command(args, tmp_path / "data", tmp_path / "run", "fewer")
    assert fewer[: len(default)] == default and fewer[len(default)] == "--threads"
    assert "--data.num_workers" in default and default[default.index("--data.num_workers") + 1] == "1"


def test_bad_options(script):
    for flag in ("--rounds", "--steps", "--workers", "--examples"):
        with pytest.raises(ValueError, match=flag):
            script.parse([flag, "0"])
