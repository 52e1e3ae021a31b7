"""Datasets: readers of standard formats and generic transforms (UEA time series, Long-Range Arena tasks, images,
text, D4RL); the code that builds datasets (generators, corpus builders) is :mod:`primaldual.recipes`.

Only the UEA reader and the stratified splitter are re-exported here; the other dataset modules are imported by their full path
(``primaldual.data.listops`` ...) so that importing this package stays cheap.
"""

from .splits import stratified_split
from .uea import (
    UEA_DATASETS,
    ChannelNormalizer,
    TSDataset,
    TSFormatError,
    find_uea_files,
    load_uea,
    pad_series,
    read_ts,
    uea_cache_dir,
)

__all__ = [
    "UEA_DATASETS",
    "ChannelNormalizer",
    "TSDataset",
    "TSFormatError",
    "find_uea_files",
    "load_uea",
    "pad_series",
    "read_ts",
    "stratified_split",
    "uea_cache_dir",
]
