"""LRA text / retrieval readers (the real-text stand-ins: tests/recipes/test_text_standins.py)."""

from __future__ import annotations

import pytest

from primaldual.data.cache import MissingDataError
from primaldual.data.text import bytes_to_tokens, read_aan_tsv, read_aclimdb, read_imdb_tsv


def test_bytes_to_tokens():
    t, n = bytes_to_tokens(b"\x00ab", 5)
    assert t.tolist() == [1, 98, 99, 0, 0] and n == 3
    assert bytes_to_tokens(b"abcdef", 4)[1] == 4


def test_imdb_readers(tmp_path):
    f = tmp_path / "imdb.tsv"
    f.write_text("label\ttext\n1\tGreat film, caf\u00e9 scene\n0\tDull\n", encoding="utf-8")
    texts, labels = read_imdb_tsv(f)
    assert texts == ["Great film, caf\u00e9 scene".encode(), b"Dull"] and labels.tolist() == [1, 0]
    f.write_text("1\tok\n2\tbad label\n")
    with pytest.raises(ValueError, match=r"imdb.tsv:2"):
        read_imdb_tsv(f)
    with pytest.raises(MissingDataError, match="aclImdb"):
        read_imdb_tsv(tmp_path / "none.tsv")
    for sub, txt in (("pos", b"good"), ("neg", b"bad")):
        (tmp_path / "aclImdb" / "test" / sub).mkdir(parents=True)
        (tmp_path / "aclImdb" / "test" / sub / "0_1.txt").write_bytes(txt)
    texts, labels = read_aclimdb(tmp_path / "aclImdb", "test")
    assert texts == [b"bad", b"good"] and labels.tolist() == [0, 1]
    with pytest.raises(MissingDataError):
        read_aclimdb(tmp_path / "aclImdb", "train")


def test_aan_reader(tmp_path):
    f = tmp_path / "new_aan_pairs.eval.tsv"
    f.write_text("1.0\tP1\tP2\tfirst paper text\tsecond paper\n0\tP3\tP4\tx\ty\n")
    t1, t2, y = read_aan_tsv(f)
    assert t1 == [b"first paper text", b"x"] and t2 == [b"second paper", b"y"] and y.tolist() == [1, 0]
    f.write_text("1\tP1\tP2\tonly four\n")
    with pytest.raises(ValueError, match="5 tab-separated"):
        read_aan_tsv(f)
    with pytest.raises(MissingDataError, match="new_aan_pairs"):
        read_aan_tsv(tmp_path / "missing.tsv")
