"""Token-chunk datasets, the unigram floor and bits per byte."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from primaldual.data.cache import MissingDataError
from primaldual.data.lm import (
    IGNORE_INDEX,
    TokenChunkDataset,
    bits_per_byte,
    chunk_splits,
    load_english_lm,
    load_token_file,
    nats_per_token_from_bits_per_byte,
    unigram_baseline,
    unigram_nll,
    unigram_perplexity,
)


def test_chunks_are_contiguous_and_shifted_by_one():
    ds = TokenChunkDataset(np.arange(10, dtype=np.uint16), tokens_per_sample=3)
    assert len(ds) == 3 and ds.num_targets == 9  # (10 - 1) // 3 full chunks
    x, y = ds[0]
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (3,)
    assert x.tolist() == [0, 1, 2] and y.tolist() == [1, 2, 3]
    assert ds[2][0].tolist() == [6, 7, 8] and ds[2][1].tolist() == [7, 8, 9]
    assert ds[-1][1].tolist() == [7, 8, 9]
    with pytest.raises(IndexError):
        ds[3]
    xs = torch.cat([ds[i][0] for i in range(len(ds))])
    ys = torch.cat([ds[i][1] for i in range(len(ds))])
    assert xs.tolist() == list(range(9)) and ys.tolist() == list(range(1, 10))  # every target exactly once


def test_last_partial_chunk_dropped_or_padded():
    stream = np.arange(100, 111)  # 11 tokens: 10 targets, 3 full chunks of 3, 1 left over
    assert len(TokenChunkDataset(stream, 3)) == 3
    ds = TokenChunkDataset(stream, 3, last="pad", pad_id=0)
    assert len(ds) == 4 and ds.num_targets == 10 and ds.info["targets"] == 10
    x, y = ds[3]
    assert x.tolist() == [109, 0, 0] and y.tolist() == [110, IGNORE_INDEX, IGNORE_INDEX]
    loss = torch.nn.functional.cross_entropy(torch.zeros(3, 200), y, reduction="sum")
    assert loss.item() == pytest.approx(math.log(200))  # the padded targets are ignored
    assert len(TokenChunkDataset(np.arange(1), 3, last="pad")) == 0
    with pytest.raises(ValueError, match="last"):
        TokenChunkDataset(stream, 3, last="wrap")
    with pytest.raises(ValueError, match="1-D"):
        TokenChunkDataset(stream.reshape(1, -1), 3)


def test_chunk_splits_and_sampler_resume():
    splits = chunk_splits({"train": np.arange(50), "valid": np.arange(20)}, 4)
    assert splits["train"].last == "drop" and splits["valid"].last == "pad" and len(splits["valid"]) == 5
    pytest.importorskip("lightning")  # the harness's sampler needs it
    from primaldual.train.datamodule import TrainerEpochSampler

    ds = splits["train"]
    order = [list(TrainerEpochSampler(ds, None, num_replicas=1, rank=0, shuffle=True, seed=3)) for _ in range(2)]
    assert order[0] == order[1] and sorted(order[0]) == list(range(len(ds)))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, sampler=TrainerEpochSampler(ds, None, num_replicas=1, rank=0)
    )
    x, y = next(iter(loader))
    assert x.shape == y.shape == (4, 4) and torch.equal(x[:, 1:], y[:, :-1])


def test_unigram_perplexity_on_known_distributions():
    # train counts (3, 1, 0) over V = 3, add-one: p = (4/7, 2/7, 1/7); eval (0, 1, 2): exp(-mean log p) = 7/2
    train, ev = np.array([0, 0, 0, 1]), np.array([0, 1, 2])
    assert unigram_perplexity(train, ev, 3) == pytest.approx(3.5)
    assert unigram_nll(train, ev, 3) == pytest.approx(math.log(3.5))
    uniform = np.repeat(np.arange(16), 50)
    assert unigram_perplexity(uniform, np.arange(16), 16) == pytest.approx(16.0)
    skewed = unigram_perplexity(np.array([0] * 97 + [1, 2, 3]), np.array([0] * 9 + [1]), 4)
    assert 1.0 < skewed < 4.0  # a peaked train distribution beats the uniform floor on matching text
    with pytest.raises(ValueError, match="token ids"):
        unigram_perplexity(train, np.array([5]), 3)
    base = unigram_baseline(train, ev, 3, n_bytes=6)
    assert base["perplexity"] == pytest.approx(3.5)
    assert base["bits_per_byte"] == pytest.approx(math.log2(3.5) * 3 / 6)


def test_bits_per_byte():
    assert bits_per_byte(math.log(2), 10, 10) == pytest.approx(1.0)
    assert bits_per_byte(math.log(4), 100, 400) == pytest.approx(0.5)  # 2 bits per token, 4 bytes per token
    assert nats_per_token_from_bits_per_byte(bits_per_byte(3.2, 7, 30), 7, 30) == pytest.approx(3.2)
    with pytest.raises(ValueError):
        bits_per_byte(1.0, 1, 0)


def test_load_english_lm(tmp_path):
    with pytest.raises(MissingDataError, match="primaldual data fetch english"):
        load_english_lm(tmp_path)
    meta = {"tokenizer": {"vocab_size": 300}, "splits": {}}
    for split, n in (("train", 1000), ("valid", 100), ("test", 90)):
        buf = io.BytesIO()
        np.save(buf, (np.arange(n) % 300).astype(np.uint16))
        (tmp_path / f"{split}.u16.npy").write_bytes(buf.getvalue())
        meta["splits"][split] = {"token_file": f"{split}.u16.npy", "bytes": 4 * n, "tokens": n}
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    ds = load_english_lm(tmp_path, tokens_per_sample=64, splits=("train", "val", "test"))
    assert len(ds["train"]) == 999 // 64 and len(ds["val"]) == -(-99 // 64) and ds["test"].vocab_size == 300
    assert ds["val"].info["bytes"] == 400 and isinstance(ds["train"].tokens, np.memmap)
    x, y = ds["train"][1]
    assert x[0] == 64 and y[-1] == 128
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ValueError):
        load_token_file(tmp_path / "bad.npy")
    with pytest.raises(ValueError, match="split"):
        load_english_lm(tmp_path, splits=("dev",))


def test_bad_corpus_files_are_named(tmp_path):
    """Each malformed file of a corpus is a ValueError naming it: pickles refused (never loaded), truncated or empty
    arrays, an archive, bad metadata, ids outside the vocabulary, a token file outside the corpus."""
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "ok.npy", np.arange(10, dtype=np.uint16))
    (tmp_path / "trunc.npy").write_bytes((tmp_path / "ok.npy").read_bytes()[:-6])
    (tmp_path / "empty.npy").write_bytes(b"")
    np.savez(tmp_path / "x.npz", a=np.arange(3))
    for name, why in [("obj", "pickled Python objects"), ("trunc", "not a readable"), ("empty", "not a readable"),
                      ("x.npz", "an .npz archive")]:  # fmt: skip
        path = tmp_path / (name if name.endswith(".npz") else f"{name}.npy")
        with pytest.raises(ValueError, match=rf"{path}: .*{why}"):
            load_token_file(path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    np.save(corpus / "train.npy", np.array([1, 2, 400], dtype=np.uint16))
    for meta, why in [
        ("{not json", "not readable JSON"),
        ("{}", "expected 'splits'"),
        ('{"splits": {"train": {"token_file": "train.npy"}}, "tokenizer": {"vocab_size": "300"}}', "vocab_size"),
        ('{"splits": {"train": {"token_file": "train.npy"}}, "tokenizer": {"vocab_size": 300}}', r"\[0, 300\)"),
        ('{"splits": {"train": {"token_file": "../ok.npy"}}, "tokenizer": {"vocab_size": 300}}', "outside the corpus"),
    ]:
        (corpus / "metadata.json").write_text(meta)
        with pytest.raises(ValueError, match=why):
            load_english_lm(corpus, splits=("train",))
