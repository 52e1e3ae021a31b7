"""ListOps reader: the release's TSV format, tokenisation and the errors that name the file and line."""

from __future__ import annotations

import pytest

from primaldual.data.cache import MissingDataError
from primaldual.data.listops import ListOpsDataset, read_listops_tsv, tokenize_listops


def test_reader_accepts_release_format(tmp_path):
    f = tmp_path / "basic_test.tsv"
    f.write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( [SM 4 ) 7 ) ]\t1\n")
    ds = ListOpsDataset(tmp_path, "test", max_len=8)
    assert ds.info["source"] == "LRA release files"
    tokens, mask, _ = ds[0]
    assert tokens[:4].tolist() == tokenize_listops("[MAX 2 9 ]") and ds[1][2] == 1
    assert int(mask.sum()) == 4


def test_reader_errors(tmp_path):
    with pytest.raises(MissingDataError, match="primaldual data generate listops"):
        ListOpsDataset(tmp_path, "train")
    bad = tmp_path / "basic_train.tsv"
    bad.write_text("src\ttgt\n")
    with pytest.raises(ValueError, match=r"basic_train.tsv:1"):
        read_listops_tsv(bad)
    bad.write_text("Source\tTarget\n[MAX 1 2 ]\t12\n")
    with pytest.raises(ValueError, match=r"basic_train.tsv:2.*0-9"):
        read_listops_tsv(bad)
    with pytest.raises(ValueError, match="unknown ListOps token"):
        tokenize_listops("[FOO 1 2 ]")
    with pytest.raises(ValueError, match="tokenisation"):
        tokenize_listops("[MAX 1 2 ]", "spaces")
    bad.write_text("Source\tTarget\n[MAX 1 2 ]\t2\n")
    with pytest.raises(ValueError, match="max_len"):
        ListOpsDataset(tmp_path, "train", max_len=3)
