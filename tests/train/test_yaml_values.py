"""YAML as users write it: ``1e-3`` is a float, duplicate keys and alias bombs are refused (one line, exit 2)."""

from __future__ import annotations

import time

import pytest
import yaml

from primaldual.cli import main
from primaldual.train.config import load_config
from primaldual.train.yaml_values import YAMLValueError, load_yaml


@pytest.mark.parametrize(
    "text,value",
    [
        ("1e-3", 1e-3),
        ("3E-4", 3e-4),
        ("-2e+2", -200.0),
        ("1.0e-3", 1e-3),
        ("0.5", 0.5),
        ("7", 7),
        ("1e", "1e"),
        ("e-3", "e-3"),
        ("'1e-3'", "1e-3"),
        ("fast", "fast"),
    ],
)
def test_exponent_floats_load_as_floats_and_other_strings_stay_strings(text, value):
    got = load_yaml(text)
    assert got == value and type(got) is type(value)


def test_duplicate_keys_are_refused_with_the_line():
    with pytest.raises(YAMLValueError, match=r"duplicate key 'lr' \(line 4\)"):
        load_yaml("optim:\n  name: adamw\n  lr: 0.1\n  lr: 0.2\n")
    assert load_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}  # the same key in two mappings


def test_an_alias_bomb_is_refused_quickly():
    lines = ["vars:", "  a0: &a0 [x, x, x, x, x, x, x, x]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 8)}]" for i in range(1, 8)]
    t0 = time.perf_counter()
    with pytest.raises(YAMLValueError, match="alias bomb"):
        load_yaml("\n".join(lines) + "\n")
    assert time.perf_counter() - t0 < 5
    assert load_yaml("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}  # ordinary anchors still work
    assert issubclass(YAMLValueError, yaml.YAMLError)


def test_the_config_engine_reads_user_spellings(tmp_path, capsys):
    cfg = load_config("uea/default", ["--optim.lr", "1e-3", "--trainer.max_epochs", "2"])
    assert cfg.optim.lr == 1e-3
    with pytest.raises(Exception, match="must be a number"):
        load_config("uea/default", ["--optim.lr", "fast"])
    bad = tmp_path / "dup.yaml"
    bad.write_text("defaults: [uea/default]\nseed: 1\nseed: 2\n")
    assert main(["fit", "--config", str(bad), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "duplicate key 'seed'" in err[0]
    assert not (tmp_path / "r").exists()
