"""Pathfinder generator: reproducibility, balance, marker placement, and labels checked on the image by connectivity."""

from __future__ import annotations

import json
from collections import deque

import numpy as np
import pytest

from primaldual.data.cache import MissingDataError
from primaldual.data.pathfinder import PathfinderDataset
from primaldual.recipes.pathfinder import GENERATOR, PathfinderConfig, generate_pathfinder, write_pathfinder


def _component(ink: np.ndarray, start: tuple[int, int], radius: int = 2) -> set[tuple[int, int]]:
    """Ink pixels reachable from ``start`` by hops of Chebyshev length <= radius (a plain BFS, independent of the
    generator: it sees only the rendered image)."""
    s = ink.shape[0]
    seen = {start}
    todo = deque([start])
    while todo:
        r, c = todo.popleft()
        for dr in range(-radius, radius + 1):
            for dc in range(-radius, radius + 1):
                q = (r + dr, c + dc)
                if 0 <= q[0] < s and 0 <= q[1] < s and q not in seen and ink[q]:
                    seen.add(q)
                    todo.append(q)
    return seen


@pytest.fixture(scope="module")
def sample():
    return generate_pathfinder(120, seed=11, chunk_size=50)


def test_reproducible_from_seed_and_worker_count():
    a = generate_pathfinder(40, seed=3, chunk_size=16)
    b = generate_pathfinder(40, seed=3, chunk_size=16, workers=2)
    c = generate_pathfinder(40, seed=4, chunk_size=16)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.array_equal(a[2].path_map, b[2].path_map)
    assert not np.array_equal(a[0], c[0])


def test_labels_balanced(sample):
    images, labels, _ = sample
    assert images.shape == (120, 32, 32) and images.dtype == np.uint8
    # chunks of 50, 50, 20: each chunk is exactly balanced
    assert labels.sum() == 60
    assert labels[:50].sum() == 25 and labels[100:].sum() == 10


def test_markers_on_drawn_paths(sample):
    images, labels, rec = sample
    half = PathfinderConfig().marker_size // 2
    for i in range(len(labels)):
        for j in range(2):
            r, c = (int(v) for v in rec.markers[i, j])
            # the whole marker square is ink and belongs to the recorded target path
            assert (images[i, r - half : r + half + 1, c - half : c + half + 1] == 255).all()
            assert rec.path_map[i, r, c] == rec.marker_paths[i, j]
            assert rec.marker_paths[i, j] in (0, 1)
        # the ground-truth record agrees with the label
        assert (rec.marker_paths[i, 0] == rec.marker_paths[i, 1]) == bool(labels[i])
        # both target paths are drawn in every image, whatever the label
        assert (rec.path_map[i] == 0).any() and (rec.path_map[i] == 1).any()
        assert np.array_equal(images[i] > 0, rec.path_map[i] >= 0)


def test_label_equals_image_connectivity(sample):
    images, labels, rec = sample
    for i in range(len(labels)):
        ink = images[i] > 0
        a = tuple(int(v) for v in rec.markers[i, 0])
        b = tuple(int(v) for v in rec.markers[i, 1])
        comp = _component(ink, a)
        assert (b in comp) == bool(labels[i]), f"image {i}: label {labels[i]} but connectivity says {b in comp}"
        if labels[i]:
            # a positive path is long: the component spans many pixels
            assert len(comp) >= 14


def test_distinct_paths_differ_in_difficulty():
    short = PathfinderConfig(contour_length=6)
    _, _, r6 = generate_pathfinder(20, seed=0, config=short)
    _, _, r14 = generate_pathfinder(20, seed=0)
    assert (r6.path_map == 0).sum() < (r14.path_map == 0).sum()


def test_write_read_generated(tmp_path):
    out = write_pathfinder(tmp_path / "pf", {"train": 30, "test": 10}, seed=2)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["splits"]["train"] == {"size": 30, "positives": 15}
    assert meta["generator"] == GENERATOR == "primaldual.data.pathfinder v1"  # the pre-move identifier
    assert (out / "contact_sheet.png").stat().st_size > 0
    ds = PathfinderDataset(out, "train")
    tokens, mask, label = ds[0]
    assert tokens.shape == (1024,) and mask.all() and int(label) in (0, 1)
    assert ds.info["source"] == "generated"
    with pytest.raises(MissingDataError, match="primaldual data generate pathfinder"):
        PathfinderDataset(out, "val")
    with pytest.raises(FileExistsError):
        write_pathfinder(out, {"train": 2}, seed=2)


def test_settings_that_admit_no_image_fail_instead_of_hanging():
    """``--contour-length 40`` on 32 x 32 images used to hang with no output; a probe now reports it in seconds."""
    import time

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"40 dashes of 1 \+ 1.5 px do not fit a 32 x 32 image"):
        generate_pathfinder(4, config=PathfinderConfig(contour_length=40))
    assert time.perf_counter() - t0 < 120
