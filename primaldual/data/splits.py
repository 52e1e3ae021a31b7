"""Seeded, stratified splits of labelled examples (numpy only).

One function, :func:`stratified_split`, carves a held-out part from every class of a label vector. It serves the
UEA validation split (``data.val_fraction`` of TRAIN), the validation split of LRA datasets that ship without one,
and the 500-per-class validation images of :class:`~primaldual.data.images.FashionMNIST1024`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["stratified_split"]


def stratified_split(
    labels: np.ndarray, fraction: float | None = None, seed: int = 0, *, per_class: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Split example indices into ``(keep, held)``, stratified by class, with a seeded draw.

    Give exactly one of ``fraction`` and ``per_class``:

    * ``fraction`` in (0, 1): ``round(fraction * n_c)`` examples of every class (at least 1, at most ``n_c - 1``)
      are held out; a class with a single example stays in ``keep``. Per class the held examples are the first
      ones of ``rng.permutation`` of its indices.
    * ``per_class``: exactly ``per_class`` examples of every class are held out (``rng.choice`` without
      replacement); a class with fewer is an error.

    Classes are visited in increasing label order with one ``numpy.random.default_rng(seed)`` stream, so a
    (labels, size, seed) triple always gives the same split. The two ways of sizing draw differently; both are kept
    as they are because existing run directories and results depend on their splits.

    Args:
        labels: ``(M,)`` integer labels.
        fraction: held-out share per class. seed: numpy seed.
        per_class: held-out examples per class.

    Returns:
        Sorted int64 index arrays ``(keep_idx, held_idx)`` that partition ``range(M)``.

    Raises:
        ValueError: both or neither of ``fraction`` / ``per_class``, a fraction outside (0, 1), or a class with fewer
            than ``per_class`` examples.
    """
    labels = np.asarray(labels)
    if (fraction is None) == (per_class is None):
        raise ValueError("stratified_split: give exactly one of fraction and per_class")
    if fraction is not None and not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if per_class is not None:
            if len(idx) < per_class:
                raise ValueError(f"labels: class {c} has {len(idx)} examples < per_class={per_class}")
            held.append(rng.choice(idx, per_class, replace=False))
            continue
        if len(idx) < 2:
            continue  # a singleton class stays in keep
        k = min(max(1, round(fraction * len(idx))), len(idx) - 1)
        held.append(rng.permutation(idx)[:k])
    held_idx = np.sort(np.concatenate(held)).astype(np.int64) if held else np.zeros(0, dtype=np.int64)
    keep_idx = np.setdiff1d(np.arange(len(labels)), held_idx)
    return keep_idx, held_idx
