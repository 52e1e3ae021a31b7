"""benchmarks/rotated_crossover.py: each case takes the path it names, the constants come back, bad options."""

from __future__ import annotations

import json

import pytest

import primaldual.attention.primal as primal_layer_module
import primaldual.functional.primal_rotated as pr

from .scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("rotated_crossover")


def _tiny(*extra: str) -> list[str]:
    return ["--rounds", "1", "--calls", "1", "--threads", "1", "--warmup", "0", "--dim", "16", "--s", "4", *extra]


def test_threshold_names_exist(script):
    for causal in (False, True):
        for compiled in (False, True):
            assert isinstance(getattr(pr, script.threshold_name(causal, compiled)), int)


@pytest.mark.parametrize("causal", [False, True])
def test_each_case_takes_its_path_and_the_constant_comes_back(script, tmp_path, monkeypatch, causal):
    calls = []
    real = primal_layer_module.primal_output_rotated

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(primal_layer_module, "primal_output_rotated", spy)
    name = script.threshold_name(causal, False)
    kept = getattr(pr, name)
    cases = script.build_cases(script.parse(_tiny(*(["--causal"] if causal else []))), 8)
    assert list(cases) == ["floor", "rotated", "folded"]
    cases["folded"]()
    cases["floor"]()
    assert calls == []
    cases["rotated"]()
    assert calls == [1]
    setattr(pr, name, kept)

    out = tmp_path / "crossover.json"
    flags = ["--lengths", "8", "12", "--json", str(out), *(["--causal"] if causal else [])]
    assert script.main(_tiny(*flags)) == 0
    assert getattr(pr, name) == kept  # the measurement restores what use_rotated reads
    data = json.loads(out.read_text())
    assert data["meta"]["threshold"] == name
    assert [row["N"] for row in data["rows"]] == [8, 12]
    for row in data["rows"]:
        assert set(row["ms"]) == {"floor", "rotated", "folded"} and row["over_floor"]["floor"] == 1.0
        assert row["rotated_vs_folded"] == pytest.approx(row["ms"]["folded"] / row["ms"]["rotated"])


def test_bad_options_are_named(script, capsys):
    with pytest.raises(SystemExit):
        script.main(_tiny("--lengths", "0"))
    assert "--lengths >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
