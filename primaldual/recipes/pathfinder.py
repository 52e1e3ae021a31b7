"""Pathfinder (Long-Range Arena) generator: vectorised and seeded, written in the layout the reader expects.

Each 32 x 32 grey image shows dashed curved paths and two square markers. The label is 1 when both markers sit on
the two ends of the same path, 0 when they sit on ends of two different paths. Flattened row by row, an image is a
sequence of 1024 pixel tokens (values 0-255).

How an image is drawn (many images at once, all in numpy):

* A path is a chain of ``contour_length`` dashes of ``dash_length`` pixels separated by ``gap`` pixels; the
  direction turns by at most ``max_turn`` radians from one dash to the next (bounded curvature). The difficulty
  is set by ``contour_length`` (LRA's hard level uses 14). Walks that leave the image are redrawn.
* Every image has two target paths, whatever its label, so ink alone does not reveal the label. A positive image
  puts the markers on both ends of path 0; a negative one on one end of path 0 and one end of path 1. Markers
  closer than ``min_marker_distance`` are redrawn, so a marker pair is never trivially adjacent.
* The two targets (markers included) are kept more than 2 pixels apart (Chebyshev distance), and distractor dashes
  that come within 2 pixels of a target are dropped. Consecutive dashes of one path are at most 2 pixels apart
  (``gap`` <= 1.5), so "the markers are joined by ink with gaps of at most one empty pixel" is exactly the label:
  the task is well posed, and the tests check the labels that way on the image itself.
* ``num_distractors`` shorter paths (``distractor_length`` dashes) add clutter. Labels are exactly balanced in every
  chunk of images.

The generator also returns a ground-truth record (:class:`PathfinderRecord`: which path owns each pixel, marker
positions and the path each marker is on) for tests and inspection.

Seeding: chunk ``i`` of a run draws from ``SeedSequence(seed).spawn(...)[i]``, so a dataset is the same whatever
the number of worker processes.

Hand-written because no maintained library generates Pathfinder; the original generator (Linsley et al., 2018) is
a slow per-image script, and the LRA data needs 200k images. This version draws whole chunks of images with array
operations.

Files written by :func:`write_pathfinder`: ``{split}_images.npy`` (M, 32, 32) uint8, ``{split}_labels.npy`` (M,)
int64, ``{split}_markers.npy`` (M, 2, 2) int16 (row, col), ``metadata.json``, ``contact_sheet.png``; they (and the
real LRA release) are read by :class:`primaldual.data.pathfinder.PathfinderDataset`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..data.cache import dataset_dir
from ..data.pathfinder import PATHFINDER_SPLITS
from ..utils.io import atomic_dir

__all__ = [
    "GENERATOR",
    "PathfinderConfig",
    "PathfinderRecord",
    "contact_sheet",
    "generate_pathfinder",
    "write_pathfinder",
]

INK = 255
# The module moved from primaldual.data.pathfinder; the identifier written into metadata.json keeps its old name so
# that existing generated data stays valid (the drawing and the random streams are unchanged).
GENERATOR = "primaldual.data.pathfinder v1"


@dataclass(frozen=True)
class PathfinderConfig:
    """Generation settings.

    Args:
        size: image side in pixels.
        contour_length: dashes per target path (difficulty: 6 easy, 9 medium, 14 hard).
        dash_length: length of a dash in pixels.
        gap: gap between dashes in pixels (at most 1.5: after rounding to pixels, consecutive dashes are then at
            most 2 pixels apart, i.e. separated by at most one empty pixel).
        max_turn: largest change of direction between consecutive dashes, radians.
        num_distractors: distractor paths per image.
        distractor_length: dashes per distractor path.
        marker_size: side of the square markers in pixels (odd).
        min_marker_distance: smallest Chebyshev distance between the two marker centres.
    """

    size: int = 32
    contour_length: int = 14
    dash_length: float = 1.0
    gap: float = 1.5
    max_turn: float = math.pi / 5
    num_distractors: int = 4
    distractor_length: int = 4
    marker_size: int = 3
    min_marker_distance: int = 6

    def __post_init__(self) -> None:
        if self.size < 12:
            raise ValueError(f"size: expected >= 12, got {self.size}")
        if self.contour_length < 2 or self.distractor_length < 1:
            raise ValueError("contour_length: expected >= 2 and distractor_length >= 1")
        if not 0 < self.gap <= 1.5:
            raise ValueError(f"gap: expected in (0, 1.5] so that a path stays joined, got {self.gap}")
        if self.dash_length <= 0 or not 0 <= self.max_turn <= math.pi:
            raise ValueError("dash_length: expected > 0; max_turn: expected in [0, pi]")
        if self.marker_size < 1 or self.marker_size % 2 == 0:
            raise ValueError(f"marker_size: expected an odd positive int, got {self.marker_size}")
        if self.num_distractors < 0:
            raise ValueError(f"num_distractors: expected >= 0, got {self.num_distractors}")


@dataclass
class PathfinderRecord:
    """Ground truth kept by the generator, for M images.

    Attributes:
        path_map: (M, S, S) int8: -1 background, 0 / 1 the target paths (markers included), 2+ distractors.
        markers: (M, 2, 2) int16 marker centres (row, col).
        marker_paths: (M, 2) int8 the target path each marker sits on.
    """

    path_map: np.ndarray
    markers: np.ndarray
    marker_paths: np.ndarray


def _walks(
    rng: np.random.Generator, m: int, n_dash: int, cfg: PathfinderConfig, margin: int, give_up: int | None = None
) -> np.ndarray:
    """Draw ``m`` in-bounds dashed walks; returns dash end points (m, n_dash, 2, 2) as (dash, start/end, row/col).

    Each turn is uniform in [-max_turn, max_turn]; when two more dashes in the new direction would leave the image,
    the walk turns towards the image centre instead (by at most max_turn). Walks that leave anyway are redrawn.
    """
    lo, hi = margin, cfg.size - 1 - margin
    centre = (cfg.size - 1) / 2.0
    step = cfg.dash_length + cfg.gap
    out = np.empty((0, n_dash, 2, 2))
    acc = 0.5  # running estimate of the share of walks that stay inside, to size each batch of draws
    barren = 0  # consecutive batches without one walk inside: the settings cannot be met, so stop rather than hang
    while len(out) < m:
        k = min(int((m - len(out)) / acc * 1.2) + 64, 400_000)
        p = rng.uniform(lo, hi, (k, 2))  # (k, 2) current point (row, col)
        theta = rng.uniform(0, 2 * math.pi, k)  # (k,) heading
        seg = np.empty((k, n_dash, 2, 2))
        d = np.stack([np.sin(theta), np.cos(theta)], axis=-1)  # (k, 2) current direction
        for i in range(n_dash):
            if i:
                turn = rng.uniform(-cfg.max_turn, cfg.max_turn, k)
                # Look two dashes ahead so that the walk starts turning before it reaches the border.
                nxt = p + 2 * step * np.stack([np.sin(theta + turn), np.cos(theta + turn)], axis=-1)
                out_of = ((nxt < lo) | (nxt > hi)).any(axis=1)
                # Steer: the bounded turn whose heading is closer to the direction of the centre.
                to_c = np.arctan2(centre - p[:, 0], centre - p[:, 1])
                diff = np.angle(np.exp(1j * (to_c - theta)))  # (k,) in (-pi, pi]
                turn = np.where(out_of, np.clip(diff, -cfg.max_turn, cfg.max_turn), turn)
                theta = theta + turn
                p = p + cfg.gap * d  # the gap continues the previous dash's direction
                d = np.stack([np.sin(theta), np.cos(theta)], axis=-1)  # (k, 2)
            seg[:, i, 0] = p
            p = p + cfg.dash_length * d
            seg[:, i, 1] = p
        ok = ((seg >= lo) & (seg <= hi)).all(axis=(1, 2, 3))
        acc = max(float(ok.mean()), 0.01)
        out = np.concatenate([out, seg[ok]])
        barren = 0 if ok.any() else barren + 1
        if barren >= (give_up or _GIVE_UP):
            raise ValueError(_impossible(cfg, n_dash, f"none of {barren} batches of walks stayed inside the image"))
    return out[:m]


_GIVE_UP = 20  # batches in a row without progress before the settings are reported as impossible
_PROBE_SEED = 0x5A7F1DE  # the feasibility probe's own stream


def _impossible(cfg: PathfinderConfig, n_dash: int, why: str) -> str:
    return (
        f"contour_length / distractor_length: {n_dash} dashes of {cfg.dash_length:g} + {cfg.gap:g} px do not fit a "
        f"{cfg.size} x {cfg.size} image with these settings ({why}); use fewer dashes or a larger --size"
    )


def _dash_pixels(seg: np.ndarray, cfg: PathfinderConfig) -> np.ndarray:
    """Pixel (row, col) of points sampled every <= 0.5 px along each dash: (..., 2, 2) -> (..., K, 2) int."""
    k = int(math.ceil(cfg.dash_length * 2)) + 1
    t = np.linspace(0.0, 1.0, k)[:, None]  # (K, 1)
    pts = seg[..., 0:1, :] + t * (seg[..., 1:2, :] - seg[..., 0:1, :])  # (..., K, 2)
    return np.rint(pts).astype(np.int64)


def _paint(canvas: np.ndarray, pix: np.ndarray, value: np.ndarray | int) -> None:
    """Set ``canvas[b, r, c] = value`` for pixels ``pix`` (M, ..., 2) of image b; canvas (M, S, S)."""
    m, s = canvas.shape[0], canvas.shape[1]
    flat = canvas.reshape(m, s * s)  # (M, S*S) view
    idx = (pix[..., 0] * s + pix[..., 1]).reshape(m, -1)  # (M, P)
    rows = np.broadcast_to(np.arange(m)[:, None], idx.shape)
    flat[rows, idx] = value if np.isscalar(value) else np.broadcast_to(value, idx.shape)


def _dilate(mask: np.ndarray, r: int) -> np.ndarray:
    """Chebyshev dilation by ``r`` pixels of (M, S, S) bool masks."""
    s = mask.shape[1]
    pad = np.pad(mask, ((0, 0), (r, r), (r, r)))  # (M, S+2r, S+2r)
    out = np.zeros_like(mask)
    for dr in range(2 * r + 1):
        for dc in range(2 * r + 1):
            out |= pad[:, dr : dr + s, dc : dc + s]
    return out


def _square(centres: np.ndarray, half: int) -> np.ndarray:
    """Pixels of squares of side 2*half+1 around centres (..., 2) -> (..., (2*half+1)**2, 2)."""
    d = np.arange(-half, half + 1)
    offs = np.stack(np.meshgrid(d, d, indexing="ij"), axis=-1).reshape(-1, 2)  # (Q, 2)
    return centres[..., None, :] + offs


def _chunk(
    seed_seq: np.random.SeedSequence, n: int, cfg: PathfinderConfig, give_up: int | None = None
) -> tuple[np.ndarray, np.ndarray, PathfinderRecord]:
    """Generate ``n`` images (labels exactly balanced up to one)."""
    rng = np.random.default_rng(seed_seq)
    s, half = cfg.size, cfg.marker_size // 2
    labels = rng.permutation(np.arange(n) % 2)  # (n,)
    targets = np.empty((n, 2, cfg.contour_length, 2, 2))
    markers = np.empty((n, 2, 2), dtype=np.int64)
    ends = rng.integers(0, 2, (n, 2))  # which end of each target carries a marker in a negative image
    todo = np.arange(n)
    acc = 0.2  # running estimate of the share of candidate pairs that are kept
    barren = 0  # consecutive rounds that placed no image: the settings cannot be met, so stop rather than hang
    while len(todo):
        reps = int(min(math.ceil(1.5 / acc), max(1, 200_000 // len(todo))))
        cand = np.repeat(todo, reps)  # (m,) image index of each candidate
        m = len(cand)
        seg = _walks(rng, 2 * m, cfg.contour_length, cfg, margin=half, give_up=give_up)
        seg = seg.reshape(m, 2, cfg.contour_length, 2, 2)  # (m, 2 paths, dashes, start/end, row/col)
        first = np.rint(seg[:, :, 0, 0, :]).astype(np.int64)  # (m, 2 paths, 2): start of each path
        last = np.rint(seg[:, :, -1, 1, :]).astype(np.int64)  # (m, 2, 2): end of each path
        both = np.stack([first, last], axis=2)  # (m, 2 paths, 2 ends, 2)
        pos = labels[cand] == 1
        mk = np.where(
            pos[:, None, None],
            both[:, 0],  # positive: both ends of path 0
            np.stack([both[np.arange(m), 0, ends[cand, 0]], both[np.arange(m), 1, ends[cand, 1]]], axis=1),
        )  # (m, 2 markers, 2)
        # Ink of each target with its own markers; targets must stay > 2 px apart.
        ink = np.zeros((m, 2, s, s), dtype=bool)
        for p in range(2):
            _paint(ink[:, p], _dash_pixels(seg[:, p], cfg), True)
        marker_owner = np.where(pos[:, None], 0, np.array([0, 1]))  # (m, 2)
        ink_flat = ink.reshape(m, 2 * s * s)  # (m, 2*S*S) view: path-major
        for j in range(2):
            sq = _square(mk[:, j], half)  # (m, Q, 2)
            idx = marker_owner[:, j : j + 1] * (s * s) + sq[..., 0] * s + sq[..., 1]  # (m, Q)
            ink_flat[np.arange(m)[:, None], idx] = True
        apart = ~(_dilate(ink[:, 0], 2) & ink[:, 1]).any(axis=(1, 2))
        far = np.abs(mk[:, 0] - mk[:, 1]).max(axis=1) >= cfg.min_marker_distance
        good = apart & far
        acc = max(float(good.mean()), 0.002)
        # The first kept candidate of each pending image (candidates of one image are consecutive).
        won, first = np.unique(cand[good], return_index=True)
        pick = np.flatnonzero(good)[first]
        targets[won] = seg[pick]
        markers[won] = mk[pick]
        todo = np.setdiff1d(todo, won)
        barren = 0 if len(won) else barren + 1
        if barren >= (give_up or _GIVE_UP):
            why = "no two separated target paths with markers far enough apart were found"
            raise ValueError(_impossible(cfg, cfg.contour_length, why))

    # Rasterise targets and markers, with a path map as ground truth.
    path_map = np.full((n, s, s), -1, dtype=np.int8)
    for p in range(2):
        _paint(path_map, _dash_pixels(targets[:, p], cfg), p)
    owner = np.where(labels[:, None] == 1, 0, np.array([0, 1])).astype(np.int8)  # (n, 2)
    for j in range(2):
        _paint(path_map, _square(markers[:, j], half), owner[:, j : j + 1])
    forbidden = _dilate(path_map >= 0, 2)  # (n, s, s): distractors keep > 2 px away from targets

    if cfg.num_distractors:
        d = cfg.num_distractors
        dseg = _walks(rng, n * d, cfg.distractor_length, cfg, margin=0).reshape(n, d, cfg.distractor_length, 2, 2)
        pix = _dash_pixels(dseg, cfg)  # (n, d, L_d, K, 2)
        hit = forbidden[np.arange(n)[:, None, None, None], pix[..., 0], pix[..., 1]].any(axis=-1)  # (n, d, L_d)
        ids = np.broadcast_to((2 + np.arange(d, dtype=np.int8))[None, :, None, None], pix.shape[:-1])
        # Dropped dashes paint nothing: redirect them to a dummy column that is cut off afterwards.
        flat = np.pad(path_map.reshape(n, s * s), ((0, 0), (0, 1)), constant_values=-1)  # (n, s*s + 1)
        idx = np.where(hit[..., None], s * s, pix[..., 0] * s + pix[..., 1]).reshape(n, -1)  # (n, P)
        flat[np.arange(n)[:, None], idx] = ids.reshape(n, -1)
        path_map = np.ascontiguousarray(flat[:, : s * s]).reshape(n, s, s)  # (n, s, s)

    images = np.where(path_map >= 0, INK, 0).astype(np.uint8)  # (n, s, s)
    record = PathfinderRecord(path_map=path_map, markers=markers.astype(np.int16), marker_paths=owner)
    return images, labels.astype(np.int64), record


def generate_pathfinder(
    n: int,
    *,
    seed: int = 0,
    config: PathfinderConfig = PathfinderConfig(),
    chunk_size: int = 2000,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, PathfinderRecord]:
    """Generate ``n`` Pathfinder images.

    Args:
        n: number of images.
        seed: seed; with the same ``seed``, ``n``, ``config`` and ``chunk_size`` the output is identical for any
            ``workers``.
        config: generation settings.
        chunk_size: images drawn together (labels are exactly balanced within each chunk).
        workers: processes (1 = in this process).
        progress: called with the number of images finished after each chunk.

    Returns:
        ``(images, labels, record)``: images (n, S, S) uint8, labels (n,) int64 in {0, 1}, the ground truth.
    """
    if n < 0 or chunk_size < 1 or workers < 1:
        raise ValueError(
            f"n, chunk_size, workers: expected n >= 0 and positive others, got {n}, {chunk_size}, {workers}"
        )
    if n:  # settings that admit no image fail here in seconds (its own random stream: the output is unchanged)
        _chunk(np.random.SeedSequence(_PROBE_SEED), 8, config, give_up=3)
    sizes = [min(chunk_size, n - i) for i in range(0, n, chunk_size)]
    seqs = np.random.SeedSequence(seed).spawn(len(sizes))
    results = []
    if workers == 1:
        for sq, k in zip(seqs, sizes):
            results.append(_chunk(sq, k, config))
            if progress is not None:
                progress(k)
    else:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            for k, res in zip(sizes, ex.map(_chunk, seqs, sizes, [config] * len(sizes))):
                results.append(res)
                if progress is not None:
                    progress(k)
    s = config.size
    if not results:
        empty = PathfinderRecord(np.zeros((0, s, s), np.int8), np.zeros((0, 2, 2), np.int16), np.zeros((0, 2), np.int8))
        return np.zeros((0, s, s), np.uint8), np.zeros(0, np.int64), empty
    images = np.concatenate([r[0] for r in results])
    labels = np.concatenate([r[1] for r in results])
    record = PathfinderRecord(
        path_map=np.concatenate([r[2].path_map for r in results]),
        markers=np.concatenate([r[2].markers for r in results]),
        marker_paths=np.concatenate([r[2].marker_paths for r in results]),
    )
    return images, labels, record


def contact_sheet(
    images: np.ndarray, labels: np.ndarray, path: str | os.PathLike, *, cols: int = 8, scale: int = 4
) -> Path:
    """Save a PNG grid of images, each framed green (label 1, same path) or red (label 0).

    Args:
        images: (M, S, S) uint8 grey images.
        labels: (M,) labels in {0, 1}.
        path: output PNG path (written atomically).
        cols: images per row.
        scale: nearest-neighbour upscaling factor.
    """
    from PIL import Image

    from ..utils.io import atomic_write_bytes

    m, s = images.shape[0], images.shape[1]
    rows = max(1, math.ceil(m / cols))
    cell, frame = s * scale + 4, 2
    sheet = np.full((rows * cell, cols * cell, 3), 64, dtype=np.uint8)
    for i in range(m):
        r, c = divmod(i, cols)
        y, x = r * cell, c * cell
        colour = (40, 200, 40) if labels[i] == 1 else (220, 40, 40)
        sheet[y : y + cell, x : x + cell] = colour
        big = np.kron(images[i], np.ones((scale, scale), dtype=np.uint8))  # (S*scale, S*scale)
        sheet[y + frame : y + frame + s * scale, x + frame : x + frame + s * scale] = big[..., None]
    import io

    buf = io.BytesIO()
    Image.fromarray(sheet).save(buf, format="PNG")
    return atomic_write_bytes(path, buf.getvalue())


def write_pathfinder(
    out_dir: str | os.PathLike | None = None,
    sizes: dict[str, int] | None = None,
    *,
    seed: int = 0,
    config: PathfinderConfig = PathfinderConfig(),
    workers: int = 1,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Generate Pathfinder splits and write them atomically, with metadata and a contact sheet.

    Args:
        out_dir: target directory (default ``<cache>/pathfinder32_L{contour_length}``).
        sizes: images per split (default 160k/20k/20k: LRA's 200k split 80/10/10).
        seed: seed; each split draws from its own child seed.
        config: generation settings.
        workers: worker processes.
        overwrite: replace an existing directory.
        progress: called with the number of images finished.

    Returns:
        The directory written.
    """
    out_dir = Path(out_dir) if out_dir is not None else dataset_dir(f"pathfinder{config.size}_L{config.contour_length}")
    sizes = dict(sizes or {"train": 160000, "val": 20000, "test": 20000})
    bad = set(sizes) - set(PATHFINDER_SPLITS)
    if bad:
        raise ValueError(f"sizes: unknown split(s) {sorted(bad)}; expected keys among {list(PATHFINDER_SPLITS)}")
    split_seeds = dict(zip(PATHFINDER_SPLITS, np.random.SeedSequence(seed).spawn(len(PATHFINDER_SPLITS))))
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        meta: dict = {
            "dataset": "pathfinder",
            "source": "generated (synthetic by design)",
            "generator": GENERATOR,
            "seed": seed,
            "config": asdict(config),
            "splits": {},
        }
        sheet = None
        for split, k in sizes.items():
            child = int(split_seeds[split].generate_state(1)[0])
            images, labels, rec = generate_pathfinder(k, seed=child, config=config, workers=workers, progress=progress)
            np.save(tmp / f"{split}_images.npy", images)
            np.save(tmp / f"{split}_labels.npy", labels)
            np.save(tmp / f"{split}_markers.npy", rec.markers)
            meta["splits"][split] = {"size": int(k), "positives": int(labels.sum())}
            if sheet is None and k:
                sheet = (images[:64], labels[:64])
        if sheet is not None:
            contact_sheet(sheet[0], sheet[1], tmp / "contact_sheet.png")
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out_dir
