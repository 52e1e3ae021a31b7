"""Reading ``.npy`` files a user can point at: never unpickled, and every failure a ``ValueError`` naming the file.

``np.load(allow_pickle=False)`` already refuses object arrays, but its messages name no file and suggest loading the
file unsafely; a truncated or empty file surfaces as ``EOFError`` or an ``mmap`` error. :func:`load_npy` turns each
into one message that says which file and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

__all__ = ["load_npy"]


def load_npy(path: Path, mmap_mode: Literal["r"] | None = None) -> np.ndarray:
    """``np.load(path, allow_pickle=False, mmap_mode=...)``; a pickled (object) array or a malformed file is a
    ``ValueError`` naming it (a missing one stays ``FileNotFoundError``)."""
    try:
        arr = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except FileNotFoundError:
        raise
    except ValueError as e:
        if "allow_pickle" in str(e) or "Python objects" in str(e):
            raise ValueError(
                f"{path}: refused to load: it holds pickled Python objects, which are never unpickled (that could "
                "run code from the file); expected a plain numeric or string array"
            ) from None
        raise ValueError(f"{path}: not a readable .npy file ({e})") from None
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: not a readable .npy file ({e})") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        raise ValueError(f"{path}: not a .npy file (an .npz archive of several arrays)")
    return arr
