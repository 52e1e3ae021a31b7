"""Converting a trained timm vision transformer (ViT, DeiT and the models built like them: ``model.blocks[i].attn``
a timm ``Attention`` with a fused ``qkv`` and a ``proj``).

:func:`convert_timm` is :func:`primaldual.convert.convert` for such a model: a converted copy (the teacher is left
unchanged) whose chosen blocks hold the paper's non-causal primal layer inside a
:class:`~primaldual.integrations.timm.TimmAttention` (put in place by
:func:`~primaldual.integrations.timm.convert_vision_transformer`), initialised from the teacher and trained by the
same stage 1 (:mod:`primaldual.convert.external`). Each block's attention input and output are read by hooks on its
``attn`` module, with the ``attn_mask`` it is given (padding only). timm itself is not imported here: any model with
that layout converts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer
from ..integrations.timm import convert_vision_transformer, layer_from_timm
from ..integrations.torch_nn import key_mask_from_attention_mask, resolve_layer_indices
from .external import Reader, check_stages, initialise_and_transfer, record_calls
from .students import check_student

__all__ = ["convert_timm", "timm_attention_io"]


def _blocks(model: nn.Module) -> nn.Module:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Sequential | nn.ModuleList):
        raise TypeError(f"expected a timm vision transformer with .blocks, got {type(model).__name__}")
    return blocks


@torch.no_grad()
def timm_attention_io(
    teacher: nn.Module, batch: Any, layers: Sequence[int]
) -> list[tuple[Tensor, Tensor, Tensor | None]]:
    """Each of ``layers``' attention input ``x`` ``(B, N, C)``, output ``y`` ``(B, N, C)`` (after ``proj``, zero at
    padded tokens) and key mask ``(B, N)`` bool (True = real token, or None), from one forward of ``teacher`` on
    ``batch`` (images ``(B, 3, H, W)``, or a tuple / mapping of its arguments) in eval mode."""
    blocks = _blocks(teacher)

    def read(i: int, mod: nn.Module, args: tuple, kwargs: dict, out: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        x = args[0] if args else kwargs["x"]
        if (len(args) > 2 and args[2]) or kwargs.get("is_causal"):
            raise ValueError(f"block {i} was called causal: a timm model converts into non-causal layers")
        B, N, _ = x.shape
        mask = args[1] if len(args) > 1 else kwargs.get("attn_mask")
        key = key_mask_from_attention_mask(mask, batch=B, q_len=N, kv_len=N, causal=False, name="attn_mask")
        y = out if key is None else out.masked_fill(~key[..., None], 0.0)  # students output zeros there
        return x.detach().clone(), y.detach().clone(), key  # copies: the model may add to them in place

    modules = {i: blocks[i].attn for i in layers}
    return record_calls(teacher, batch, modules, read, lambda i: f"block {i}", plural="blocks")


def _io(teacher: nn.Module, batch: Any, _: Tensor | None, layers: Sequence[int]) -> list[tuple]:
    return [(x, y, None, key) for x, y, key in timm_attention_io(teacher, batch, layers)]


def _students(model: nn.Module, layers: Sequence[int]) -> list[AttentionLayer]:
    return [_blocks(model)[i].attn.attn for i in layers]


def _teacher_layer(teacher: nn.Module, index: int) -> AttentionLayer:
    return layer_from_timm(_blocks(teacher)[index].attn, "softmax").eval()


#: how :func:`~primaldual.convert.external.initialise_and_transfer` reads a timm vision transformer
TIMM_READER = Reader(io=_io, students=_students, teacher_layer=_teacher_layer)


def convert_timm(
    teacher: nn.Module,
    student: str = "primal",
    layers: int | Sequence[int] | str = (-1,),
    *,
    batches: Iterable[Any] | None = None,
    steps: int = 0,
    init: str = "teacher",
    lr: float = 3e-4,
    log_every: int = 10,
    on_log: Callable[[dict[str, float]], None] | None = None,
    resume: dict[str, Any] | None = None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
    **options: Any,
) -> tuple[nn.Module, dict[str, Any]]:
    """A converted copy of the timm vision transformer ``teacher`` (left unchanged): swap, initialisation, stage 1.

    Args:
        teacher: a model with ``.blocks`` whose ``attn`` modules have timm's ``Attention`` layout (no query / key
            norms).
        student: ``"primal"`` (the non-causal layer; the window students are causal only).
        layers: block indices (negative from the end) or ``"all"``; ``(-1,)`` gives Primal.+DeiT.
        batches: what ``teacher`` is called with, one item per forward: images (``teacher(x)``), or a tuple /
            mapping of its arguments. The first calibrates the initialisation, the next ``steps`` train stage 1.
        steps, init, lr, log_every, on_log, resume, on_checkpoint, options: as
            :func:`~primaldual.convert.hf.convert_hf` (``options``: ``s``, ``eta``, ``data_dependent``, ``n``,
            ``rank_multi``, ``max_len``, ...).

    Returns:
        ``(model, report)``: report holds ``layers``, ``init`` (per-layer figures) and ``history`` (stage 1).
        Stage 2 is training the returned model on its task's loss plus :func:`primaldual.collect_aux_loss`.
    """
    check_stages(init, steps, log_every)
    name, fixed = check_student(student, options, causal=False)
    chosen = resolve_layer_indices(layers, len(_blocks(teacher)))
    model = convert_vision_transformer(copy.deepcopy(teacher), name, chosen, **fixed, **options)
    report = initialise_and_transfer(
        teacher,
        model,
        chosen,
        TIMM_READER,
        batches,
        student=student,
        steps=steps,
        init=init,
        lr=lr,
        log_every=log_every,
        on_log=on_log,
        resume=resume,
        on_checkpoint=on_checkpoint,
    )
    return model, report
