"""The data-source registry: a plugin adds `data fetch NAME` without editing primaldual, a broken plugin stays alone,
and source-specific flags are refused by the sources that do not read them."""

from __future__ import annotations

import sys
import textwrap

import pytest

from primaldual.cli import main
from primaldual.data import sources


@pytest.fixture
def plugin_env(tmp_path, monkeypatch):
    """A temporary installed distribution declaring two data-source entry points, one of them broken."""
    pkg = tmp_path / "site"
    (pkg / "mysrc").mkdir(parents=True)
    (pkg / "mysrc" / "__init__.py").write_text(
        textwrap.dedent(
            """
            from primaldual.data.sources import DataSource, register_source

            def _fetch(req):
                return f"mydata fetched into {req.out} (force={req.force})"

            register_source(DataSource("mydata", "a plugin's data", _fetch,
                                       status=lambda: [("mydata", "present (plugin)", "-")]))
            """
        )
    )
    (pkg / "broken.py").write_text("raise ImportError('this plugin is broken')\n")
    dist = pkg / "mysrc-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mysrc\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[primaldual.data_sources]\nmydata = mysrc\nbroken = broken\n")
    monkeypatch.syspath_prepend(str(pkg))
    sources._plugins.cache_clear()
    yield
    for name in ("mydata", "broken"):
        sources.unregister_source(name)
    sys.modules.pop("mysrc", None)
    sources._plugins.cache_clear()


def test_a_plugin_adds_a_fetchable_source(plugin_env, capsys, tmp_path):
    assert "mydata" in sources.list_sources()
    assert main(["data", "fetch", "mydata", "--out", str(tmp_path / "x"), "--force"]) == 0
    assert f"mydata fetched into {tmp_path / 'x'} (force=True)" in capsys.readouterr().out
    with pytest.warns(RuntimeWarning, match="data source plugin 'broken' .* failed to load and is skipped"):
        assert main(["data", "list"]) == 0
    assert "present (plugin)" in capsys.readouterr().out


def test_a_broken_plugin_does_not_stop_other_sources(plugin_env, capsys):
    with pytest.warns(RuntimeWarning, match="'broken'"), pytest.raises(ValueError, match="unknown source 'broken'"):
        sources.get_source("broken")
    assert sources.get_source("smollm2").name == "smollm2"  # built-ins load without touching plugins


def test_source_specific_flags_are_refused_elsewhere(capsys):
    assert main(["data", "fetch", "smollm2", "--from", "/tmp"]) == 2
    assert "--from is for `english` only" in capsys.readouterr().err
    assert main(["data", "fetch", "english", "JapaneseVowels"]) == 2
    err = capsys.readouterr().err
    assert "english: takes no dataset name (got 'JapaneseVowels'); only `uea` does" in err


def test_registration_is_checked():
    with pytest.raises(ValueError, match="already registered"):
        sources.register_source(sources.get_source("english"))
    with pytest.raises(ValueError, match="source name"):
        sources.register_source(sources.DataSource("a/b", "x", lambda r: ""))
    with pytest.raises(TypeError, match="DataSource"):
        sources.register_source("english")
