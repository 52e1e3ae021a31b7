"""``primaldual export RUN --format hf``: the language model of a trained run as a transformers model directory
(:func:`~primaldual.integrations.hf.export.save_hf` on the run's checkpoint, with its tokenizer for byte-level BPE
runs)."""

from __future__ import annotations

import os
from pathlib import Path

from .training import load_run_lm

__all__ = ["export_run"]


def export_run(run_dir: str | os.PathLike, out: str | os.PathLike, *, ckpt: str = "best", force: bool = False) -> Path:
    """Write the language model of the run ``run_dir`` (checkpoint ``ckpt``: ``best``, ``last`` or a path) at ``out``.

    Raises:
        FileNotFoundError: not a run directory, or no such checkpoint. ValueError: not a ``model.kind: lm`` run.
        FileExistsError: ``out`` holds files of someone else's, or an earlier export without ``force``.
        ImportError: transformers is not installed (the ``hf`` extra).
    """
    from ...integrations.hf.export import save_hf

    lm, cfg, tok = load_run_lm(run_dir, ckpt, what="primaldual export writes")
    m = cfg.model
    kwargs = {**m.backbone_kwargs(), "positions": m.positions, "tie_embeddings": m.tie_embeddings}
    record = {"run_dir": str(Path(run_dir).resolve()), "checkpoint": ckpt}
    return save_hf(lm, out, kwargs, tokenizer_file=tok.path if tok.kind == "bpe" else None, record=record, force=force)
