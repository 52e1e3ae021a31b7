"""Auxiliary losses that layers contribute without changing any model's forward signature.

A layer that owns an auxiliary objective (Primal-Attention's KSVD term) subclasses
:class:`AuxLossMixin` and calls :meth:`AuxLossMixin.set_aux_loss` during its forward. A training
loop then calls :func:`collect_aux_loss` on the whole model after the forward pass: it walks every
submodule however deeply nested, averages the terms within each group (e.g. the KSVD loss is
``eta * mean over primal layers of J_l^2``), sums the groups and clears the stored terms so a term is
never counted twice.

Hand-written because it is the project's own contract; it is a few lines and needs no library.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor, nn

__all__ = ["AuxLossMixin", "aux_loss_terms", "collect_aux_loss"]


class AuxLossMixin:
    """Mixin for modules that produce an auxiliary loss term on each forward.

    Attributes:
        aux_loss_group: terms of one group are averaged over layers before weighting.
        aux_loss_weight: the coefficient (eta) multiplying this layer's term.
    """

    aux_loss_group: str = "aux"
    aux_loss_weight: float = 1.0

    def set_aux_loss(self, value: Tensor | None) -> None:
        """Store the unweighted term of the latest forward (a scalar tensor with its graph)."""
        self.__dict__["_aux_loss_value"] = value

    def pop_aux_loss(self) -> Tensor | None:
        """Return and clear the stored unweighted term."""
        return self.__dict__.pop("_aux_loss_value", None)

    def peek_aux_loss(self) -> Tensor | None:
        """Return the stored unweighted term without clearing it."""
        return self.__dict__.get("_aux_loss_value")


def aux_loss_terms(model: nn.Module, clear: bool = True) -> dict[str, list[tuple[str, float, Tensor]]]:
    """Stored terms per group: ``{group: [(module_name, weight, unweighted_term), ...]}``."""
    out: dict[str, list[tuple[str, float, Tensor]]] = defaultdict(list)
    for name, module in model.named_modules():
        if isinstance(module, AuxLossMixin):
            value = module.pop_aux_loss() if clear else module.peek_aux_loss()
            if value is not None:
                out[module.aux_loss_group].append((name, float(module.aux_loss_weight), value))
    return dict(out)


def collect_aux_loss(model: nn.Module, clear: bool = True) -> Tensor | None:
    """Total auxiliary loss: sum over groups of the mean over layers of ``weight * term``.

    Returns None when no layer stored a term (so callers can skip adding anything).
    """
    groups = aux_loss_terms(model, clear=clear)
    total: Tensor | None = None
    for terms in groups.values():
        group = torch.stack([w * t for _, w, t in terms]).mean()
        total = group if total is None else total + group
    return total
