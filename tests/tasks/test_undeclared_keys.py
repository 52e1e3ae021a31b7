"""Every key a task does not read is refused in that task's configs, table-driven over all built-in tasks: a
non-default value of a key only other tasks declare exits 2 with one line naming the key and the task."""

from __future__ import annotations

import dataclasses

import pytest

from primaldual.cli import main
from primaldual.tasks.base import exclusive_keys
from primaldual.train.schema import config_class

# one shipped config per built-in task
CONFIGS = {
    "uea": "uea/default",
    "lra_listops": "lra/listops/reduced/transformer",
    "lra_text": "lra/text/reduced/transformer",
    "lra_retrieval": "lra/retrieval/reduced/transformer",
    "lra_image": "lra/image/reduced/transformer",
    "lra_pathfinder": "lra/pathfinder/reduced/transformer",
    "lm": "lm/english/reduced/transformer",
    "vision": "vision/fashion_mnist/deit",
    "offline_rl": "rl/hopper-medium/dt",
}


def _other_value(section: str, key: str) -> str:
    """A well-formed value unlike the default, as a command-line YAML string."""
    owner = sorted(exclusive_keys()[(section, key)])[0]
    field = {f.name: f for f in dataclasses.fields(config_class(owner).sections[section])}[key]
    default, kind = field.default, str(field.type)
    if isinstance(default, bool):
        return str(not default).lower()
    if isinstance(default, int):
        return str(default + 3)
    if isinstance(default, float):
        return str(default / 2 if default else 0.25)
    if default is None and kind.startswith("int"):
        return "7"
    if default is None and kind.startswith("float"):
        return "0.5"
    return "other" if default is None else f"{default}_x"


def _cases() -> list[tuple[str, str, str]]:
    owners = exclusive_keys()
    return [
        (task, section, key)
        for task in CONFIGS
        for (section, key), who in sorted(owners.items(), key=str)
        if key is not None and task not in who
    ]


def test_the_table_covers_every_built_in_task():
    from primaldual.tasks import list_tasks

    assert set(CONFIGS) == {t for t in list_tasks() if t in CONFIGS} and len(CONFIGS) == 9
    assert len(_cases()) > 60


@pytest.mark.parametrize(("task", "section", "key"), _cases(), ids=lambda v: str(v))
def test_a_key_the_task_does_not_declare_exits_2(task, section, key, capsys):
    flag = f"--{section}.{key}"
    assert main(["fit", "--config", CONFIGS[task], flag, _other_value(section, key), "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert f"{section}.{key}" in err and f"not task '{task}'" in err, err


def test_a_section_the_task_does_not_declare_exits_2(capsys):
    assert main(["fit", "--config", "uea/default", "--rl.target_returns", "[1.0]", "--print-config"]) == 2
    assert "rl" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["eval_batch_size", "num_workers"])
def test_offline_rl_refuses_the_loader_keys(key, capsys):
    assert main(["fit", "--config", CONFIGS["offline_rl"], f"--data.{key}", "3", "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"data.{key}: offline RL builds its batches in-process" in err, err
