"""The students a trained softmax layer converts into, and the swap that builds them from the teacher's weights.

Students (what each is, in the papers' terms):

* ``primal``: the Primal-Attention layer of Chen et al. (2023) as it is, causal or not as the teacher layer is. Causal:
  the official fairseq design (prefix means of q and k, the cosine feature map, data-independent ``W_e, W_r``).
  Bidirectional (an encoder: a classifier, a ViT, BERT): the layer of the time-series / LRA / vision code, with
  data-dependent ``W_{e|X} = f(X)^T W_e``, which is what mixes its tokens (with ``data_dependent=False`` each
  token's output depends on that token alone).
  Converting the last layer of a Transformer gives Primal.+; converting every layer gives PrimalFormer. It keeps
  the teacher's query, key and output projections (it has no values).
* ``hybrid``: :class:`~primaldual.attention.hybrid.HybridAttention`, an extension of ours: the teacher's exact
  softmax on a sliding window plus sink tokens, and a primal branch gated per head. It keeps all four projections.
  Causal teachers only (the window looks back).
* ``window``: the same layer without its primal branch (the window-only ablation of ``hybrid``); nothing new to train.

:func:`swap_attention` copies a model and replaces the self-attention of the chosen layers by a student built from
the teacher layer's projections (:func:`~primaldual.integrations.torch_nn.attention_from_projections`); the teacher
is not modified. It works on every model with one stack of :class:`~primaldual.encoder.EncoderBlock`: ``CausalLM``
and the classifiers (time series, LRA, vision).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ..attention.base import AttentionLayer, QKVAttention
from ..attention.hybrid import HybridAttention
from ..attention.primal import PrimalAttention
from ..attention.registry import attention_options
from ..encoder import Encoder
from ..integrations.torch_nn import attention_from_projections, resolve_layer_indices

__all__ = [
    "BIDIRECTIONAL_STUDENTS",
    "STUDENTS",
    "check_student",
    "find_blocks",
    "new_parameters",
    "student_layer",
    "student_plan",
    "swap_attention",
]

#: student name -> (registered attention, options it always gets)
STUDENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "primal": ("primal", {}),
    "hybrid": ("hybrid", {}),
    "window": ("hybrid", {"primal_branch": False}),
}

#: the students a bidirectional (non-causal) teacher converts into
BIDIRECTIONAL_STUDENTS = ("primal",)


def find_blocks(model: nn.Module) -> nn.ModuleList:
    """The ``EncoderBlock`` list of a primaldual model: its one :class:`~primaldual.encoder.Encoder` stack
    (``model.decoder.blocks`` of a ``CausalLM``, ``model.encoder.blocks`` of a classifier)."""
    stacks = [m for m in model.modules() if isinstance(m, Encoder)]
    if len(stacks) == 1:
        return stacks[0].blocks
    got = "no stack" if not stacks else f"{len(stacks)} stacks"
    raise TypeError(
        f"model must be a primaldual model with one stack of blocks (primaldual.encoder.Encoder), such as CausalLM or "
        f"a classifier; {type(model).__name__} has {got}. For a Hugging Face model use "
        "primaldual.integrations.hf.convert"
    )


def check_student(
    student: str, options: dict[str, Any] | None = None, causal: bool = True
) -> tuple[str, dict[str, Any]]:
    """``(mechanism, the options the student fixes)``; an unknown student, ``options`` setting a fixed one, or a
    causal-only student for a bidirectional teacher (``causal=False``) is an error."""
    if student not in STUDENTS:
        raise ValueError(f"student must be one of {', '.join(map(repr, STUDENTS))}, got {student!r}")
    if not causal and student not in BIDIRECTIONAL_STUDENTS:
        raise ValueError(
            f"student {student!r} is causal only (its window looks back); a bidirectional teacher converts to "
            f"{' or '.join(map(repr, BIDIRECTIONAL_STUDENTS))}"
        )
    name, fixed = STUDENTS[student]
    for key in fixed:
        if key in (options or {}):
            raise ValueError(f"{key}: set by the student {student!r}; do not pass it")
    return name, fixed


def student_layer(teacher: QKVAttention, student: str, **options: Any) -> AttentionLayer:
    """A student attention built from the trained softmax layer ``teacher``, its projections copied; causal as the
    teacher is.

    Args:
        teacher: a :class:`~primaldual.attention.base.QKVAttention` (softmax), causal or bidirectional.
        student: ``"primal"``, ``"hybrid"`` or ``"window"`` (the last two for a causal teacher only).
        options: the student mechanism's options (``s``, ``eta``, ``ksvd_reduction``; ``data_dependent``, ``n``,
            ``rank_multi``, ``max_len`` for a bidirectional primal student; ``window``, ``sinks`` for the hybrid).
    """
    if not isinstance(teacher, QKVAttention) or isinstance(teacher, HybridAttention):
        raise TypeError(
            f"the teacher layer must be a softmax-family attention with a fused qkv projection, got "
            f"{type(teacher).__name__}"
        )
    name, fixed = check_student(student, options, teacher.causal)
    inner = teacher.inner_dim
    w, b = teacher.qkv.weight, teacher.qkv.bias

    def part(i: int) -> tuple[Tensor, Tensor | None]:
        return w[i * inner : (i + 1) * inner], None if b is None else b[i * inner : (i + 1) * inner]

    # what of the teacher's the student mechanism may not take: said once, never dropped silently
    own = {"qk_norm": teacher.qk_norm_gains(), "softcap": getattr(teacher, "softcap", None)}
    dropped = [key for key, value in own.items() if value is not None and key not in attention_options(name)]
    if dropped:
        what = {"qk_norm": "query / key norms (qk_norm)", "softcap": "logit cap (softcap)"}
        warnings.warn(
            f"student {student!r} takes no {' and no '.join(what[k] for k in dropped)}: it does without the teacher's",
            UserWarning,
            stacklevel=2,
        )
    norms, cap = (None if key in dropped else own[key] for key in ("qk_norm", "softcap"))
    layer = attention_from_projections(
        name,
        num_heads=teacher.num_heads,
        q=part(0),
        k=part(1),
        v=part(2),
        out=(teacher.proj.weight, teacher.proj.bias),
        causal=teacher.causal,
        attn_drop=teacher.attn_drop,
        proj_drop=teacher.proj_drop.p,
        scale=getattr(teacher, "scale", None),
        qk_norm=norms,
        softcap=cap,
        **fixed,
        **options,
    )
    return layer.train(teacher.training)


def new_parameters(layer: nn.Module) -> list[nn.Parameter]:
    """The parameters a student adds to the teacher's projections (what stage 1 trains): the primal layer's
    ``W_e, W_r, Lambda`` and output map, and the hybrid's branch and gate. Empty for the window-only student."""
    if isinstance(layer, PrimalAttention):
        return [layer.w_e, layer.w_r, layer.lam, *layer.concat.parameters()]
    if isinstance(layer, HybridAttention):
        if not layer.has_branch:
            return []
        return [layer.w_e, layer.w_r, layer.lam, layer.gate, *layer.concat.parameters()]
    raise TypeError(f"not a student layer: {type(layer).__name__}")


def student_plan(
    depth: int, student: str, layers: Sequence[int], base: str = "softmax", *, causal: bool = True, **options: Any
) -> tuple[list[str], list[dict[str, Any] | None]]:
    """The per-layer attention names and options of the converted model (for a config's ``model.attention`` and
    ``model.attention_options``): ``layers`` (resolved indices) are the student, the others stay ``base``;
    ``causal=False`` for a bidirectional model (which the window students cannot convert)."""
    name, fixed = check_student(student, options, causal)
    names = [name if i in layers else base for i in range(depth)]
    opts = [{**fixed, **options} if i in layers else None for i in range(depth)]
    return names, opts


def swap_attention(
    model: nn.Module, student: str, layers: int | Sequence[int] | str = (-1,), **options: Any
) -> tuple[nn.Module, list[int]]:
    """A copy of ``model`` with the self-attention of ``layers`` replaced by ``student`` (teacher weights copied).

    Args:
        model: a primaldual model whose chosen blocks hold softmax attention (a trained ``CausalLM`` or
            classifier); each student is causal as the layer it replaces.
        student: ``"primal"``, ``"hybrid"`` or ``"window"``.
        layers: block indices (negative from the end) or ``"all"``.
        options: the student's mechanism options.

    Returns:
        ``(student_model, indices)``: the converted copy (same device, dtype and mode) and the resolved indices.
        The new parameters are the mechanism's defaults (random W_e, W_r; gate 0): see
        :func:`primaldual.convert.init_from_teacher` for an initialisation that uses the teacher.
    """
    blocks = find_blocks(model)
    chosen = resolve_layer_indices(layers, len(blocks))
    new = copy.deepcopy(model)
    new_blocks = find_blocks(new)
    for i in chosen:  # build every student before replacing any
        if not isinstance(blocks[i].attn, QKVAttention) or isinstance(blocks[i].attn, HybridAttention):
            raise ValueError(f"layers: block {i} holds {type(blocks[i].attn).__name__}, not a softmax teacher layer")
    students = [student_layer(new_blocks[i].attn, student, **options) for i in chosen]
    name = check_student(student)[0]
    for i, layer in zip(chosen, students):
        new_blocks[i].attn = layer
        new_blocks[i].attention_name = name
    return new, chosen
