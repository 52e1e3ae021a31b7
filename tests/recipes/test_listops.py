"""ListOps generator: generated labels are checked by an evaluator written independently of the generator."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from primaldual.data.listops import VOCAB, ListOpsDataset, read_listops_tsv
from primaldual.recipes.listops import GENERATOR, ListOpsConfig, generate_listops, write_listops

SMALL = {"train": 60, "val": 10, "test": 10}


def _evaluate(source: str) -> tuple[int, int, int]:
    """Recursive-descent evaluation of a source string; returns (value, depth, tokens consumed).

    Independent of the generator: it parses text, uses ``statistics.median`` for MED, and checks the grammar
    (every operator closed, nothing left over).
    """
    toks = [t for t in source.split() if t not in ("(", ")")]
    pos = 0

    def expr() -> tuple[int, int]:
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if tok.isdigit():
            assert len(tok) == 1
            return int(tok), 1
        assert tok.startswith("["), f"unexpected token {tok!r}"
        op = tok[1:]
        vals, depths = [], []
        while toks[pos] != "]":
            v, d = expr()
            vals.append(v)
            depths.append(d)
        pos += 1  # the closing bracket
        assert 2 <= len(vals) <= 10, f"{op} has {len(vals)} arguments"
        value = {
            "MIN": lambda: min(vals),
            "MAX": lambda: max(vals),
            "SM": lambda: sum(vals) % 10,
            "MED": lambda: int(statistics.median(vals)),
        }[op]()
        return value, 1 + max(depths)

    value, depth = expr()
    assert pos == len(toks), "trailing tokens after the expression"
    return value, depth, len(toks)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return write_listops(tmp_path_factory.mktemp("lo") / "listops", SMALL, seed=123)


def test_evaluator_on_known_expressions():
    assert _evaluate("[MAX 2 9 [MIN 4 7 ] 0 ]")[0] == 9
    assert _evaluate("[SM 8 9 [MED 1 4 ] ]")[0] == (8 + 9 + 2) % 10
    assert _evaluate("[MED 3 1 7 5 ]")[0] == 4
    # The LRA release prints binary-tuple parentheses around everything; they carry no information.
    assert _evaluate("( ( ( [MAX 2 ) 9 ) ] )")[0] == 9


def test_every_generated_label_is_correct(small_dir):
    cfg = ListOpsConfig()
    for split in ("train", "val", "test"):
        sources, labels = read_listops_tsv(small_dir / f"basic_{split}.tsv")
        assert len(sources) == SMALL[split]
        for src, lab in zip(sources, labels):
            value, depth, n = _evaluate(src)
            assert value == lab
            assert depth <= cfg.max_depth
            assert cfg.min_length < n < cfg.max_length


def test_labels_checked_on_more_expressions_with_short_rules():
    # Shorter bounds allow many more expressions per second: a wider check of the label logic (MED with even counts).
    cfg = ListOpsConfig(max_depth=4, min_length=5, max_length=80)
    data = generate_listops({"train": 2000}, seed=7, config=cfg)["train"]
    for src, lab in data:
        value, depth, n = _evaluate(src)
        assert value == lab and depth <= 4 and 5 < n < 80


def test_reproducible_distinct_and_disjoint():
    a = generate_listops(SMALL, seed=5)
    b = generate_listops(SMALL, seed=5)
    c = generate_listops(SMALL, seed=6)
    assert a == b
    assert a != c
    all_src = [s for rows in a.values() for s, _ in rows]
    assert len(set(all_src)) == len(all_src)


def test_metadata_and_tokenisations(small_dir):
    meta = json.loads((small_dir / "metadata.json").read_text())
    assert meta["seed"] == 123 and meta["splits"]["train"]["size"] == 60
    assert meta["generator"] == GENERATOR == "primaldual.data.listops v1"  # the pre-move identifier
    assert meta["tokenisations"] == ["brackets", "no_brackets"]
    br = ListOpsDataset(small_dir, "val", tokenisation="brackets")
    nb = ListOpsDataset(small_dir, "val", tokenisation="no_brackets")
    assert br.info["tokenisation"] == "brackets" and nb.info["tokenisation"] == "no_brackets"
    assert br.info["source"] == "generated" and br.info["seed"] == 123
    item_b, item_n = (dict(zip(("tokens", "mask", "label"), br[0]))), dict(zip(("tokens", "mask", "label"), nb[0]))
    src, _ = read_listops_tsv(small_dir / "basic_val.tsv")
    n_close = src[0].split().count("]")
    assert int(item_b["mask"].sum()) - int(item_n["mask"].sum()) == n_close
    assert item_b["tokens"].shape == (2048,) and item_b["tokens"].dtype == torch.int64
    assert not (item_n["tokens"] == VOCAB["]"]).any()
    assert (item_b["tokens"][~item_b["mask"]] == 0).all()
    assert item_b["label"] == int(read_listops_tsv(small_dir / "basic_val.tsv")[1][0])
