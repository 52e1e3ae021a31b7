"""A real forward and backward pass through every registered attention, with shapes and timings.

Run as ``primaldual smoke``. It builds each mechanism at a small width, runs forward + backward on
random padded input (including its auxiliary loss, if any) and prints one table row per mechanism.
"""

from __future__ import annotations

import time

import torch

from ..attention.registry import build_attention, list_attentions
from ..aux_loss import collect_aux_loss

__all__ = ["format_rows", "smoke"]


def smoke(batch: int = 4, length: int = 512, dim: int = 64, heads: int = 4, repeats: int = 3) -> list[dict]:
    """Time forward and forward+backward of every registered attention; returns one dict per row.

    Raises:
        ValueError: a size below 1 (``--batch``, ``--length``, ``--dim``, ``--heads``, ``--repeats``)."""
    from ..options import check_int

    for flag, value in (("--batch", batch), ("--length", length), ("--dim", dim), ("--heads", heads)):
        check_int(flag, value, low=1)
    check_int("--repeats", repeats, low=1)
    x = torch.randn(batch, length, dim)
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[-1, length // 2 :] = False
    rows = []
    for info in list_attentions():
        for causal in (False, True):
            caps = info.capabilities
            if (causal and not caps.causal) or (not causal and not caps.non_causal):
                continue
            layer = build_attention(info.name, dim, heads, causal=causal)
            fwd, bwd = [], []
            for _ in range(repeats):
                xi = x.clone().requires_grad_(True)
                t0 = time.perf_counter()
                out = layer(xi, mask)
                t1 = time.perf_counter()
                aux = collect_aux_loss(layer)
                loss = out.square().mean() + (aux if aux is not None else 0.0)
                loss.backward()
                t2 = time.perf_counter()
                fwd.append(t1 - t0)
                bwd.append(t2 - t0)
            rows.append(
                {
                    "attention": info.name,
                    "causal": causal,
                    "in": tuple(x.shape),
                    "out": tuple(out.shape),
                    "aux_loss": None if aux is None else float(aux.detach()),
                    "fwd_ms": 1e3 * sorted(fwd)[len(fwd) // 2],
                    "fwd_bwd_ms": 1e3 * sorted(bwd)[len(bwd) // 2],
                    "finite": bool(torch.isfinite(out).all() and torch.isfinite(xi.grad).all()),
                }
            )
    return rows


def format_rows(rows: list[dict]) -> str:
    """The rows of :func:`smoke` as a fixed-width text table."""
    head = f"{'attention':<16}{'causal':<8}{'input':<16}{'output':<16}{'fwd ms':>9}{'fwd+bwd ms':>12}  finite"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['attention']:<16}{str(r['causal']):<8}{str(r['in']):<16}{str(r['out']):<16}"
            f"{r['fwd_ms']:>9.2f}{r['fwd_bwd_ms']:>12.2f}  {r['finite']}"
        )
    return "\n".join(lines)
