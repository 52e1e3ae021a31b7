"""Low-rank adapters for stage 2 of a conversion (LoLCATs trains LoRA, rank 8, on the attention projections).

:func:`add_lora` freezes the model and makes trainable only (a) a rank-``r`` update ``W + (alpha / r) B A`` of the
projection weights of the chosen attention layers and (b) the parameters each student adds
(:func:`~primaldual.convert.students.new_parameters`: the primal layer's ``W_e``, ``W_r``, ``Lambda`` and output map,
the hybrid's branch and gate). ``B`` starts at zero, so the adapted model computes what it did before.
:func:`merge_lora` folds the updates into the weights, leaving a model with its original parameter names (to save,
export or decode without this module). For checkpoints written while adapters train (``primaldual convert``'s stage
2 of a ``CausalLM`` run), :func:`fold_lora` stores each adapted weight merged under its original name, with the
adapter's own tensors beside the state dict, and :func:`unfold_lora` puts them back before a resume loads them: a
reader that knows nothing of adapters (``generate``, ``test``, ``analyze``) loads such a checkpoint as a plain model.

Written by hand on :mod:`torch.nn.utils.parametrize`, not with ``peft``: peft wraps each ``nn.Linear`` in a module
whose forward adds the update, but the primal layer reads its projection weights directly (the fused score path, the
rotated core, the Triton kernel), which would silently bypass such a wrapper. A parametrization changes what
``module.weight`` *is*, so every path sees ``W + (alpha / r) B A``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ..attention.base import AttentionLayer
from ..options import check_int, check_number
from .students import new_parameters

__all__ = [
    "LORA_TARGETS",
    "LoRAUpdate",
    "add_lora",
    "fold_lora",
    "has_lora",
    "lora_parameters",
    "merge_lora",
    "unfold_lora",
]

#: projection modules of the attention layers that get an adapter: fused q/k/v (softmax, hybrid), the primal layer's
#: fused q/k, and the output projection
LORA_TARGETS: tuple[str, ...] = ("qkv", "qk", "proj")


class LoRAUpdate(nn.Module):
    """The parametrization ``W -> W + (alpha / r) B A`` of a ``(out, in)`` weight: ``A`` ``(r, in)`` drawn as
    LoRA's (Kaiming-uniform), ``B`` ``(out, r)`` zero."""

    def __init__(self, weight: Tensor, r: int, alpha: float) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        kw = {"device": weight.device, "dtype": weight.dtype}
        self.lora_a = nn.Parameter(torch.empty(r, in_features, **kw))
        self.lora_b = nn.Parameter(torch.zeros(out_features, r, **kw))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / r

    def forward(self, weight: Tensor) -> Tensor:
        return weight + self.scale * (self.lora_b @ self.lora_a)  # (out, r) @ (r, in) -> (out, in)


def _students(model: nn.Module) -> list[nn.Module]:
    students = []
    for m in model.modules():
        try:
            new_parameters(m)
        except TypeError:
            continue
        students.append(m)
    return students


def add_lora(
    model: nn.Module,
    *,
    r: int = 8,
    alpha: float = 16.0,
    layers: Sequence[nn.Module] | None = None,
    targets: Iterable[str] = LORA_TARGETS,
) -> list[nn.Parameter]:
    """Freeze ``model``; add rank-``r`` adapters and unfreeze the students' new parameters; return what trains.

    Args:
        model: a converted model (a :class:`~primaldual.models.CausalLM` or a Hugging Face model after
            :func:`~primaldual.convert.hf.convert_hf`), changed in place.
        r: adapter rank. alpha: scale numerator (the update is ``alpha / r * B A``).
        layers: the attention layers that get adapters (default: every primaldual attention layer in the model, the
            students and the softmax layers left in place alike).
        targets: names of the projection modules inside those layers to adapt (:data:`LORA_TARGETS`).

    Returns:
        The trainable parameters: every adapter's ``A`` and ``B``, then the students' new parameters.
    """
    check_int("r", r, low=1)
    check_number("alpha", alpha, low=0.0, low_open=True)
    targets = tuple(targets)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"targets: expected names of projection modules, e.g. {LORA_TARGETS}, got {targets!r}")
    chosen = list(layers) if layers is not None else [m for m in model.modules() if isinstance(m, AttentionLayer)]
    if not chosen:
        raise ValueError("add_lora: the model has no primaldual attention layer to adapt")
    if any(parametrize.is_parametrized(m) for m in model.modules()):
        raise ValueError("add_lora: the model already has adapters (or other parametrizations); merge_lora first")
    for p in model.parameters():
        p.requires_grad_(False)
    adapted = 0
    for layer in chosen:
        for name in targets:
            linear = getattr(layer, name, None)
            if isinstance(linear, nn.Linear):
                parametrize.register_parametrization(linear, "weight", LoRAUpdate(linear.weight, r, alpha))
                adapted += 1
    if not adapted:
        raise ValueError(f"add_lora: none of {targets} is a linear projection of the chosen layers")
    trainable = lora_parameters(model)
    for p in trainable:
        p.requires_grad_(True)
    extra = [p for s in _students(model) for p in new_parameters(s)]
    for p in extra:
        p.requires_grad_(True)
    return trainable + extra


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every adapter's ``A`` and ``B`` in ``model`` (in module order)."""
    return [p for m in model.modules() if isinstance(m, LoRAUpdate) for p in (m.lora_a, m.lora_b)]


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its weight (``W <- W + alpha / r B A``) and remove it; the parameter names are the
    original ones again. Returns ``model``, changed in place; every parameter keeps the ``requires_grad`` that
    :func:`add_lora` left (frozen, except the students' new parameters): unfreeze what trains next."""
    for m in list(model.modules()):
        if parametrize.is_parametrized(m, "weight") and any(
            isinstance(p, LoRAUpdate) for p in m.parametrizations["weight"]
        ):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
    return model


def _adapted(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(module path, module)`` of every module of ``model`` whose weight carries an adapter."""
    return [
        (path, m)
        for path, m in model.named_modules()
        if parametrize.is_parametrized(m, "weight")
        and any(isinstance(p, LoRAUpdate) for p in m.parametrizations["weight"])
    ]


def has_lora(model: nn.Module) -> bool:
    """Whether any weight of ``model`` carries an adapter."""
    return bool(_adapted(model))


@torch.no_grad()
def fold_lora(model: nn.Module, state: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
    """In ``state`` (``model.state_dict()``, changed in place): each adapted weight's entries
    (``<path>.parametrizations.weight.*``) replaced by the merged weight ``W + alpha / r B A`` under ``<path>.weight``.
    Returns the removed entries per module path (what :func:`unfold_lora` needs); ``{}`` for a model without
    adapters."""
    folded: dict[str, dict[str, Tensor]] = {}
    for path, m in _adapted(model):
        pre = f"{path}.parametrizations.weight."
        folded[path] = {k[len(pre) :]: state.pop(k) for k in [k for k in state if k.startswith(pre)]}
        state[f"{path}.weight"] = m.weight.detach().clone()  # the parametrization's value: the merged weight
    return folded


def unfold_lora(state: dict[str, Tensor], folded: dict[str, dict[str, Tensor]]) -> None:
    """Undo :func:`fold_lora` on ``state`` (in place): the adapter entries back, the merged weights out."""
    if not isinstance(folded, dict):
        raise ValueError(f"lora entries: expected a mapping of module path -> tensors, got {type(folded).__name__}")
    for path, entries in folded.items():
        state.pop(f"{path}.weight", None)
        state.update({f"{path}.parametrizations.weight.{k}": v for k, v in entries.items()})
