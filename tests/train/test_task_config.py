"""Task-owned config keys (``Task.config``): a section of the task's own and keys added to a common section, in the
task's configs only, with the fingerprint of a config at their defaults unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from primaldual.tasks.base import register_task, unregister_task
from primaldual.tasks.classification import ClassificationTask
from primaldual.train.config import ConfigError, dump_config, load_config
from primaldual.train.schema import RunConfig, config_class


@dataclass
class _Data:
    features: int = 4


@dataclass
class _Own:
    temperature: float = 1.0
    names: list | None = None


@pytest.fixture
def keyed_task():
    @register_task("keyed_toy")
    class Keyed(ClassificationTask):
        model_kinds = ("timeseries",)
        step_based = False
        config = {"data": _Data, "toy": _Own}

    yield "keyed_toy"
    unregister_task("keyed_toy")


def test_the_task_class_has_its_keys_and_section(keyed_task):
    cls = config_class(keyed_task)
    cfg = cls(task=keyed_task)
    assert cfg.data.features == 4 and cfg.toy.temperature == 1.0 and cfg.data.batch_size == 16
    assert cls.added == (("data", "features"), ("toy", None))
    assert config_class("uea").added == (("data", "fetch"), ("data", "val_fraction"))


def test_keys_at_their_defaults_leave_the_fingerprint_alone(keyed_task, tmp_path):
    base = load_config(None, ["--task", keyed_task])
    plain = RunConfig(task=keyed_task)
    assert base.fingerprint() == plain.fingerprint()  # as if the task added nothing
    changed = load_config(None, ["--task", keyed_task, "--data.features", "7", "--toy.temperature", "0.5"])
    assert changed.data.features == 7 and changed.toy.temperature == 0.5
    assert changed.fingerprint() != base.fingerprint()
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(changed))  # the run directory's record round-trips
    again = load_config(str(path))
    assert again.to_dict() == changed.to_dict() and again.fingerprint() == changed.fingerprint()


def test_the_keys_are_the_task_s_only(keyed_task, tmp_path):
    for flag in ("--data.features", "--toy.temperature"):
        with pytest.raises(ConfigError, match=r"only task 'keyed_toy' uses it, not task 'uea'"):
            load_config("uea/default", [flag, "2"])
    with pytest.raises(ConfigError, match="unknown config key 'data.featurez'"):
        load_config(None, ["--task", keyed_task, "--data.featurez", "2"])
    f = tmp_path / "k.yaml"
    f.write_text("task: keyed_toy\ndata: {features: 2, max_len: 3}\ntoy: {temperatur: 1}\n")
    with pytest.raises(ConfigError, match=r"k.yaml: unknown config key 'toy.temperatur'"):
        load_config(str(f))


def test_a_task_cannot_redefine_a_common_key():
    @dataclass
    class Clash:
        batch_size: int = 3

    @register_task("clashing_toy")
    class Clashing(ClassificationTask):
        model_kinds = ("timeseries",)
        config = {"data": Clash}

    try:
        with pytest.raises(ValueError, match="data.batch_size is a common key"):
            config_class("clashing_toy")
    finally:
        unregister_task("clashing_toy")
