"""Reading ``.deb`` files (the inputs of the English corpus) with ``python-debian``.

``debian.debfile.DebFile`` reads the ``ar`` container, opens the ``control.tar.*`` / ``data.tar.*`` members
(gzip, bzip2, xz, or zstd through the ``unzstd`` program) and parses the ``control`` file (deb822); only the error
translation and the path normalisation (``./usr/...`` -> ``usr/...``) are written here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...data.cache import MissingDataError
from ...utils.io import sha256_file

__all__ = ["DebInfo", "deb_info", "iter_deb_files"]


@dataclass(frozen=True)
class DebInfo:
    """A ``.deb`` file: package name and version (from its ``control`` file), SHA-256 and path."""

    package: str
    version: str
    sha256: str
    path: Path

    def record(self) -> dict[str, Any]:
        return {"package": self.package, "version": self.version, "deb_file": self.path.name, "deb_sha256": self.sha256}


def _open(path: Path):
    """``DebFile(path)``; every failure to open it is one ``ValueError`` naming the file."""
    try:
        from debian.arfile import ArError
        from debian.debfile import DebFile
    except ImportError:
        raise MissingDataError(
            "reading .deb files needs python-debian: `pip install python-debian` (in the data extra)"
        ) from None
    try:
        return DebFile(str(path))
    except (ArError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a Debian package ({e})") from None


def _part_error(path: Path, part: str, e: Exception) -> Exception:
    if "unzstd" in str(e):  # python-debian decompresses .tar.zst members with the unzstd program
        return MissingDataError(f"{path}: its {part}.tar.zst member needs the `unzstd` program (apt-get install zstd)")
    return ValueError(f"{path}: unreadable {part}.tar.* member ({e})")


def deb_info(path: str | os.PathLike) -> DebInfo:
    """Package name, version and SHA-256 of a ``.deb`` file."""
    from debian.arfile import ArError

    path = Path(path)
    deb = _open(path)
    try:
        fields = deb.debcontrol()
    except (ArError, OSError, EOFError) as e:
        raise _part_error(path, "control", e) from None
    finally:
        deb.close()
    if "Package" not in fields or "Version" not in fields:
        raise ValueError(f"{path}: no Package / Version in the control file")
    return DebInfo(fields["Package"], fields["Version"], sha256_file(path), path)


def iter_deb_files(path: str | os.PathLike, select: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """``(path, content)`` of the regular files of a ``.deb`` whose path (``usr/...``, no leading ``./``) is
    selected, in archive order. Links and directories are skipped."""
    from debian.arfile import ArError

    path = Path(path)
    deb = _open(path)
    try:
        try:
            tar = deb.data.tgz()
        except (ArError, OSError, EOFError) as e:
            raise _part_error(path, "data", e) from None
        for m in tar:
            raw = str(m.name)  # python-debian's names compare equal with or without "./"; use the plain string
            name = raw[2:] if raw.startswith("./") else raw.lstrip("/")
            if m.isfile() and select(name):
                yield name, tar.extractfile(m).read()
    finally:
        deb.close()
