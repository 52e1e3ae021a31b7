"""UEA / UCR time-series classification data: the ``.ts`` reader, padding + masks, normalisation.

The ``.ts`` format (sktime / aeon / timeseriesclassification.com): ``#`` comment lines, ``@`` header lines
(``@problemName``, ``@dimensions``, ``@equalLength``, ``@classLabel true <labels...>``, ...), then ``@data``
followed by one case per line: channels separated by ``:``, values by ``,``, the class label last. Series may
have unequal lengths and missing values written ``?``.

Hand-written because the libraries that read ``.ts`` (aeon, sktime) pull in large dependency trees (numba,
scikit-learn, pandas) for a ~100-line parser, and because we want errors that name the file and line.

Choices (documented in ``docs/training.md``):

* channels of one case must all have the same length (else "ragged channels" error); cases may differ;
* missing values (``?``, ``NaN``) are read as NaN; after per-channel normalisation they are filled with 0,
  i.e. the training mean of that channel, and they stay *real* positions in the mask;
* normalisation statistics (mean / std per channel over every observed time step) are fitted on the training
  cases only and applied unchanged to validation and test cases;
* series are right-padded with zeros to a common length; the mask is ``(M, L)`` bool, True = real step.

Datasets load by name from ``<root>/<Name>/<Name>_TRAIN.ts`` and ``<Name>_TEST.ts`` (or directly from
``<root>/<Name>_TRAIN.ts``), never "the first ``.ts`` file found": one of the reference scripts trained on the
test split of SpokenArabicDigits that way.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .cache import MissingDataError, data_root

__all__ = [
    "UEA_DATASETS",
    "ChannelNormalizer",
    "TSDataset",
    "TSFormatError",
    "find_uea_files",
    "load_uea",
    "pad_series",
    "read_ts",
    "uea_cache_dir",
]

# The ten multivariate datasets of the Primal-Attention / Flowformer UEA benchmark.
UEA_DATASETS: tuple[str, ...] = (
    "EthanolConcentration",
    "FaceDetection",
    "Handwriting",
    "Heartbeat",
    "JapaneseVowels",
    "PEMS-SF",
    "SelfRegulationSCP1",
    "SelfRegulationSCP2",
    "SpokenArabicDigits",
    "UWaveGestureLibrary",
)

_MISSING = {"?", "nan", "NaN", "NAN"}
_FLOAT32_MAX = float(np.finfo(np.float32).max)  # values are stored as float32: larger ones would become inf


class TSFormatError(ValueError):
    """A malformed ``.ts`` file; the message names the file and the 1-based line number."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


@dataclass
class TSDataset:
    """The cases of one ``.ts`` file.

    Attributes:
        series: one float32 array ``(L_i, C)`` per case (NaN = missing value).
        labels: ``(M,)`` int64 indices into ``class_names``.
        class_names: the labels of the ``@classLabel`` header, in header order.
        problem_name: the ``@problemName`` header (or the file stem).
        path: the file it was read from.
    """

    series: list[np.ndarray]
    labels: np.ndarray
    class_names: list[str]
    problem_name: str
    path: Path
    header: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.series)

    @property
    def num_channels(self) -> int:
        return self.series[0].shape[1]

    @property
    def max_length(self) -> int:
        return max(s.shape[0] for s in self.series)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def _parse_bool(path: Path, lineno: int, tag: str, value: str) -> bool:
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise TSFormatError(path, lineno, f"@{tag} expects true or false, got {value.strip()!r}")
    return v == "true"


def read_ts(path: str | os.PathLike, class_names: list[str] | None = None) -> TSDataset:
    """Read a classification ``.ts`` file.

    Args:
        path: the file.
        class_names: expected label set (e.g. the TRAIN file's, when reading TEST); the file's
            ``@classLabel`` set must equal it (same order), so that label indices agree across splits.

    Returns:
        A :class:`TSDataset`.

    Raises:
        TSFormatError: naming the file and line, for a missing or malformed header, ragged channels, a wrong
            channel count, an empty channel, non-numeric, infinite or float32-overflowing values (|x| > 3.4e38),
            labels outside the ``@classLabel`` set, or time-stamped data; naming the file and channel for a channel
            with no observed value in any case.
        FileNotFoundError: the file does not exist.
    """
    path = Path(path)
    header: dict[str, str] = {}
    labels_decl: list[str] | None = None
    dims: int | None = None
    in_data = False
    series: list[np.ndarray] = []
    labels: list[int] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if not in_data:
                if not line.startswith("@"):
                    raise TSFormatError(path, lineno, f"expected a @ header line or @data, got {line[:40]!r}")
                tag, _, value = line[1:].partition(" ")
                tag = tag.lower()
                if tag == "data":
                    if labels_decl is None:
                        raise TSFormatError(path, lineno, "@data before any '@classLabel true ...' header")
                    in_data = True
                elif tag == "classlabel":
                    parts = value.split()
                    if not parts or not _parse_bool(path, lineno, "classLabel", parts[0]):
                        raise TSFormatError(
                            path, lineno, "'@classLabel false' (regression / unlabelled data) is not supported"
                        )
                    labels_decl = parts[1:]
                    if not labels_decl or len(set(labels_decl)) != len(labels_decl):
                        raise TSFormatError(path, lineno, f"@classLabel needs distinct labels, got {labels_decl}")
                elif tag == "timestamps":
                    if _parse_bool(path, lineno, "timeStamps", value):
                        raise TSFormatError(path, lineno, "time-stamped series (@timeStamps true) are not supported")
                elif tag == "dimensions":
                    try:
                        dims = int(value)
                    except ValueError:
                        raise TSFormatError(path, lineno, f"@dimensions expects an integer, got {value!r}") from None
                elif tag == "targetlabel":
                    raise TSFormatError(path, lineno, "@targetLabel (regression) files are not supported")
                header[tag] = value.strip()
                continue
            # A case: ch1:ch2:...:label
            parts = line.split(":")
            label, chans = parts[-1].strip(), parts[:-1]
            if not chans:
                raise TSFormatError(path, lineno, "a case needs at least one channel before the label")
            if label not in labels_decl:  # type: ignore[operator]
                raise TSFormatError(
                    path, lineno, f"label {label!r} is not in the @classLabel set {labels_decl} of the header"
                )
            if dims is None:
                dims = len(chans)
            if len(chans) != dims:
                raise TSFormatError(path, lineno, f"case has {len(chans)} channels, expected {dims}")
            rows = []
            for c, text in enumerate(chans):
                if not text.strip():
                    raise TSFormatError(path, lineno, f"channel {c} is empty (write missing values as '?')")
                vals = []
                for tok in text.split(","):
                    tok = tok.strip()
                    if tok in _MISSING:
                        vals.append(math.nan)
                        continue
                    try:
                        v = float(tok)
                    except ValueError:
                        raise TSFormatError(
                            path, lineno, f"channel {c}: non-numeric value {tok[:30]!r} (missing values are '?')"
                        ) from None
                    if math.isinf(v):
                        raise TSFormatError(path, lineno, f"channel {c}: infinite value {tok!r}")
                    if abs(v) > _FLOAT32_MAX:
                        raise TSFormatError(
                            path, lineno, f"channel {c}: value {tok[:30]!r} overflows float32 (|x| > 3.4e38)"
                        )
                    vals.append(v)
                rows.append(vals)
            lengths = {len(r) for r in rows}
            if len(lengths) != 1:
                raise TSFormatError(
                    path, lineno, f"ragged channels: channel lengths {[len(r) for r in rows]} differ within one case"
                )
            series.append(np.asarray(rows, dtype=np.float32).T.copy())  # (C, L) -> (L, C)
            labels.append(labels_decl.index(label))  # type: ignore[union-attr]
    if not in_data:
        raise TSFormatError(path, None, "no @data line: not a .ts file")
    if not series:
        raise TSFormatError(path, None, "no cases after @data")
    observed = np.zeros(series[0].shape[1], dtype=bool)
    for x in series:
        observed |= ~np.isnan(x).all(axis=0)
    if not observed.all():
        empty = np.flatnonzero(~observed).tolist()
        raise TSFormatError(path, None, f"channel(s) {empty} have no observed value in any case (every value is '?')")
    assert labels_decl is not None
    if class_names is not None and list(class_names) != labels_decl:
        raise TSFormatError(
            path, None, f"@classLabel set {labels_decl} differs from the expected (training) set {list(class_names)}"
        )
    return TSDataset(
        series=series,
        labels=np.asarray(labels, dtype=np.int64),
        class_names=labels_decl,
        problem_name=header.get("problemname", path.stem),
        path=path,
        header=header,
    )


def uea_cache_dir(name: str) -> Path:
    """Where a fetched UEA dataset is cached: ``$PRIMALDUAL_DATA/uea/<Name>`` (default ``~/.cache/primaldual``)."""
    return data_root() / "uea" / name


def find_uea_files(name: str, root: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Locate ``<Name>_TRAIN.ts`` and ``<Name>_TEST.ts`` by exact name.

    Looks in ``root/<Name>/`` and ``root/`` when ``root`` is given, else in the cache (:func:`uea_cache_dir`).

    Raises:
        MissingDataError: the files are not there; the message says how to obtain them.
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name: expected a dataset name such as 'JapaneseVowels', got {name!r}")
    dirs = [Path(root).expanduser() / name, Path(root).expanduser()] if root is not None else [uea_cache_dir(name)]
    for d in dirs:
        train, test = d / f"{name}_TRAIN.ts", d / f"{name}_TEST.ts"
        if train.is_file() and test.is_file():
            return train, test
    looked = " and ".join(str(d) for d in dirs)
    how = (
        "run `primaldual data fetch uea JapaneseVowels` (it extracts the official files from the aeon wheel on PyPI; `primaldual fit` "
        "does this by itself unless data.fetch is false)"
        if name == "JapaneseVowels"
        else f"download {name} from https://www.timeseriesclassification.com (Multivariate_ts archive) and point "
        f"data.root at the folder holding {name}_TRAIN.ts and {name}_TEST.ts"
    )
    raise MissingDataError(f"UEA dataset {name!r}: {name}_TRAIN.ts / {name}_TEST.ts not found in {looked}; {how}")


def load_uea(name: str, root: str | os.PathLike | None = None) -> tuple[TSDataset, TSDataset]:
    """Load the TRAIN and TEST splits of a UEA dataset by name (label indices agree across the two)."""
    train_path, test_path = find_uea_files(name, root)
    train = read_ts(train_path)
    test = read_ts(test_path, class_names=train.class_names)
    if test.num_channels != train.num_channels:
        raise TSFormatError(
            test_path, None, f"{test.num_channels} channels, but the TRAIN file has {train.num_channels}"
        )
    return train, test


class ChannelNormalizer:
    """Per-channel standardisation fitted on training series only (NaN-aware).

    ``fit`` takes the mean and std of each channel over every observed (non-NaN) time step of every training
    case; ``transform`` standardises and fills missing values with 0 (the training mean).
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None

    def fit(self, series: list[np.ndarray], source: str | None = None) -> ChannelNormalizer:
        """series: arrays ``(L_i, C)``; ``source`` (e.g. the file they came from) is named in errors."""
        allv = np.concatenate(series, axis=0).astype(np.float64)  # (sum L_i, C)
        empty = np.flatnonzero(np.isnan(allv).all(axis=0)).tolist()
        if empty:
            where = f"{source}: " if source else ""
            raise ValueError(
                f"{where}channel(s) {empty} have no observed value in the {len(series)} training cases; "
                "cannot normalise them"
            )
        self.mean = np.nanmean(allv, axis=0)
        std = np.nanstd(allv, axis=0)
        self.std = np.where(std > self.eps, std, 1.0)  # constant channels are only centred
        return self

    def transform(self, series: list[np.ndarray]) -> list[np.ndarray]:
        if self.mean is None or self.std is None:
            raise RuntimeError("ChannelNormalizer.transform called before fit")
        out = []
        for s in series:
            z = ((s.astype(np.float64) - self.mean) / self.std).astype(np.float32)
            out.append(np.nan_to_num(z, nan=0.0))
        return out


def pad_series(series: list[np.ndarray], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad ``(L_i, C)`` arrays with zeros to ``(M, length, C)``; mask ``(M, length)`` bool, True = real."""
    if not series:
        raise ValueError("series: expected at least one case")
    c = series[0].shape[1]
    x = np.zeros((len(series), length, c), dtype=np.float32)
    mask = np.zeros((len(series), length), dtype=bool)
    for i, s in enumerate(series):
        n = s.shape[0]
        if n > length:
            raise ValueError(f"case {i} has length {n} > padded length {length}")
        x[i, :n] = s
        mask[i, :n] = True
    return x, mask
