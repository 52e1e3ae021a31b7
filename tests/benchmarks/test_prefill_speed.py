"""benchmarks/prefill_speed.py: runs on a short prompt, and prefill's logits agree with the token-by-token loop."""

from __future__ import annotations

import pytest

from tests.benchmarks.scripts import load_script


def test_prefill_speed_runs_and_agrees(capsys):
    script = load_script("prefill_speed")
    rows = script.main(["--prompt", "24", "--dim", "16", "--depth", "2", "--heads", "2", "--vocab", "50"])
    assert len(rows) == 2 and all(r["max_logit_gap"] < 1e-4 and r["prefill_s"] > 0 for r in rows)
    assert "faster" in capsys.readouterr().out


def test_prefill_speed_refuses_bad_settings():
    script = load_script("prefill_speed")
    with pytest.raises(ValueError, match="--prompt"):
        script.parse(["--prompt", "0"])
