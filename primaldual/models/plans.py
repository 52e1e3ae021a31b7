"""PrimalFormer and Primal.+ as per-layer attention plans for :class:`primaldual.Encoder` and task models.

* **PrimalFormer**: every attention layer is Primal-Attention, with the KSVD loss;
* **Primal.+X** (Primal.+Trans., Primal.+DeiT, Primal.+DT): baseline X with only the last attention layer
  primal (generalised here: any chosen set of layers), with the KSVD loss on those layers.

A plan is a dict ``{"attention": [names], "attention_options": [dicts or None]}`` of ``depth`` entries, so
``Encoder(dim, depth, heads, **primalformer(depth, s=20, eta=0.1))`` builds the model and every task model
that takes ``attention`` / ``attention_options`` takes a plan the same way. The KSVD term is then
``primaldual.collect_aux_loss(model)`` = ``eta * mean over the primal layers of J_l^2``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..attention.registry import attention_options

__all__ = ["primal_plus", "primalformer"]


def _check_primal_options(opts: dict[str, Any]) -> dict[str, Any]:
    valid = attention_options("primal")
    unknown = sorted(set(opts) - set(valid))
    if unknown:
        raise TypeError(f"unknown primal option(s) {unknown}; valid options: {', '.join(sorted(valid))}")
    return dict(opts)


def primalformer(depth: int, **primal_options: Any) -> dict[str, list]:
    """Every layer primal.

    Args:
        depth: number of attention layers.
        **primal_options: options of the ``primal`` attention (``s``, ``rank_multi``, ``eta``, ``max_len``, ...).

    Returns:
        ``{"attention": ["primal"] * depth, "attention_options": [options] * depth}``.
    """
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int, got {depth!r}")
    opts = _check_primal_options(primal_options)
    return {"attention": ["primal"] * depth, "attention_options": [dict(opts) for _ in range(depth)]}


def primal_plus(
    depth: int,
    base: str = "softmax",
    primal_layers: Iterable[int] = (-1,),
    base_options: dict[str, Any] | None = None,
    **primal_options: Any,
) -> dict[str, list]:
    """The baseline ``base`` with the layers in ``primal_layers`` replaced by Primal-Attention.

    Args:
        depth: number of attention layers.
        base: registry name of the baseline attention (``"softmax"`` for Primal.+Trans.).
        primal_layers: indices of the primal layers (negative counts from the end; default the last one).
        base_options: options of the baseline layers.
        **primal_options: options of the primal layers.

    Returns:
        ``{"attention": [...], "attention_options": [...]}`` of ``depth`` entries.
    """
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int, got {depth!r}")
    attention_options(base)  # unknown base -> KeyError listing the registered names
    chosen = set()
    for i in primal_layers:
        if not isinstance(i, int) or not -depth <= i < depth:
            raise ValueError(f"primal_layers entries must be ints in [-{depth}, {depth}), got {i!r}")
        chosen.add(i % depth)
    if not chosen:
        raise ValueError("primal_layers is empty: use the baseline itself, or primalformer() for all layers")
    opts = _check_primal_options(primal_options)
    names = ["primal" if i in chosen else base for i in range(depth)]
    options = [dict(opts) if i in chosen else (dict(base_options) if base_options else None) for i in range(depth)]
    return {"attention": names, "attention_options": options}
