"""Image data: the idx reader (Fashion-MNIST / MNIST), the LRA-style 1024-token image task, and an image-folder reader.

* :func:`read_idx` reads the idx format of MNIST-family files (gzip-compressed or raw): a 4-byte magic number
  (two zero bytes, a type code, the number of dimensions), big-endian int32 sizes, then the data.
* :class:`FashionMNIST1024` is a stand-in for the LRA Image task (CIFAR-10 is not downloaded by primaldual):
  real Fashion-MNIST, 28 x 28 grey images zero-padded (2 pixels each side) to 32 x 32 = 1024 pixel tokens, 10
  classes, split 55k train / 5k val / 10k test. The validation images are 500 per class drawn from the 60k
  training files with a fixed seed (stratified), so the split is the same on every machine. The same class reads
  real MNIST idx files (``dataset="mnist"``), since the formats are identical.
* :class:`IdxImages` serves the same idx files and split as ``(1, 28, 28)`` uint8 images for image classifiers
  (ViT), with the train split's pixel mean / std.
* :func:`read_image_folder` / :class:`ImageFolderDataset` read the ImageNet-style layout ``root/<class>/<image>``
  with Pillow (no torchvision), class indices in sorted directory order; :class:`ImageFolderDataset` decodes as
  timm / DeiT do (shorter side resized to ``image_size / crop_pct``, centre crop) into uint8 images.

Fashion-MNIST comes from the Debian package ``dataset-fashion-mnist`` (files in /usr/share/datasets/fashion-mnist);
``$PRIMALDUAL_DATA/fashion_mnist`` (or ``~/.cache/primaldual/fashion_mnist``) is searched first, so any copy of the
four standard idx files can be used. The idx parser is a few lines of numpy, hand-written because the only
maintained readers (torchvision, tensorflow-datasets) are heavy dependencies this package does not require.
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..options import check_bool, check_choice, check_int, check_number
from .cache import MissingDataError, dataset_dir
from .splits import stratified_split

__all__ = [
    "IDX_FILES",
    "CLASS_NAMES",
    "FashionMNIST1024",
    "IMAGE_EXTENSIONS",
    "IdxImages",
    "ImageFolderDataset",
    "ImageFolderTokens",
    "find_idx_dir",
    "load_idx_split",
    "pad_to",
    "read_idx",
    "read_image_folder",
]

IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SYSTEM_DIRS: dict[str, list[str]] = {
    "fashion_mnist": ["/usr/share/datasets/fashion-mnist"],
    "mnist": ["/usr/share/datasets/mnist"],
}
HINTS: dict[str, str] = {
    "fashion_mnist": "install the Debian package: `sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist` "
    "(files land in /usr/share/datasets/fashion-mnist), or copy the four idx files",
    "mnist": "copy the four MNIST idx files",
}
_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an idx file (``.gz`` or raw) into a numpy array of its stored shape.

    Raises:
        MissingDataError: no such file.
        ValueError: a bad magic number or a size that does not match the header (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"idx file {path} not found")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise ValueError(f"{path}: not an idx file (magic bytes {raw[:4]!r})")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    dtype = np.dtype(_DTYPES[raw[2]])
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - offset != expected:
        raise ValueError(
            f"{path}: header says {dims} x {dtype.itemsize} bytes = {expected}, file has {len(raw) - offset}"
        )
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(dims).astype(dtype.newbyteorder("="))


def _find_file(d: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        if (d / name).is_file():
            return d / name
    return None


def find_idx_dir(dataset: str = "fashion_mnist", root: str | os.PathLike | None = None) -> Path:
    """The first directory holding all four idx files: ``root``, else the cache, else the system package's.

    Raises:
        MissingDataError: none found; the message says how to install them.
    """
    if dataset not in SYSTEM_DIRS:
        raise ValueError(f"dataset: expected one of {list(SYSTEM_DIRS)}, got {dataset!r}")
    cands = [Path(root)] if root is not None else [dataset_dir(dataset)] + [Path(p) for p in SYSTEM_DIRS[dataset]]
    for d in cands:
        if all(_find_file(d, stem) for pair in IDX_FILES.values() for stem in pair):
            return d
    names = ", ".join(f"{s}[.gz]" for pair in IDX_FILES.values() for s in pair)
    raise MissingDataError(
        f"{dataset}: idx files ({names}) not found in {', '.join(map(str, cands))}. To get them: {HINTS[dataset]} "
        f"into {dataset_dir(dataset)}. `primaldual data fetch {dataset}` checks and reports."
    )


def load_idx_split(
    split: str, dataset: str = "fashion_mnist", root: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(images (M, 28, 28) uint8, labels (M,) int64)`` of the ``"train"`` (60k) or ``"test"`` (10k) files."""
    if split not in IDX_FILES:
        raise ValueError(f"split: expected 'train' or 'test' (the idx files), got {split!r}")
    d = find_idx_dir(dataset, root)
    img_stem, lab_stem = IDX_FILES[split]
    images = read_idx(_find_file(d, img_stem))
    labels = read_idx(_find_file(d, lab_stem)).astype(np.int64)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"{d}: {split} images {images.shape} and labels {labels.shape} do not match")
    return images, labels


def pad_to(images: np.ndarray, size: int = 32) -> np.ndarray:
    """Zero-pad (M, H, W) images symmetrically to (M, size, size) (28 -> 32: 2 pixels on each side)."""
    m, h, w = images.shape
    if h > size or w > size:
        raise ValueError(f"images: {h}x{w} is larger than size={size}")
    top, left = (size - h) // 2, (size - w) // 2
    out = np.zeros((m, size, size), dtype=images.dtype)
    out[:, top : top + h, left : left + w] = images
    return out


SPLITS = ("train", "val", "test")


def _idx_split(
    split: str,
    dataset: str,
    root: str | os.PathLike | None,
    val_per_class: int,
    val_seed: int,
    *,
    with_train: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One split of the idx files by the rule of :class:`FashionMNIST1024` and :class:`IdxImages`.

    ``"test"`` is the 10k test files; ``"train"`` and ``"val"`` partition the 60k training files, ``"val"`` being
    ``val_per_class`` images of every class drawn by :func:`~primaldual.data.splits.stratified_split` with seed
    ``val_seed``.

    Returns:
        ``(images (M, H, W) uint8, labels (M,) int64, train_images)``; ``train_images`` is the train split's
        ``(M_train, H, W)`` uint8 images when ``with_train`` (for pixel statistics), else None.
    """
    if split not in SPLITS:
        raise ValueError(f"split: expected 'train', 'val' or 'test', got {split!r}")
    train_images = None
    if split != "test" or with_train:
        tr_x, tr_y = load_idx_split("train", dataset, root)
        keep, held = stratified_split(tr_y, per_class=val_per_class, seed=val_seed)
        train_images = tr_x[keep]
    if split == "test":
        images, labels = load_idx_split("test", dataset, root)
    elif split == "train":
        images, labels = train_images, tr_y[keep]
    else:
        images, labels = tr_x[held], tr_y[held]
    return images, labels, train_images if with_train else None


class FashionMNIST1024(Dataset):
    """Fashion-MNIST (or MNIST) as 1024 grey-level tokens: the LRA Image task's real stand-in.

    Items are tuples ``(tokens (1024,) int64 in 0-255, mask (1024,) bool all True, label int64)``, ready for
    :class:`~primaldual.models.SequenceClassifier` batches ``(tokens, mask, y)``.

    Args:
        split: ``"train"`` (55k), ``"val"`` (5k: 500 per class from the training files, seed ``val_seed``),
            ``"test"`` (10k).
        dataset: ``"fashion_mnist"`` or ``"mnist"``.
        root: directory of the idx files (default: cache, then the Debian package's directory).
        val_per_class: validation images per class.
        val_seed: seed of the validation draw (fixed so that the split is the same everywhere).
    """

    def __init__(
        self,
        split: str = "train",
        *,
        dataset: str = "fashion_mnist",
        root: str | os.PathLike | None = None,
        val_per_class: int = 500,
        val_seed: int = 0,
    ) -> None:
        images, labels, _ = _idx_split(split, dataset, root, val_per_class, val_seed)
        self.images = pad_to(images, 32).reshape(len(images), 1024)  # (M, 1024) row-major pixel tokens
        self.labels = labels
        self.info = {
            "dataset": dataset,
            "split": split,
            "source": f"real {dataset} idx files ({find_idx_dir(dataset, root)})",
            "stand_in_for": "LRA Image (CIFAR-10 grey), which primaldual does not download",
            "seq_len": 1024,
            "vocab_size": 256,
            "num_classes": 10,
            "size": len(labels),
            "val_split": f"{val_per_class} per class from the training files, seed {val_seed}",
        }

    vocab_size = 256
    num_classes = 10

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.from_numpy(self.images[i].astype(np.int64))  # (1024,)
        return tokens, torch.ones(1024, dtype=torch.bool), torch.tensor(self.labels[i])


CLASS_NAMES: dict[str, list[str]] = {
    "fashion_mnist": [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ],
    "mnist": [str(d) for d in range(10)],
}


def _pixel_stats(images: np.ndarray) -> tuple[float, float]:
    """Mean and (population) standard deviation in [0, 1] of uint8 pixels, exact from a 256-bin histogram."""
    counts = np.bincount(images.reshape(-1), minlength=256).astype(np.float64)  # (256,) pixels per grey level
    values = np.arange(256, dtype=np.float64) / 255.0
    n = counts.sum()
    mean = float((counts * values).sum() / n)
    std = float(np.sqrt((counts * (values - mean) ** 2).sum() / n))
    return round(mean, 4), round(std, 4)


class IdxImages(Dataset):
    """Fashion-MNIST (or MNIST) as grey images, for image classifiers (ViT) rather than pixel-token models.

    The split is :class:`FashionMNIST1024`'s (one shared helper): ``"train"`` 55k and ``"val"`` 5k (``val_per_class``
    images of every class drawn from the 60k training files with seed ``val_seed``), ``"test"`` the 10k test files.

    Items are ``(image (1, 28, 28) uint8 in 0-255, label int64 scalar)``; scaling and normalisation (``mean`` /
    ``std``) are left to the caller, on the batch.

    Attributes:
        images: ``(M, 1, 28, 28)`` uint8 array. labels: ``(M,)`` int64 array.
        classes: the 10 class names (label i is ``classes[i]``). num_classes, channels (1), image_size (28).
        mean, std: 1-tuples, the pixel statistics in [0, 1] of the *train* split selected by ``val_per_class`` /
            ``val_seed`` (whatever ``split`` is), rounded to 4 decimals (Fashion-MNIST: 0.286 / 0.353).
        info: dataset, split, source, size, val_split and the statistics, for run records.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"``.
        dataset: ``"fashion_mnist"`` or ``"mnist"``.
        root: directory of the four idx files (default: cache, then the Debian package's directory).
        val_per_class: validation images per class. val_seed: seed of the validation draw.

    Raises:
        MissingDataError: the idx files are not found (the message says how to install them).
        ValueError: a bad option, or idx images that are not 28 x 28.
    """

    channels = 1
    image_size = 28

    def __init__(
        self,
        split: str,
        *,
        dataset: str = "fashion_mnist",
        root: str | os.PathLike | None = None,
        val_per_class: int = 500,
        val_seed: int = 0,
    ) -> None:
        check_choice("split", split, SPLITS)
        check_choice("dataset", dataset, tuple(CLASS_NAMES))
        check_int("val_per_class", val_per_class, low=1)
        check_int("val_seed", val_seed, low=0)
        images, labels, train_images = _idx_split(split, dataset, root, val_per_class, val_seed, with_train=True)
        if images.shape[1:] != (28, 28):
            raise ValueError(f"{find_idx_dir(dataset, root)}: expected 28 x 28 idx images, got {images.shape[1:]}")
        self.images = np.ascontiguousarray(images.reshape(len(images), 1, 28, 28))  # (M, 28, 28) -> (M, 1, 28, 28)
        self.labels = labels
        self.classes = list(CLASS_NAMES[dataset])
        self.num_classes = len(self.classes)
        mean, std = _pixel_stats(train_images)
        self.mean, self.std = (mean,), (std,)
        self.info = {
            "dataset": dataset,
            "split": split,
            "source": f"real {dataset} idx files ({find_idx_dir(dataset, root)})",
            "num_classes": self.num_classes,
            "image_size": 28,
            "size": len(labels),
            "val_split": f"{val_per_class} per class from the training files, seed {val_seed}",
            "mean": self.mean,
            "std": self.std,
        }

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = torch.from_numpy(self.images[i].copy())  # (1, 28, 28) uint8, a copy: the dataset stays intact
        return image, torch.tensor(self.labels[i])


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def to_8bit(im: Any) -> Any:
    """A 16- or 32-bit integer grey image (``I;16``, ``I``: 16-bit PNGs) scaled to 8 bits, which Pillow's
    ``convert("L")`` would clip (almost white); any other image unchanged."""
    if not im.mode.startswith("I"):
        return im
    from PIL import Image

    arr = np.asarray(im, dtype=np.float64)
    top = 65535.0 if im.mode.startswith("I;16") or arr.max(initial=0) <= 65535 else float(arr.max())
    return Image.fromarray(np.clip(np.rint(arr * (255.0 / top)), 0, 255).astype(np.uint8), "L")


def _scan_image_folder(root: str | os.PathLike) -> tuple[list[Path], np.ndarray, list[str], list[Path]]:
    """:func:`read_image_folder`'s listing plus the skipped files (not an image extension, or not in a class)."""
    root = Path(root)
    if not root.is_dir():
        raise MissingDataError(f"image folder {root} not found: expected root/<class>/<image files>")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    # files beside the class folders, and dangling links (counted, not silently dropped)
    skipped = sorted(p for p in root.iterdir() if p.is_file() or (p.is_symlink() and not p.exists()))
    paths: list[Path] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        for p in sorted((root / c).rglob("*")):
            if not p.is_file():
                if p.is_symlink():  # a link to nothing
                    skipped.append(p)
                continue
            if p.suffix.lower() in IMAGE_EXTENSIONS:
                paths.append(p)
                labels.append(i)
            else:
                skipped.append(p)
    if not paths:
        raise MissingDataError(f"{root}: no images found in class sub-directories (extensions {IMAGE_EXTENSIONS})")
    return paths, np.asarray(labels, dtype=np.int64), classes, skipped


def read_image_folder(root: str | os.PathLike) -> tuple[list[Path], np.ndarray, list[str]]:
    """List an image-folder tree ``root/<class>/<image>`` (images found with ``rglob`` inside each class folder).

    Class folders are the non-hidden sub-directories of ``root``; files whose extension is not in
    :data:`IMAGE_EXTENSIONS` are left out.

    Returns:
        ``(paths, labels, classes)``: image paths in sorted order, int64 labels, class names (sorted; label i is
        ``classes[i]``).

    Raises:
        MissingDataError: ``root`` missing, or no class directory with images.
    """
    paths, labels, classes, _ = _scan_image_folder(root)
    return paths, labels, classes


def _image_error(err: Exception) -> str:
    """Pillow's reason for a bad file: the exception's type and message."""
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


class ImageFolderDataset(Dataset):
    """An ImageNet-style folder ``root/<class>/<image>`` decoded with Pillow, as ``(image uint8, label)``.

    Decoding follows timm / DeiT: ``convert(mode)``, resize the *shorter* side to
    ``resize = floor(image_size / crop_pct)`` (bicubic, as DeiT, the longer side scaled to ``int(resize * long / short)``
    as torchvision does), then a centre crop (offsets ``round((side - S) / 2)``):

    * ``train=True``: to ``resize x resize`` (S = resize); the training module does the random resized crop and
      flips from it on the batch.
    * ``train=False``: to ``image_size x image_size`` (S = image_size), DeiT's eval transform (resize 256, crop 224).

    Items are ``(image (C, S, S) uint8 in 0-255, label int64 scalar)`` with C = 3 for ``mode="RGB"`` and 1 for
    ``"L"``. No scaling or normalisation: the caller applies its statistics (ImageNet's) on the batch, so no
    ``mean`` / ``std`` are computed here.

    Policy for imperfect folders:

    * files whose extension is not in :data:`IMAGE_EXTENSIONS` (``notes.txt``, ``.DS_Store``), and files beside the
      class folders, are skipped and counted (``skipped``, ``info["skipped_files"]``); hidden directories of
      ``root`` are not classes;
    * a class folder without images is an error naming it (a class with no examples would silently change the
      label space);
    * a corrupt or unreadable image raises ``ValueError`` naming the file and Pillow's reason when it is read
      (``__getitem__``); :meth:`verify` finds such files up front.

    Args:
        root: ``root/<class>/<image>`` directory (e.g. ``imagenet/train``).
        image_size: the model's input side (>= 1).
        crop_pct: centre-crop fraction in (0, 1] (DeiT: 0.875, so 224 -> resize 256).
        train: keep the ``resize x resize`` centre square (train) instead of the ``image_size`` crop (eval).
        mode: Pillow mode, ``"RGB"`` (C = 3) or ``"L"`` (C = 1).
        classes: the class names label i stands for, e.g. the train split's ``classes`` when reading ``val/``: the
            folder must have exactly these class folders. Default: the sorted class folders.

    Attributes:
        paths, labels (``(M,)`` int64), classes, num_classes, channels, image_size, resize, skipped (paths),
        info (dataset, source, size, skipped_files, num_classes and the decoding options).

    Raises:
        MissingDataError: ``root`` missing or without images.
        ValueError / TypeError: a bad option (the message names it), a class folder without images, or class
            folders that differ from ``classes`` (the message names the missing and extra ones).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        image_size: int = 224,
        crop_pct: float = 0.875,
        train: bool = False,
        mode: str = "RGB",
        classes: Sequence[str] | None = None,
    ) -> None:
        check_int("image_size", image_size, low=1)
        crop_pct = check_number("crop_pct", crop_pct, low=0.0, high=1.0, low_open=True)
        check_bool("train", train)
        check_choice("mode", mode, ("RGB", "L"))
        root = Path(root)
        paths, labels, found, skipped = _scan_image_folder(root)
        counts = np.bincount(labels, minlength=len(found))  # (num_classes,) images per class folder
        if classes is not None:
            if isinstance(classes, str) or not all(isinstance(c, str) for c in classes):
                raise TypeError(f"classes: expected a list of class-name strings, got {classes!r}")
            classes = list(classes)
            if len(set(classes)) != len(classes):
                raise ValueError(f"classes: expected unique names, got duplicates in {classes}")
            missing, extra = sorted(set(classes) - set(found)), sorted(set(found) - set(classes))
            if missing or extra:
                raise ValueError(
                    f"{root}: class folders do not match classes= ({len(classes)} names, e.g. the train split's): "
                    f"missing folders {missing}, unexpected folders {extra}"
                )
            labels = np.asarray([classes.index(c) for c in found], dtype=np.int64)[labels]  # folder -> given order
        else:
            classes = found
        empty = [str(root / c) for c, n in zip(found, counts) if n == 0]
        if empty:
            raise ValueError(
                f"{root}: class folder(s) without images (extensions {IMAGE_EXTENSIONS}): {', '.join(empty)}; "
                "remove them or add images (an empty class would change the label space)"
            )
        self.root = root
        self.paths, self.labels, self.classes, self.skipped = paths, labels, classes, skipped
        self.num_classes = len(classes)
        self.mode = mode
        self.channels = 3 if mode == "RGB" else 1
        self.image_size, self.crop_pct, self.train = image_size, crop_pct, train
        self.resize = max(image_size, math.floor(image_size / crop_pct))  # timm: floor(224 / 0.875) = 256
        self.info = {
            "dataset": "image_folder",
            "source": str(root),
            "size": len(paths),
            "skipped_files": len(skipped),
            "num_classes": self.num_classes,
            "image_size": image_size,
            "resize": self.resize,
            "crop": f"centre {self.resize if train else image_size} of the shorter side resized to {self.resize}",
            "mode": mode,
        }

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        path = self.paths[i]
        try:
            with Image.open(path) as im:
                im = to_8bit(im).convert(self.mode)  # decodes the whole file: truncated data fails here
        except Exception as e:  # Pillow raises OSError, SyntaxError, struct.error, ... for bad files
            raise ValueError(f"{path}: cannot read the image ({_image_error(e)})") from e
        w, h = im.size
        short, long = min(w, h), max(w, h)
        new_long = int(self.resize * long / short)  # torchvision's rounding of the longer side
        size = (self.resize, new_long) if w <= h else (new_long, self.resize)  # Pillow (width, height)
        if size != (w, h):
            im = im.resize(size, Image.Resampling.BICUBIC)  # DeiT's resize is bicubic
        s = self.resize if self.train else self.image_size
        left, top = int(round((size[0] - s) / 2.0)), int(round((size[1] - s) / 2.0))
        im = im.crop((left, top, left + s, top + s))
        arr = np.asarray(im, dtype=np.uint8).reshape(s, s, self.channels)  # (S, S) or (S, S, C) -> (S, S, C)
        image = torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()  # (S, S, C) -> (C, S, S)
        return image, torch.tensor(self.labels[i])

    def verify(self, *, decode: bool = False) -> list[tuple[Path, str]]:
        """Pre-flight check: open every image and return ``[(path, reason)]`` for those Pillow cannot read.

        By default Pillow's ``Image.verify()`` (headers and, for PNG, checksums, without decoding pixels: a
        truncated JPEG can pass); ``decode=True`` also decodes every image, as ``__getitem__`` would (slower).
        """
        from PIL import Image

        bad: list[tuple[Path, str]] = []
        for path in self.paths:
            try:
                with Image.open(path) as im:
                    im.verify()
                if decode:
                    with Image.open(path) as im:
                        im.load()
            except Exception as e:  # any failure is a bad file, reported with Pillow's reason
                bad.append((path, _image_error(e)))
        return bad


class ImageFolderTokens(Dataset):
    """An image folder as grey-level pixel tokens, the LRA Image layout (e.g. a CIFAR-10 PNG export).

    Each image is converted to grey (Pillow ``"L"``), resized to ``side x side`` (bilinear; a no-op for 32 x 32
    CIFAR-10) and flattened row-major. Items ``(tokens (side*side,) int64 in 0-255, mask all True, label int64)``.

    Args:
        root: ``root/<class>/<image>`` directory (e.g. ``cifar10/train``). side: output side (LRA Image: 32).
    """

    vocab_size = 256

    def __init__(self, root: str | os.PathLike, side: int = 32) -> None:
        self.paths, self.labels, self.classes = read_image_folder(root)
        self.side = side
        self.num_classes = len(self.classes)
        self.info = {"dataset": "image_folder", "source": str(root), "seq_len": side * side, "size": len(self.paths)}

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            im = to_8bit(im).convert("L")
            if im.size != (self.side, self.side):
                im = im.resize((self.side, self.side), Image.Resampling.BILINEAR)
            arr = np.asarray(im, dtype=np.int64).reshape(-1)  # (side*side,) row-major
        tokens = torch.from_numpy(arr)
        return tokens, torch.ones_like(tokens, dtype=torch.bool), torch.tensor(self.labels[i])
