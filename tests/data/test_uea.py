"""The .ts reader on the real JapaneseVowels files and on malformed files; splits and normalisation."""

from __future__ import annotations

import numpy as np
import pytest

from primaldual.data import ChannelNormalizer, TSFormatError, load_uea, pad_series, read_ts, stratified_split
from primaldual.data.cache import MissingDataError
from primaldual.data.uea_fetch import fetch_japanese_vowels, verify_japanese_vowels


@pytest.fixture(scope="session")
def jv_dir():
    return fetch_japanese_vowels(quiet=True)  # cached after the first call; verified every time


def test_japanese_vowels_real_files(jv_dir):
    verify_japanese_vowels(jv_dir)
    train, test = load_uea("JapaneseVowels")
    assert (len(train), len(test)) == (270, 370)
    assert train.num_channels == test.num_channels == 12
    assert train.class_names == test.class_names == [str(i) for i in range(1, 10)]
    assert train.problem_name == "JapaneseVowels"
    lengths = [s.shape[0] for s in train.series + test.series]
    assert min(lengths) == 7 and max(lengths) == 29  # unequal lengths, <= 29
    assert np.bincount(train.labels).tolist() == [30] * 9  # 30 utterances per speaker in TRAIN
    assert all(np.isfinite(s).all() for s in train.series)
    # The first value of the first TRAIN case, as written in the file.
    assert train.series[0][0, 0] == pytest.approx(1.860936)


def test_load_by_name_from_user_dir(jv_dir, tmp_path):
    (tmp_path / "JapaneseVowels").mkdir()
    for split in ("TRAIN", "TEST"):
        (tmp_path / "JapaneseVowels" / f"JapaneseVowels_{split}.ts").write_bytes(
            (jv_dir / f"JapaneseVowels_{split}.ts").read_bytes()
        )
    # A decoy .ts file must never be picked up: loading goes by exact name.
    (tmp_path / "JapaneseVowels" / "AAA_decoy.ts").write_text("garbage")
    train, test = load_uea("JapaneseVowels", root=tmp_path)
    assert (len(train), len(test)) == (270, 370)


def test_missing_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(MissingDataError, match="timeseriesclassification.com"):
        load_uea("Heartbeat", root=tmp_path)
    with pytest.raises(MissingDataError, match="primaldual data fetch uea JapaneseVowels"):
        load_uea("JapaneseVowels", root=tmp_path)


HEADER = "#comment\n@problemName Toy\n@dimensions 2\n@equalLength false\n@classLabel true a b\n@data\n"


def _write(tmp_path, body, header=HEADER):
    p = tmp_path / "Toy_TRAIN.ts"
    p.write_text(header + body)
    return p


def test_unequal_lengths_missing_values_string_labels(tmp_path):
    p = _write(tmp_path, "1,2,3:4,5,6:a\n1,?:2,3:b\n\n7,8,9,10:1,1,1,1:a\n")
    ds = read_ts(p)
    assert ds.class_names == ["a", "b"] and ds.labels.tolist() == [0, 1, 0]
    assert [s.shape for s in ds.series] == [(3, 2), (2, 2), (4, 2)]
    assert np.isnan(ds.series[1][1, 0]) and ds.series[1][0, 1] == 2.0


@pytest.mark.parametrize(
    "body, line, words",
    [
        ("1,2:3,4:a\n1,2:3,4:c\n", 8, "label 'c' is not in the @classLabel set"),
        ("1,2:3,4:a\n1,2,3:3,4:b\n", 8, "ragged channels"),
        ("1,2:3,x4:a\n", 7, "non-numeric value 'x4'"),
        ("1,2:3,4:5,6:a\n", 7, "3 channels, expected 2"),
        ("1,2:3,inf:a\n", 7, "infinite value"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, body, line, words):
    p = _write(tmp_path, body)
    with pytest.raises(TSFormatError, match=words) as e:
        read_ts(p)
    assert str(e.value).startswith(f"{p}:{line}: ")
    assert e.value.line == line


def test_malformed_headers(tmp_path):
    with pytest.raises(TSFormatError, match="no @data"):
        read_ts(_write(tmp_path, "", header="@problemName Toy\n"))
    with pytest.raises(TSFormatError, match="not supported"):
        read_ts(_write(tmp_path, "1:1\n", header="@classLabel false\n@data\n"))
    with pytest.raises(TSFormatError, match="time-stamped"):
        read_ts(_write(tmp_path, "", header="@timeStamps true\n@classLabel true a\n@data\n"))
    with pytest.raises(TSFormatError, match="expected a @ header"):
        read_ts(_write(tmp_path, "", header="1,2:a\n@data\n"))
    p = _write(tmp_path, "1,2:3,4:a\n")
    with pytest.raises(TSFormatError, match="differs from the expected"):
        read_ts(p, class_names=["b", "a"])


def test_normaliser_is_fitted_on_train_only():
    train = [np.array([[0.0, 10.0], [2.0, np.nan]], dtype=np.float32), np.array([[4.0, 30.0]], dtype=np.float32)]
    test = [np.array([[100.0, np.nan]], dtype=np.float32)]
    norm = ChannelNormalizer().fit(train)
    np.testing.assert_allclose(norm.mean, [2.0, 20.0])
    np.testing.assert_allclose(norm.std, [np.std([0, 2, 4]), 10.0])
    (t,) = norm.transform(test)
    assert t[0, 0] == pytest.approx(98.0 / np.std([0, 2, 4]))
    assert t[0, 1] == 0.0  # missing -> training mean -> 0 after standardising
    tr = norm.transform(train)
    assert tr[0][1, 1] == 0.0 and np.isfinite(np.concatenate(tr)).all()


def test_pad_series_and_mask():
    x, mask = pad_series([np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)], 5)
    assert x.shape == (2, 5, 3) and mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]
    assert (x[0, 2:] == 0).all()
    with pytest.raises(ValueError, match="length 4 > padded length 3"):
        pad_series([np.ones((4, 3), np.float32)], 3)


def test_stratified_split_is_seeded_and_stratified():
    labels = np.repeat(np.arange(9), 30)
    tr, va = stratified_split(labels, 0.2, seed=3)
    assert len(va) == 54 and np.bincount(labels[va]).tolist() == [6] * 9
    assert set(tr).isdisjoint(va) and len(tr) + len(va) == 270
    tr2, va2 = stratified_split(labels, 0.2, seed=3)
    assert (va == va2).all()
    assert not (stratified_split(labels, 0.2, seed=4)[1] == va).all()
