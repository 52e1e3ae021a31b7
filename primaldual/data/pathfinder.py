"""Pathfinder (Long-Range Arena): the release-layout reader and a torch Dataset.

Each 32 x 32 grey image shows dashed curved paths and two square markers. The label is 1 when both markers sit on
the two ends of the same path, 0 when they sit on ends of two different paths. Flattened row by row, an image is a
sequence of 1024 pixel tokens (values 0-255).

:class:`PathfinderDataset` reads either the files of :func:`primaldual.recipes.pathfinder.write_pathfinder` (the
generator): ``{split}_images.npy`` (M, 32, 32) uint8, ``{split}_labels.npy`` (M,) int64, ``{split}_markers.npy``
(M, 2, 2) int16 (row, col), ``metadata.json``, ``contact_sheet.png``; or the real LRA release
(``lra_release/pathfinder32/curv_contour_length_14/``: ``metadata/<k>.npy`` lists and ``imgs/<k>/sample_<n>.png``),
read by :func:`read_pathfinder_release`. Every ``.npy`` is read with ``allow_pickle=False``: a file holding pickled
objects is refused (unpickling could run code from it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .cache import MissingDataError, dataset_dir
from .npy import load_npy

__all__ = ["PATHFINDER_SPLITS", "PathfinderDataset", "read_pathfinder_release"]

PATHFINDER_SPLITS: tuple[str, ...] = ("train", "val", "test")

FETCH_HINT = (
    "Generate it with `primaldual data generate pathfinder` (160k/20k/20k, seeded), or point root= at the LRA "
    "release directory lra_release/pathfinder32/curv_contour_length_14 (with metadata/*.npy and imgs/)"
)


def _metadata_rows(path: Path) -> list[list[str]]:
    """The rows of one release metadata file: text lines of space-separated fields (the LRA release's format,
    despite the ``.npy`` suffix), or a real ``.npy`` string array (read without pickle)."""
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        return [[str(x) for x in row] for row in np.atleast_2d(load_npy(path))]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: neither a .npy array nor text lines 'dir file _ label ...'") from None
    return [line.split() for line in text.splitlines() if line.strip()]


def read_pathfinder_release(
    root: str | os.PathLike, split: str | None = None, *, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> tuple[np.ndarray, np.ndarray]:
    """Read the LRA Pathfinder release layout.

    ``root`` holds ``metadata/<k>.npy`` (in the release, text lines of space-separated fields despite the suffix:
    image sub-directory, file name, ..., label in column 3; a real ``.npy`` string array is read too, never a
    pickled one) and the PNGs they name. The metadata files, sorted by number, are split by file into train / val /
    test with ``fractions`` (80/10/10 by default, the LRA split sizes); ``split=None`` returns everything.

    Args:
        root: the ``curv_contour_length_*`` directory.
        split: ``"train"``, ``"val"``, ``"test"`` or ``None``.
        fractions: shares of metadata files per split.

    Returns:
        ``(images, labels)``: (M, S, S) uint8 and (M,) int64.

    Raises:
        MissingDataError: no metadata, or an image it names is missing. ValueError: naming the file (and row) of a
            malformed or pickled metadata file or a bad label.
    """
    from PIL import Image

    root = Path(root)
    meta_dir = root / "metadata"
    files = sorted(meta_dir.glob("*.npy"), key=lambda p: (len(p.stem), p.stem)) if meta_dir.is_dir() else []
    if not files:
        raise MissingDataError(f"no Pathfinder metadata/*.npy under {root}. " + FETCH_HINT)
    if split is not None:
        if split not in PATHFINDER_SPLITS:
            raise ValueError(f"split: expected one of {PATHFINDER_SPLITS} or None, got {split!r}")
        cuts = np.rint(np.cumsum((0.0,) + tuple(fractions)) / sum(fractions) * len(files)).astype(int)
        i = PATHFINDER_SPLITS.index(split)
        files = files[cuts[i] : cuts[i + 1]]
    images, labels = [], []
    for f in files:
        for j, row in enumerate(_metadata_rows(f)):
            if len(row) < 4:
                raise ValueError(f"{f}: row {j} has {len(row)} fields; expected >= 4 (dir, file, _, label, ...)")
            img_path = root / str(row[0]) / str(row[1])
            if not img_path.is_file():
                raise MissingDataError(f"{f}: row {j} names {img_path}, which does not exist. " + FETCH_HINT)
            try:
                label = int(float(row[3]))
            except ValueError:
                raise ValueError(f"{f}: row {j}: label {row[3]!r} is not a number") from None
            with Image.open(img_path) as im:
                images.append(np.asarray(im.convert("L"), dtype=np.uint8))
            labels.append(label)
    if not images:
        raise ValueError(f"{root}: split {split!r} has no images (too few metadata files for the fractions)")
    return np.stack(images), np.asarray(labels, dtype=np.int64)


class PathfinderDataset(Dataset):
    """Pathfinder images as sequences of pixel tokens.

    Items are tuples ``(tokens (S*S,) int64 pixel values 0-255 row-major, mask (S*S,) bool all True, label int64)``.

    Args:
        root: a directory written by :func:`primaldual.recipes.pathfinder.write_pathfinder` or the LRA release directory (detected by its
            ``metadata/`` folder). Default: ``<cache>/pathfinder32_L14``.
        split: ``"train"``, ``"val"`` or ``"test"``.
    """

    def __init__(self, root: str | os.PathLike | None = None, split: str = "train") -> None:
        if split not in PATHFINDER_SPLITS:
            raise ValueError(f"split: expected one of {PATHFINDER_SPLITS}, got {split!r}")
        root = Path(root) if root is not None else dataset_dir("pathfinder32_L14")
        if (root / "metadata").is_dir():
            images, labels = read_pathfinder_release(root, split)
            source = "LRA release files"
        else:
            img_file = root / f"{split}_images.npy"
            if not img_file.is_file():
                raise MissingDataError(f"Pathfinder split {split!r} not found at {img_file}. " + FETCH_HINT)
            images = load_npy(img_file)
            labels = load_npy(root / f"{split}_labels.npy")
            source = "generated"
        self.images = images.reshape(len(images), -1)  # (M, S*S) row-major pixel tokens
        self.labels = labels
        self.info = {
            "dataset": "pathfinder",
            "split": split,
            "source": source,
            "seq_len": int(self.images.shape[1]),
            "vocab_size": 256,
            "num_classes": 2,
            "size": len(labels),
        }

    @property
    def vocab_size(self) -> int:
        return 256

    @property
    def num_classes(self) -> int:
        return 2

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.from_numpy(self.images[i].astype(np.int64))  # (S*S,)
        return tokens, torch.ones_like(tokens, dtype=torch.bool), torch.tensor(self.labels[i])
