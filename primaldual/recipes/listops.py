"""ListOps (Long-Range Arena) generator: seeded expressions from the public rules, written in the release's layout.

An expression is a tree of operators over the digits 0-9, written in prefix form with a closing bracket::

    [MAX 2 9 [MIN 4 7 ] 0 ]          -> 9

Operators: ``MIN``, ``MAX``, ``MED`` (the median; for an even count the mean of the two middle values rounded
down, as the public generator's ``int(median)``), ``SM`` (sum modulo 10). The label is the expression's value
(10 classes).

Generation rules (those of the public LRA generator, re-implemented from their description): every node below
the maximum depth is an operator with probability ``operator_prob`` = 0.25 (else a digit leaf), nodes at
``max_depth`` = 10 are leaves, an operator takes 2 to 10 arguments drawn uniformly, and a tree is kept only if its
token count (operators, digits and closing brackets) is strictly between 500 and 2000. Trees are drawn until the
requested number of distinct expressions is reached (deduplicated across all splits, so no test expression is in
train). Since a tree whose root is a digit is always rejected, the root is drawn as an operator directly; this
leaves the distribution of kept trees unchanged and saves most of the rejected draws.

:func:`write_listops` writes ``basic_train.tsv``, ``basic_val.tsv``, ``basic_test.tsv`` (header
``Source<TAB>Target``, the names and layout of the LRA release) and ``metadata.json`` (rules, seed, sizes, label
histogram); :mod:`primaldual.data.listops` reads them (and the release files), tokenises and serves them.

The generator is hand-written: no maintained library produces ListOps, and the tree recursion is a few lines.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..data.cache import dataset_dir
from ..data.listops import LISTOPS_SPLITS, OPERATORS, TOKENISATIONS
from ..utils.io import atomic_dir

__all__ = ["GENERATOR", "ListOpsConfig", "generate_expression", "generate_listops", "write_listops"]

# The module moved from primaldual.data.listops; the identifier written into metadata.json keeps its old name so
# that existing generated data stays valid (the rules and the random stream are unchanged).
GENERATOR = "primaldual.data.listops v1"


@dataclass(frozen=True)
class ListOpsConfig:
    """Generation rules (defaults: the public LRA generator's).

    Args:
        operator_prob: probability that a node below ``max_depth`` is an operator.
        max_depth: depth of the deepest node (the root is depth 1); nodes there are digits.
        min_args: fewest arguments of an operator.
        max_args: most arguments of an operator.
        min_length: kept trees have strictly more tokens than this.
        max_length: kept trees have strictly fewer tokens than this.
    """

    operator_prob: float = 0.25
    max_depth: int = 10
    min_args: int = 2
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2000

    def __post_init__(self) -> None:
        if not 0.0 < self.operator_prob < 1.0:
            raise ValueError(f"operator_prob: expected a probability in (0, 1), got {self.operator_prob}")
        if self.max_depth < 2:
            raise ValueError(f"max_depth: expected >= 2, got {self.max_depth}")
        if not 1 <= self.min_args <= self.max_args:
            raise ValueError(
                f"min_args/max_args: expected 1 <= min_args <= max_args, got {self.min_args}, {self.max_args}"
            )
        if not 0 <= self.min_length < self.max_length - 1:
            raise ValueError(
                f"min_length/max_length: expected 0 <= min_length < max_length - 1, got {self.min_length}, {self.max_length}"
            )


def _apply(op: str, args: list[int]) -> int:
    if op == "MIN":
        return min(args)
    if op == "MAX":
        return max(args)
    if op == "SM":
        return sum(args) % 10
    s = sorted(args)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2


class _TooLong(Exception):
    pass


def generate_expression(rng: random.Random, config: ListOpsConfig = ListOpsConfig()) -> tuple[list[str], int] | None:
    """Draw one tree (root is an operator); return ``(tokens, value)`` or ``None`` if its length is out of range.

    Args:
        rng: the random source (``random.Random(seed)``: reproducible across platforms).
        config: generation rules.

    Returns:
        The tokens (with ``]``) and the expression's value, or ``None`` when the token count is not strictly
        between ``config.min_length`` and ``config.max_length`` (drawing stops as soon as it is too long).
    """
    out: list[str] = []
    limit = config.max_length

    def node(depth: int, force_op: bool) -> int:
        if not force_op and (depth >= config.max_depth or rng.random() >= config.operator_prob):
            d = rng.randrange(10)
            out.append(str(d))
            if len(out) >= limit:
                raise _TooLong
            return d
        op = OPERATORS[rng.randrange(len(OPERATORS))]
        n_args = rng.randint(config.min_args, config.max_args)
        out.append("[" + op)
        args = [node(depth + 1, False) for _ in range(n_args)]
        out.append("]")
        if len(out) >= limit:
            raise _TooLong
        return _apply(op, args)

    try:
        value = node(1, True)
    except _TooLong:
        return None
    if len(out) <= config.min_length:
        return None
    return out, value


def generate_listops(
    sizes: dict[str, int] | None = None,
    *,
    seed: int = 0,
    config: ListOpsConfig = ListOpsConfig(),
    progress: Callable[[int], None] | None = None,
) -> dict[str, list[tuple[str, int]]]:
    """Generate distinct ListOps expressions and split them.

    Args:
        sizes: examples per split (default ``{"train": 96000, "val": 2000, "test": 2000}``).
        seed: seed of the single ``random.Random`` stream; the same seed and sizes give the same data.
        config: generation rules.
        progress: called with the number of new kept examples after each one (for a progress bar).

    Returns:
        ``{split: [(source, label), ...]}`` with sources as space-separated tokens (brackets included).
    """
    sizes = dict(sizes or {"train": 96000, "val": 2000, "test": 2000})
    for k, v in sizes.items():
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"sizes[{k!r}]: expected a non-negative int, got {v!r}")
    total = sum(sizes.values())
    rng = random.Random(seed)
    seen: set[str] = set()
    examples: list[tuple[str, int]] = []
    while len(examples) < total:
        drawn = generate_expression(rng, config)
        if drawn is None:
            continue
        source = " ".join(drawn[0])
        if source in seen:
            continue
        seen.add(source)
        examples.append((source, drawn[1]))
        if progress is not None:
            progress(1)
    # Splits are consecutive slices of one stream of distinct expressions, so they never overlap.
    out: dict[str, list[tuple[str, int]]] = {}
    start = 0
    for split, n in sizes.items():
        out[split] = examples[start : start + n]
        start += n
    return out


def write_listops(
    out_dir: str | os.PathLike | None = None,
    sizes: dict[str, int] | None = None,
    *,
    seed: int = 0,
    config: ListOpsConfig = ListOpsConfig(),
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Generate ListOps and write ``basic_{split}.tsv`` + ``metadata.json`` atomically into ``out_dir``.

    Args:
        out_dir: target directory (default: ``<cache>/listops``).
        sizes: examples per split; keys must be ``train``, ``val``, ``test`` (any subset).
        seed: generator seed.
        config: generation rules.
        overwrite: replace an existing directory.
        progress: see :func:`generate_listops`.

    Returns:
        The directory written.
    """
    out_dir = Path(out_dir) if out_dir is not None else dataset_dir("listops")
    sizes = dict(sizes or {"train": 96000, "val": 2000, "test": 2000})
    bad = set(sizes) - set(LISTOPS_SPLITS)
    if bad:
        raise ValueError(f"sizes: unknown split(s) {sorted(bad)}; expected keys among {list(LISTOPS_SPLITS)}")
    splits = generate_listops(sizes, seed=seed, config=config, progress=progress)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        meta: dict = {
            "dataset": "listops",
            "source": "generated (synthetic by design; public LRA rules)",
            "generator": GENERATOR,
            "seed": seed,
            "rules": asdict(config),
            "operators": list(OPERATORS),
            "median_rule": "floor of the median (mean of the two middle values for an even count)",
            "length_unit": "tokens including operators, digits and closing brackets",
            "tokenisations": list(TOKENISATIONS),
            "splits": {},
        }
        for split, rows in splits.items():
            lines = ["Source\tTarget"] + [f"{src}\t{label}" for src, label in rows]
            (tmp / LISTOPS_SPLITS[split]).write_text("\n".join(lines) + "\n", encoding="utf-8")
            lengths = [src.count(" ") + 1 for src, _ in rows]
            meta["splits"][split] = {
                "file": LISTOPS_SPLITS[split],
                "size": len(rows),
                "label_counts": np.bincount([lab for _, lab in rows], minlength=10).tolist(),
                "length_min": min(lengths, default=0),
                "length_max": max(lengths, default=0),
                "length_mean": float(np.mean(lengths)) if lengths else 0.0,
            }
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out_dir
