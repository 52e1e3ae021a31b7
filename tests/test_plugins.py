"""Plugins as a user installs them: a temporary distribution (a ``.dist-info`` with entry points) holding the task
and the data source of docs/architecture.md, and a broken plugin beside them. They work with no edit to
primaldual; the broken one, and the working ones, are never imported by a config of a built-in task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_architecture_guides import _guide


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    for title in ("Add a task", "Add a dataset"):
        for name, body in _guide(title)[0].items():
            (site / name).write_text(body)
    (site / "broken_plugin.py").write_text("raise ImportError('this plugin is broken')\n")
    dist = site / "myplugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[primaldual.tasks]\ntoy_parity = mytask\nbroken_task = broken_plugin\n\n"
        "[primaldual.data_sources]\ncounting = my_source\nbroken_source = broken_plugin\n"
    )
    return site


def _run(site: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site), PRIMALDUAL_DATA=str(site / "cache"))
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "primaldual.cli", *args]
    return subprocess.run(cmd, cwd=site, env=env, capture_output=True, text=True, timeout=300)


def test_an_installed_task_is_found_by_name(site):
    r = _run(site, "fit", "--config", "toy.yaml", "--print-config")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "task: toy_parity" in r.stdout


def test_an_installed_task_adds_its_config_key(site):
    # three commands in one process (as three `primaldual fit` calls; one interpreter start instead of three)
    code = (
        "import json; from primaldual.cli import main; base = ['fit', '--print-config', '--config']; "
        "print(json.dumps([main(base + a) for a in ("
        "['toy.yaml', '--data.features', '5'], "
        "['toy.yaml', '--data.features', \"'5'\"], "  # a string: the task's check refuses it
        "['uea/default', '--data.features', '5'])]))"
    )
    r = _run(site, code=code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[0, 2, 2]", r.stdout[-2000:] + r.stderr[-2000:]
    assert "features: 5" in r.stdout and "features: 3" not in r.stdout
    assert "data.features: expected an int >= 1, got '5'" in r.stderr, r.stderr[-2000:]
    # the key is the plugin task's, not uea's (named as such here: the plugin was loaded by the first two commands;
    # a fresh process loads no plugin for a built-in config and calls it an unknown key)
    assert "data.features: only task 'toy_parity' uses it, not task 'uea'" in r.stderr, r.stderr[-2000:]


def test_an_installed_data_source_fetches(site):
    r = _run(site, "data", "fetch", "counting")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (site / "cache" / "counting" / "test.txt").is_file()


def test_a_broken_plugin_fails_only_what_names_it(site):
    r = _run(site, "fit", "--config", "uea/default", "--print-config")
    assert r.returncode == 0, r.stderr[-2000:]
    r = _run(site, "fit", "--config", "uea/default", "--task", "broken_task", "--print-config")
    assert r.returncode == 2 and "broken" in r.stderr, r.stderr[-2000:]


def test_a_built_in_config_imports_no_plugin_and_no_lightning(site):
    code = (
        "import json, sys; from primaldual.train.config import load_config; "
        "[load_config(n) for n in ('uea/default', 'lm/english/reduced/transformer', 'rl/hopper-medium/dt')]; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'mytask', 'my_source', 'broken_plugin'))))"
    )
    r = _run(site, code=code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == []
