"""The one stratified splitter: pinned indices (run directories and results depend on them) and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from primaldual.data import stratified_split

LABELS = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0])


@pytest.mark.parametrize(
    ("kwargs", "held"),
    [
        ({"fraction": 0.3, "seed": 0}, [6, 8, 11, 12, 13, 16]),
        ({"fraction": 0.3, "seed": 1}, [0, 2, 4, 5, 15, 16]),
        ({"per_class": 2, "seed": 0}, [2, 4, 15, 16, 17, 19]),
        ({"per_class": 2, "seed": 1}, [1, 9, 12, 13, 14, 17]),
    ],
)
def test_split_indices_are_pinned(kwargs, held):
    keep, got = stratified_split(LABELS, **kwargs)
    assert got.tolist() == held
    assert keep.tolist() == sorted(set(range(len(LABELS))) - set(held))
    assert keep.dtype == got.dtype == np.int64


def test_fraction_keeps_singletons_and_per_class_needs_enough():
    keep, held = stratified_split(np.array([0, 0, 0, 0, 1]), 0.5, 0)
    assert held.tolist() in ([0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]) and 4 in keep
    with pytest.raises(ValueError, match="per_class=2"):
        stratified_split(np.array([0, 0, 1]), per_class=2)
    with pytest.raises(ValueError, match="exactly one"):
        stratified_split(LABELS, 0.2, per_class=1)
    with pytest.raises(ValueError, match="exactly one"):
        stratified_split(LABELS)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        stratified_split(LABELS, 1.0)
