"""Pathfinder reader: the LRA release layout (metadata lists and PNGs) and its split by metadata file."""

from __future__ import annotations

import numpy as np
import pytest

from primaldual.data.cache import MissingDataError
from primaldual.data.pathfinder import PathfinderDataset, read_pathfinder_release
from primaldual.recipes.pathfinder import generate_pathfinder


def test_release_layout_reader(tmp_path):
    from PIL import Image

    images, labels, _ = generate_pathfinder(20, seed=9)
    root = tmp_path / "curv_contour_length_14"
    (root / "metadata").mkdir(parents=True)
    for k in range(10):  # 10 metadata files of 2 images each, as in the release (imgs/<k>/sample_<n>.png)
        (root / "imgs" / str(k)).mkdir(parents=True)
        rows = []
        for n in range(2):
            idx = 2 * k + n
            Image.fromarray(images[idx]).save(root / "imgs" / str(k) / f"sample_{n}.png")
            rows.append([f"imgs/{k}", f"sample_{n}.png", "0", str(labels[idx]), "0.5", "2"])
        np.save(root / "metadata" / f"{k}.npy", np.array(rows))
    x, y = read_pathfinder_release(root)
    assert np.array_equal(x, images) and np.array_equal(y, labels)
    tr = PathfinderDataset(root, "train")
    te = PathfinderDataset(root, "test")
    assert len(tr) == 16 and len(te) == 2 and tr.info["source"] == "LRA release files"
    assert np.array_equal(te.images, images[18:].reshape(2, -1))
    with pytest.raises(MissingDataError, match="metadata"):
        read_pathfinder_release(tmp_path)
