"""Image data: the idx reader (Fashion-MNIST / MNIST), the LRA-style 1024-token image task, and an image-folder reader.

* :func:`read_idx` reads the idx format of MNIST-family files (gzip-compressed or raw): a 4-byte magic number
  (two zero bytes, a type code, the number of dimensions), big-endian int32 sizes, then the data.
* :class:`FashionMNIST1024` is a stand-in for the LRA Image task (CIFAR-10 is not downloaded by primaldual):
  real Fashion-MNIST, 28 x 28 grey images zero-padded (2 pixels each side) to 32 x 32 = 1024 pixel tokens, 10
  classes, split 55k train / 5k val / 10k test. The validation images are 500 per class drawn from the 60k
  training files with a fixed seed (stratified), so the split is the same on every machine. The same class reads
  real MNIST idx files (``dataset="mnist"``), since the formats are identical.
* :func:`read_image_folder` / :class:`ImageFolderDataset` read the ImageNet-style layout ``root/<class>/<image>``
  with Pillow (no torchvision), class indices in sorted directory order.

Fashion-MNIST comes from the Debian package ``dataset-fashion-mnist`` (files in /usr/share/datasets/fashion-mnist);
``$PRIMALDUAL_DATA/fashion_mnist`` (or ``~/.cache/primaldual/fashion_mnist``) is searched first, so any copy of the
four standard idx files can be used. The idx parser is a few lines of numpy, hand-written because the only
maintained readers (torchvision, tensorflow-datasets) are heavy dependencies this package does not require.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .cache import MissingDataError, dataset_dir
from .splits import stratified_split

__all__ = [
    "IDX_FILES",
    "FashionMNIST1024",
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
        if split not in ("train", "val", "test"):
            raise ValueError(f"split: expected 'train', 'val' or 'test', got {split!r}")
        images, labels = load_idx_split("test" if split == "test" else "train", dataset, root)
        if split != "test":
            keep, held = stratified_split(labels, per_class=val_per_class, seed=val_seed)
            sel = keep if split == "train" else held
            images, labels = images[sel], labels[sel]
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


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def read_image_folder(root: str | os.PathLike) -> tuple[list[Path], np.ndarray, list[str]]:
    """List an image-folder tree ``root/<class>/<image>``.

    Returns:
        ``(paths, labels, classes)``: image paths in sorted order, int64 labels, class names (sorted; label i is
        ``classes[i]``).

    Raises:
        MissingDataError: ``root`` missing, or no class directory with images.
    """
    root = Path(root)
    if not root.is_dir():
        raise MissingDataError(f"image folder {root} not found: expected root/<class>/<image files>")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    paths: list[Path] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        for p in sorted((root / c).rglob("*")):
            if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS:
                paths.append(p)
                labels.append(i)
    if not paths:
        raise MissingDataError(f"{root}: no images found in class sub-directories (extensions {IMAGE_EXTENSIONS})")
    return paths, np.asarray(labels, dtype=np.int64), classes


class ImageFolderDataset(Dataset):
    """ImageNet-style image folder read with Pillow, resized to a square, as ``(image (C, S, S) float, label)``.

    Pixels are scaled to [0, 1] and normalised with ``mean`` / ``std`` per channel (the ImageNet statistics by
    default), matching what a ViT-style classifier expects.

    Args:
        root: ``root/<class>/<image>`` directory (e.g. ``imagenet/train``).
        image_size: output side S (bilinear resize of the whole image).
        mode: Pillow mode, ``"RGB"`` (C = 3) or ``"L"`` (C = 1).
        mean, std: per-channel normalisation.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        image_size: int = 224,
        mode: str = "RGB",
        mean: tuple[float, ...] = (0.485, 0.456, 0.406),
        std: tuple[float, ...] = (0.229, 0.224, 0.225),
    ) -> None:
        if mode not in ("RGB", "L"):
            raise ValueError(f"mode: expected 'RGB' or 'L', got {mode!r}")
        channels = 3 if mode == "RGB" else 1
        if len(mean) != channels or len(std) != channels:
            mean, std = (mean[0],) * channels, (std[0],) * channels
        self.paths, self.labels, self.classes = read_image_folder(root)
        self.image_size, self.mode = image_size, mode
        self.mean = torch.tensor(mean).view(-1, 1, 1)  # (C, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)  # (C, 1, 1)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            im = im.convert(self.mode).resize((self.image_size, self.image_size), Image.Resampling.BILINEAR)
            arr = np.asarray(im, dtype=np.float32) / 255.0
        x = torch.from_numpy(arr.reshape(self.image_size, self.image_size, -1)).permute(
            2, 0, 1
        )  # (S, S, C) -> (C, S, S)
        return (x - self.mean) / self.std, torch.tensor(self.labels[i])


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
            im = im.convert("L")
            if im.size != (self.side, self.side):
                im = im.resize((self.side, self.side), Image.Resampling.BILINEAR)
            arr = np.asarray(im, dtype=np.int64).reshape(-1)  # (side*side,) row-major
        tokens = torch.from_numpy(arr)
        return tokens, torch.ones_like(tokens, dtype=torch.bool), torch.tensor(self.labels[i])
