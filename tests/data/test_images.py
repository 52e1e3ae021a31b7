"""idx reader, Fashion-MNIST-1024 split and padding, image-folder reader."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from primaldual.data.cache import MissingDataError
from primaldual.data.images import (
    FashionMNIST1024,
    ImageFolderDataset,
    find_idx_dir,
    pad_to,
    read_idx,
    read_image_folder,
)
from primaldual.data.splits import stratified_split


def _write_idx(path, arr: np.ndarray, compress: bool) -> None:
    code = {np.uint8: 0x08, np.int32: 0x0C}[arr.dtype.type]
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}i", *arr.shape)
    body = arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    data = header + body
    path.write_bytes(gzip.compress(data) if compress else data)


@pytest.fixture
def idx_dir(tmp_path):
    """A small MNIST-format sample: 20 x 10 classes train, 30 test, half of the files gzip-compressed."""
    rng = np.random.default_rng(0)
    tr_y = np.repeat(np.arange(10, dtype=np.uint8), 20)
    te_y = np.tile(np.arange(10, dtype=np.uint8), 3)
    tr_x = rng.integers(0, 256, (200, 28, 28), dtype=np.uint8)
    te_x = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", tr_x, True)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", tr_y, False)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", te_x, False)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", te_y, True)
    return tmp_path, tr_x, tr_y, te_x, te_y


def test_read_idx_roundtrip(idx_dir, tmp_path):
    d, tr_x, tr_y, te_x, _ = idx_dir
    assert np.array_equal(read_idx(d / "train-images-idx3-ubyte.gz"), tr_x)
    assert np.array_equal(read_idx(d / "t10k-images-idx3-ubyte"), te_x)
    ints = np.arange(-3, 9, dtype=np.int32).reshape(3, 4)
    _write_idx(tmp_path / "ints", ints, False)
    assert np.array_equal(read_idx(tmp_path / "ints"), ints)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an idx file"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes((tmp_path / "ints").read_bytes()[:-4])
    with pytest.raises(ValueError, match="header says"):
        read_idx(tmp_path / "short")


def test_split_padding_and_items(idx_dir):
    d, tr_x, tr_y, te_x, te_y = idx_dir
    tr = FashionMNIST1024("train", dataset="mnist", root=d, val_per_class=2)
    va = FashionMNIST1024("val", dataset="mnist", root=d, val_per_class=2)
    te = FashionMNIST1024("test", dataset="mnist", root=d, val_per_class=2)
    assert (len(tr), len(va), len(te)) == (180, 20, 30)
    assert np.bincount(va.labels).tolist() == [2] * 10
    # train and val are disjoint and together are the training files
    rows = {r.tobytes() for r in tr.images} | {r.tobytes() for r in va.images}
    assert len(rows) == 200
    tokens, mask, y = te[3]
    assert tokens.shape == (1024,) and tokens.dtype == torch.int64 and mask.all() and int(y) == te_y[3]
    img = tokens.view(32, 32).numpy()
    assert np.array_equal(img[2:30, 2:30], te_x[3]) and img[:2].sum() == 0 and img[:, 30:].sum() == 0
    # the validation draw is fixed by its seed
    again = FashionMNIST1024("val", dataset="mnist", root=d, val_per_class=2)
    assert np.array_equal(again.images, va.images)
    assert te.info["stand_in_for"].startswith("LRA Image")


def test_helpers_and_errors(tmp_path):
    assert pad_to(np.ones((1, 28, 28), np.uint8)).sum() == 28 * 28
    keep, held = stratified_split(np.array([0, 0, 1, 1, 1]), per_class=1, seed=0)
    assert len(held) == 2 and len(keep) == 3 and set(np.array([0, 0, 1, 1, 1])[held]) == {0, 1}
    with pytest.raises(MissingDataError, match="apt-get install -y dataset-fashion-mnist"):
        find_idx_dir("fashion_mnist", tmp_path)
    with pytest.raises(ValueError, match="dataset"):
        find_idx_dir("cifar", tmp_path)


def test_real_fashion_mnist_if_installed():
    try:
        d = find_idx_dir("fashion_mnist")
    except MissingDataError:
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    te = FashionMNIST1024("test")
    assert len(te) == 10000 and np.bincount(te.labels).tolist() == [1000] * 10
    assert te.images.shape == (10000, 1024) and str(d) in te.info["source"]


def test_image_folder(tmp_path):
    from PIL import Image

    for c, colour in (("cat", 200), ("dog", 50)):
        (tmp_path / c).mkdir()
        for k in range(3):
            Image.new("RGB", (10 + k, 12), (colour, colour, colour)).save(tmp_path / c / f"{k}.png")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    paths, labels, classes = read_image_folder(tmp_path)
    assert classes == ["cat", "dog"] and labels.tolist() == [0, 0, 0, 1, 1, 1] and len(paths) == 6
    ds = ImageFolderDataset(tmp_path, image_size=8)
    x, y = ds[4]
    assert x.shape == (3, 8, 8) and int(y) == 1
    assert torch.equal(x[0], torch.full((8, 8), 50, dtype=torch.uint8))  # uint8 pixels, normalised by the caller
    grey = ImageFolderDataset(tmp_path, image_size=8, mode="L")
    assert grey[0][0].shape == (1, 8, 8)
    with pytest.raises(MissingDataError, match="class"):
        read_image_folder(tmp_path / "cat")
    with pytest.raises(MissingDataError):
        read_image_folder(tmp_path / "nope")


def test_16_bit_pngs_and_dangling_links(tmp_path):
    """A 16-bit grey PNG decodes to its grey levels (not almost white), and a link to nothing is counted as
    skipped, not dropped silently."""
    import os

    from PIL import Image

    from primaldual.data.images import ImageFolderTokens, to_8bit

    ramp = (np.arange(32 * 32).reshape(32, 32) * 64).astype(np.uint16)  # 0 .. 65472
    (tmp_path / "a").mkdir()
    Image.fromarray(ramp).save(tmp_path / "a" / "x.png")
    os.symlink(tmp_path / "missing.png", tmp_path / "a" / "dead.png")
    with Image.open(tmp_path / "a" / "x.png") as im:
        assert im.mode.startswith("I")
        grey = np.asarray(to_8bit(im).convert("L"), dtype=np.float64)
    np.testing.assert_allclose(grey, np.rint(ramp / 257.0), atol=1)
    ds = ImageFolderTokens(tmp_path)
    tokens = ds[0][0].double()
    assert abs(tokens.mean().item() - ramp.mean() / 257.0) < 2  # 127, where convert("L") alone gives about 254
    from primaldual.data.images import ImageFolderDataset

    folder = ImageFolderDataset(tmp_path, image_size=32, mode="L")
    assert [p.name for p in folder.paths] == ["x.png"] and [p.name for p in folder.skipped] == ["dead.png"]
    assert folder.info["skipped_files"] == 1
