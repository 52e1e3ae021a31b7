"""Auxiliary losses that layers contribute without changing any model's forward signature.

A layer that owns an auxiliary objective (Primal-Attention's KSVD term) subclasses :class:`AuxLossMixin` and
calls :meth:`AuxLossMixin.add_aux_loss` during its forward. **Every call records its own term**, so a layer
that runs twice in one forward (the shared encoder of a two-tower model, a weight-shared block, a layer reused
over decoding steps) contributes twice. A training loop then calls :func:`collect_aux_loss` on the whole model
after the forward pass: it walks every submodule however deeply nested, takes within each group the mean over
all recorded calls of ``weight * term`` (the KSVD loss is ``eta * mean over primal layer calls of J^2``), sums
the groups and clears the recorded terms, so a term is never counted twice.

The rules, each chosen so a training loop cannot silently lose or double a term:

* **No gradient, no term.** Under ``torch.no_grad`` / ``torch.inference_mode`` nothing is recorded (layers may
  skip computing the term at all, see :meth:`AuxLossMixin.records_aux_loss`): an evaluation loop never
  accumulates terms it will not collect. Eval mode (``model.eval()``) with gradients enabled records as usual.
* **Activation checkpointing** (``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, PyTorch's
  recommended mode): the recomputation of the forward during backward records nothing, so each term is
  counted once, from the original forward. The legacy reentrant mode runs the original forward under
  ``no_grad`` and so loses the term: use ``use_reentrant=False``.
* **torch.compile**: recording is a Python side effect that Dynamo replays, so compiled and eager models
  collect the same terms (tested with ``fullgraph=True``).
* **DDP**: each rank collects the terms of its own forward; DDP averages the gradients as for any loss term.
* Terms recorded with gradients enabled and never collected keep their autograd graph alive: call
  :func:`collect_aux_loss` (or :func:`clear_aux_loss`) once per forward, as the training harness does.

Hand-written because it is the project's own contract; x-transformers returns such terms through an
intermediates object instead, which would change the layer signature ``forward(x, mask, *, need_weights)``.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor, nn

__all__ = ["AuxLossMixin", "aux_loss_terms", "clear_aux_loss", "collect_aux_loss", "collect_aux_loss_parts"]


def _recomputing() -> bool:
    """True while autograd runs a backward pass (where non-reentrant checkpointing recomputes forwards).

    PyTorch has no public query for this; the graph-task id is -1 outside a backward pass.
    """
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1


class AuxLossMixin:
    """Mixin for modules that produce an auxiliary loss term on each call.

    List it before the ``nn.Module`` base (``class MyLayer(AuxLossMixin, nn.Module)``) so that its
    ``__getstate__`` keeps recorded terms out of ``copy.deepcopy`` and pickling.

    Attributes:
        aux_loss_group: terms of one group are averaged over calls before weighting.
        aux_loss_weight: the coefficient (eta) multiplying this layer's term.
    """

    aux_loss_group: str = "aux"
    aux_loss_weight: float = 1.0

    def records_aux_loss(self) -> bool:
        """Whether a term computed now can be recorded: gradients are enabled.

        Layers check this first and skip computing the term under ``no_grad``. (A checkpoint recomputation
        computes it, so that it saves the same tensors as the original forward, but does not record it.)
        """
        return torch.is_grad_enabled()

    def add_aux_loss(self, value: Tensor) -> None:
        """Record this call's unweighted term (a scalar tensor with its graph); see the module docstring."""
        if not torch.is_grad_enabled() or _recomputing():
            return
        terms = self.__dict__.get("_aux_loss_terms")
        if terms is None:
            self.__dict__["_aux_loss_terms"] = [value]
        else:
            terms.append(value)

    def __getstate__(self) -> dict:
        # recorded terms are non-leaf tensors of one forward: never copied or pickled (deepcopy, EMA / SWA
        # AveragedModel, torch.save of a whole module), and a copy starts with none
        state = dict(super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__)
        state.pop("_aux_loss_terms", None)
        return state

    def pop_aux_losses(self) -> list[Tensor]:
        """Return and clear the unweighted terms recorded since the last collection, in call order."""
        return self.__dict__.pop("_aux_loss_terms", None) or []

    def peek_aux_losses(self) -> list[Tensor]:
        """The recorded unweighted terms, without clearing them."""
        return list(self.__dict__.get("_aux_loss_terms") or [])


def aux_loss_terms(model: nn.Module, clear: bool = True) -> dict[str, list[tuple[str, float, Tensor]]]:
    """Recorded terms per group: ``{group: [(module_name, weight, unweighted_term), ...]}``, one entry per call."""
    out: dict[str, list[tuple[str, float, Tensor]]] = defaultdict(list)
    for name, module in model.named_modules():
        if isinstance(module, AuxLossMixin):
            values = module.pop_aux_losses() if clear else module.peek_aux_losses()
            if values:
                out[module.aux_loss_group].extend((name, float(module.aux_loss_weight), v) for v in values)
    return dict(out)


def collect_aux_loss(model: nn.Module, clear: bool = True) -> Tensor | None:
    """Total auxiliary loss: sum over groups of the mean over recorded calls of ``weight * term``.

    Returns None when no layer recorded a term (so callers can skip adding anything).
    """
    groups = aux_loss_terms(model, clear=clear)
    total: Tensor | None = None
    for terms in groups.values():
        group = torch.stack([w * t for _, w, t in terms]).mean()
        total = group if total is None else total + group
    return total


def collect_aux_loss_parts(model: nn.Module, clear: bool = True) -> tuple[Tensor | None, dict[str, Tensor]]:
    """:func:`collect_aux_loss` and, beside it, each group's mean *unweighted* term over its calls (detached, for
    logging: the KSVD group's is the mean of J^2 over the primal layers, before ``eta``)."""
    groups = aux_loss_terms(model, clear=clear)
    total: Tensor | None = None
    parts: dict[str, Tensor] = {}
    for name, terms in groups.items():
        group = torch.stack([w * t for _, w, t in terms]).mean()
        total = group if total is None else total + group
        parts[name] = torch.stack([t.detach() for _, _, t in terms]).mean()
    return total, parts


def clear_aux_loss(model: nn.Module) -> None:
    """Drop every recorded term of ``model`` (e.g. after a forward whose loss is not trained on)."""
    aux_loss_terms(model, clear=True)
