"""Vision datasets: ImageFolderDataset (timm / DeiT decoding, folder policy) and IdxImages (Fashion-MNIST images)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from primaldual.data.cache import MissingDataError
from primaldual.data.images import FashionMNIST1024, IdxImages, ImageFolderDataset, find_idx_dir
from primaldual.data.splits import stratified_split

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

# (class, file, (width, height), Pillow mode): PNG and JPEG, RGB and grey, landscape / portrait / square
FILES = [
    ("ant", "a0.png", (30, 20), "RGB"),
    ("ant", "a1.jpg", (20, 45), "RGB"),
    ("ant", "a2.png", (24, 24), "L"),
    ("ant", "sub/a3.jpeg", (50, 21), "L"),
    ("bee", "b0.jpg", (64, 48), "RGB"),
    ("bee", "b1.png", (17, 33), "RGBA"),
    ("bee", "b2.png", (40, 40), "RGB"),
    ("bee", "b3.jpg", (21, 60), "L"),
    ("cat", "c0.png", (80, 40), "RGB"),
    ("cat", "c1.png", (25, 19), "L"),
    ("cat", "c2.jpg", (33, 22), "RGB"),
    ("cat", "c3.png", (20, 20), "P"),
]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """3 classes x 4 images of assorted sizes, modes and formats, plus non-image files and a hidden directory."""
    rng = np.random.default_rng(0)
    root = tmp_path / "train"
    for c, name, (w, h), mode in FILES:
        path = root / c / name
        path.parent.mkdir(parents=True, exist_ok=True)
        channels = {"RGB": 3, "RGBA": 4, "L": 1, "P": 1}[mode]
        arr = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
        img = Image.fromarray(arr[..., 0] if channels == 1 else arr, mode="L" if channels == 1 else mode)
        (img.convert("P") if mode == "P" else img).save(path)
    (root / "bee" / "notes.txt").write_text("not an image")
    (root / "cat" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (root / ".thumbnails").mkdir()  # hidden: not a class
    (root / ".thumbnails" / "x.png").write_bytes(b"")
    return root


def test_listing_labels_classes_and_skipped(folder: Path) -> None:
    ds = ImageFolderDataset(folder, image_size=16, crop_pct=0.8)
    assert ds.classes == ["ant", "bee", "cat"] and ds.num_classes == 3
    assert ds.labels.dtype == np.int64 and ds.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert [p.relative_to(folder).as_posix() for p in ds.paths] == [f"{c}/{n}" for c, n, _, _ in FILES]
    assert sorted(p.name for p in ds.skipped) == [".DS_Store", "notes.txt"]
    info = ds.info
    assert info["dataset"] == "image_folder" and info["source"] == str(folder)
    assert (info["size"], info["skipped_files"], info["num_classes"]) == (12, 2, 3)
    assert not hasattr(ds, "mean") and not hasattr(ds, "std")


def test_shapes_train_and_eval(folder: Path) -> None:
    ev = ImageFolderDataset(folder, image_size=16, crop_pct=0.8)
    tr = ImageFolderDataset(folder, image_size=16, crop_pct=0.8, train=True)
    grey = ImageFolderDataset(folder, image_size=16, crop_pct=0.8, mode="L")
    assert (ev.resize, ev.channels, grey.channels) == (20, 3, 1)
    for i in range(len(ev)):
        x, y = ev[i]
        assert x.shape == (3, 16, 16) and x.dtype == torch.uint8 and x.is_contiguous()
        assert y.dtype == torch.int64 and y.shape == () and int(y) == ev.labels[i]
        assert tr[i][0].shape == (3, 20, 20) and grey[i][0].shape == (1, 16, 16)
    xb, yb = default_collate([ev[0], ev[5]])
    assert xb.shape == (2, 3, 16, 16) and yb.tolist() == [0, 1]
    assert ImageFolderDataset(folder).resize == 256  # DeiT: 224 / 0.875


def _coords_image(w: int, h: int) -> np.ndarray:
    """(h, w, 3) uint8: R = column, G = row, B = 7, so every crop can be located exactly."""
    arr = np.zeros((h, w, 3), dtype=np.uint8)
    arr[..., 0] = np.arange(w)[None, :]
    arr[..., 1] = np.arange(h)[:, None]
    arr[..., 2] = 7
    return arr


def test_centre_crop_without_resize_is_exact(tmp_path: Path) -> None:
    # shorter side already = resize (20): no resampling, the crops are plain slices of the file's pixels
    for c, (w, h) in (("wide", (40, 20)), ("tall", (20, 44))):
        (tmp_path / c).mkdir()
        Image.fromarray(_coords_image(w, h)).save(tmp_path / c / "img.png")
    ev = ImageFolderDataset(tmp_path, image_size=16, crop_pct=0.8)
    tr = ImageFolderDataset(tmp_path, image_size=16, crop_pct=0.8, train=True)
    tall, wide = _coords_image(20, 44), _coords_image(40, 20)
    hwc = {  # (S, S, C) reference crops: centre offsets (side - S) / 2
        ("eval", "tall"): tall[14:30, 2:18],
        ("eval", "wide"): wide[2:18, 12:28],
        ("train", "tall"): tall[12:32, :],
        ("train", "wide"): wide[:, 10:30],
    }
    for kind, ds in (("eval", ev), ("train", tr)):
        for i, c in enumerate(ds.classes):
            ref = torch.from_numpy(hwc[kind, c]).permute(2, 0, 1)  # (S, S, C) -> (C, S, S)
            assert torch.equal(ds[i][0], ref), (kind, c)


def test_centre_crop_after_resize_keeps_the_marked_centre(tmp_path: Path) -> None:
    # 80 x 40 black image with a white 8 x 8 square at its centre; resize 20 -> 40 x 20, eval crop 16
    (tmp_path / "a").mkdir()
    arr = np.zeros((40, 80), dtype=np.uint8)
    arr[16:24, 36:44] = 255
    Image.fromarray(arr).save(tmp_path / "a" / "marked.png")
    Image.fromarray(arr.T.copy()).save(tmp_path / "a" / "tall.png")  # the same, 40 x 80
    for train, s in ((False, 16), (True, 20)):
        ds = ImageFolderDataset(tmp_path, image_size=16, crop_pct=0.8, mode="L", train=train)
        x = ds[0][0][0].double()  # (S, S)
        assert x.shape == (s, s)
        rows, cols = torch.meshgrid(torch.arange(s), torch.arange(s), indexing="ij")
        centre = ((x * rows).sum() / x.sum(), (x * cols).sum() / x.sum())
        assert abs(centre[0] - (s - 1) / 2) < 1e-6 and abs(centre[1] - (s - 1) / 2) < 1e-6
        assert x[s // 2, s // 2] > 200 and x[0, 0] == 0 and x[-1, -1] == 0
        # portrait = transposed landscape, up to PIL rounding its two separable bicubic passes (a few levels of 255)
        assert (ds[1][0][0].int() - ds[0][0][0].T.int()).abs().max() <= 4


def test_empty_class_folder_is_an_error(folder: Path) -> None:
    (folder / "dog").mkdir()
    with pytest.raises(ValueError, match="dog"):
        ImageFolderDataset(folder)
    (folder / "dog" / "readme.md").write_text("only text")  # no image either
    with pytest.raises(ValueError, match=r"without images.*dog"):
        ImageFolderDataset(folder)


def test_corrupt_images_fail_on_read_and_in_verify(folder: Path) -> None:
    bad = folder / "bee" / "broken.jpg"
    bad.write_bytes(np.random.default_rng(1).integers(0, 256, 300, dtype=np.uint8).tobytes())
    good = folder / "ant" / "a1.jpg"
    truncated = folder / "cat" / "c9.jpg"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    ds = ImageFolderDataset(folder, image_size=16)
    i_bad, i_trunc = ds.paths.index(bad), ds.paths.index(truncated)
    with pytest.raises(ValueError, match=r"broken\.jpg.*cannot identify"):
        ds[i_bad]
    with pytest.raises(ValueError, match=r"c9\.jpg.*truncated"):
        ds[i_trunc]
    assert ds[ds.paths.index(good)][0].shape == (3, 16, 16)  # the others still read
    quick = [p for p, _ in ds.verify()]  # headers only: the truncated JPEG may pass
    assert bad in quick and set(quick) <= {bad, truncated}
    reasons = dict(ds.verify(decode=True))
    assert set(reasons) == {bad, truncated} and "UnidentifiedImageError" in reasons[bad]


def test_classes_must_match_the_given_list(folder: Path, tmp_path: Path) -> None:
    train = ImageFolderDataset(folder)
    val = tmp_path / "val"
    for c in ("ant", "cat"):
        (val / c).mkdir(parents=True)
        Image.new("RGB", (9, 7), (1, 2, 3)).save(val / c / "v.png")
    with pytest.raises(ValueError, match=r"missing folders \['bee'\]"):
        ImageFolderDataset(val, classes=train.classes)
    (val / "bee").mkdir()
    Image.new("RGB", (9, 7)).save(val / "bee" / "v.png")
    (val / "dog").mkdir()
    with pytest.raises(ValueError, match=r"unexpected folders \['dog'\]"):
        ImageFolderDataset(val, classes=train.classes)
    (val / "dog").rmdir()
    assert ImageFolderDataset(val, classes=train.classes).labels.tolist() == [0, 1, 2]
    # label i is classes[i] in the order given
    again = ImageFolderDataset(val, classes=["cat", "ant", "bee"])
    assert again.classes == ["cat", "ant", "bee"] and again.labels.tolist() == [1, 2, 0]
    with pytest.raises(TypeError, match="classes"):
        ImageFolderDataset(val, classes="ant")
    with pytest.raises(ValueError, match="classes"):
        ImageFolderDataset(val, classes=["ant", "ant", "bee", "cat"])


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"image_size": 0}, ValueError, "image_size"),
        ({"image_size": 16.0}, TypeError, "image_size"),
        ({"crop_pct": 0.0}, ValueError, "crop_pct"),
        ({"crop_pct": 1.2}, ValueError, "crop_pct"),
        ({"crop_pct": "0.9"}, TypeError, "crop_pct"),
        ({"mode": "RGBA"}, ValueError, "mode"),
        ({"train": "yes"}, TypeError, "train"),
    ],
)
def test_bad_options_name_the_option(folder: Path, kwargs: dict, error: type, name: str) -> None:
    with pytest.raises(error, match=name):
        ImageFolderDataset(folder, **kwargs)


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError, match="nope"):
        ImageFolderDataset(tmp_path / "nope")


# ---------------------------------------------------------------------------------------------------- IdxImages


def _write_idx(path: Path, arr: np.ndarray) -> None:
    """The idx format: magic (0, 0, 0x08 = uint8, ndim), big-endian int32 sizes, then the bytes."""
    data = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}i", *arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.fixture
def idx_root(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A small MNIST-format sample: 10 classes x 20 training images, 30 test images."""
    rng = np.random.default_rng(0)
    tr_y = np.repeat(np.arange(10, dtype=np.uint8), 20)
    te_y = np.tile(np.arange(10, dtype=np.uint8), 3)
    tr_x = rng.integers(0, 256, (200, 28, 28), dtype=np.uint8)
    te_x = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", tr_x)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", tr_y)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", te_x)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", te_y)
    return tmp_path, tr_x, tr_y, te_x, te_y


def test_idx_images_on_generated_files(idx_root) -> None:
    root, tr_x, tr_y, te_x, te_y = idx_root
    kw = {"dataset": "mnist", "root": root, "val_per_class": 2}
    tr, va, te = (IdxImages(s, **kw) for s in ("train", "val", "test"))
    assert (len(tr), len(va), len(te)) == (180, 20, 30)
    assert np.bincount(va.labels).tolist() == [2] * 10
    # the same split as FashionMNIST1024: identical labels and (unpadded) pixels
    for split, ds in (("train", tr), ("val", va), ("test", te)):
        ref = FashionMNIST1024(split, **kw)
        assert np.array_equal(ref.labels, ds.labels)
        assert np.array_equal(
            ref.images.reshape(-1, 32, 32)[:, 2:30, 2:30], ds.images[:, 0]
        )  # (M, 1024) -> (M, 32, 32)
    x, y = te[3]
    assert x.shape == (1, 28, 28) and x.dtype == torch.uint8 and torch.equal(x[0], torch.from_numpy(te_x[3]))
    assert y.dtype == torch.int64 and y.shape == () and int(y) == te_y[3]
    x[:] = 0  # items are copies
    assert te.images[3].any()
    # mean / std of the train split (not of the 200 training files), the same for every split
    keep, _ = stratified_split(tr_y.astype(np.int64), per_class=2, seed=0)
    pixels = tr_x[keep].astype(np.float64) / 255
    assert tr.mean == (round(pixels.mean(), 4),) and tr.std == (round(pixels.std(), 4),)
    assert va.mean == te.mean == tr.mean and va.std == te.std == tr.std
    assert tr.classes == [str(d) for d in range(10)] and tr.num_classes == 10
    assert (tr.channels, tr.image_size) == (1, 28)
    assert te.info["split"] == "test" and te.info["size"] == 30 and str(root) in te.info["source"]
    assert "2 per class" in te.info["val_split"]
    assert IdxImages("val", **kw, val_seed=1).labels.tolist() == va.labels.tolist()  # stratified: same counts
    assert not np.array_equal(IdxImages("val", **kw, val_seed=1).images, va.images)


def test_idx_images_errors(idx_root, tmp_path: Path) -> None:
    root = idx_root[0]
    with pytest.raises(ValueError, match="split"):
        IdxImages("validation", root=root)
    with pytest.raises(ValueError, match="dataset"):
        IdxImages("train", dataset="cifar10", root=root)
    with pytest.raises(ValueError, match="val_per_class"):
        IdxImages("train", root=root, val_per_class=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingDataError, match="idx files"):
        IdxImages("test", root=empty)


def test_idx_images_real_fashion_mnist() -> None:
    try:
        find_idx_dir("fashion_mnist")
    except MissingDataError:
        pytest.skip("Fashion-MNIST idx files not installed (apt-get install dataset-fashion-mnist)")
    tr, va, te = (IdxImages(s) for s in ("train", "val", "test"))
    assert (len(tr), len(va), len(te)) == (55000, 5000, 10000)
    assert np.bincount(va.labels).tolist() == [500] * 10 and np.bincount(te.labels).tolist() == [1000] * 10
    assert tr.images.shape == (55000, 1, 28, 28) and tr.images.dtype == np.uint8
    assert tr.mean == va.mean == te.mean and tr.std == te.std
    assert abs(tr.mean[0] - 0.286) < 2e-3 and abs(tr.std[0] - 0.353) < 2e-3
    assert tr.classes[0] == "T-shirt/top" and tr.classes[9] == "Ankle boot" and len(tr.classes) == 10
    x, y = va[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.uint8 and y.dtype == torch.int64
