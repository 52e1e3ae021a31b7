"""Converting a trained Hugging Face model: a causal LM (Llama and its layout, GPT-NeoX, GPT-2, OPT, ...) or a
bidirectional encoder (BERT and its kin, ViT, DeiT, CLIP's towers, ...): the students of :mod:`primaldual.convert`
put in place by :func:`primaldual.integrations.hf.convert`, initialised from the teacher and trained by the same
stage 1.

:func:`convert_hf` is :func:`primaldual.convert.convert` for a transformers model: a converted copy (the teacher is
left unchanged), the KSVD and least-squares initialisation on a calibration batch, then teacher-forced attention
transfer (:func:`~primaldual.convert.transfer.attention_transfer` with this module's readers). The teacher's layer
inputs are read by hooks on its attention modules, with the rotary tables a Llama passes them
(``position_embeddings``), so that the students' window branches are rotated as the teacher was. Stage 2 is
ordinary training of the returned model on its task's loss plus :func:`primaldual.collect_aux_loss`.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer
from ..attention.hybrid import HybridAttention
from ..integrations.torch_nn import attention_from_projections, check_contiguous_padding, resolve_layer_indices
from .external import Reader, check_stages, initialise_and_transfer
from .students import check_student
from .transfer import evaluating

__all__ = ["check_student_windows", "convert_hf", "hf_attention_io", "hf_student_layers", "hf_teacher_layer"]


def _hf() -> Any:
    """The Hugging Face integration and its layout readers (transformers is an optional dependency)."""
    from types import SimpleNamespace

    from ..integrations import hf
    from ..integrations.hf.architectures import find_blocks, read_site

    return SimpleNamespace(
        find_blocks=find_blocks, read_site=read_site, convert=hf.convert, converted_layers=hf.converted_layers
    )


def _key_mask(mask: Tensor | None) -> Tensor | None:
    """A Hugging Face ``attention_mask`` ``(B, N)`` (1 = keep) as a bool key mask, or None."""
    return None if mask is None else mask.bool()


Batch = tuple[Tensor, Tensor | None] | Mapping[str, Any]


def _model_inputs(teacher: nn.Module, inputs: Tensor | Mapping[str, Any], mask: Tensor | None) -> dict[str, Any]:
    """The keyword arguments of the teacher's forward for one batch: ``input_ids`` and ``attention_mask``, or the
    given mapping (``pixel_values``, ...); ``use_cache=False`` where the forward takes it (nothing is decoded)."""
    if isinstance(inputs, Mapping):
        if mask is not None:
            raise ValueError("mask: a batch given as a mapping of the model's inputs carries its own attention_mask")
        kw = dict(inputs)
    else:
        kw = {"input_ids": inputs, "attention_mask": mask}
    if "use_cache" in inspect.signature(teacher.forward).parameters:
        kw.setdefault("use_cache", False)
    return kw


def _batch(item: Batch) -> tuple[Tensor | Mapping[str, Any], Tensor | None]:
    """One batch of ``convert_hf``'s stream as ``(inputs, attention_mask or None)``."""
    if isinstance(item, Mapping):
        return item, item.get("attention_mask")
    if isinstance(item, tuple | list) and len(item) == 2:
        return item[0], item[1]
    raise TypeError(
        f"batches: each batch is (input_ids, attention_mask or None) or a mapping of the model's inputs "
        f"(e.g. {{'pixel_values': images}}), got {type(item).__name__}"
    )


@torch.no_grad()
def hf_attention_io(
    teacher: nn.Module, ids: Tensor | Mapping[str, Any], mask: Tensor | None, layers: Sequence[int]
) -> list[tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]]:
    """The teacher's attention input ``(B, N, C)``, output ``(B, N, C)`` (zero at padded tokens; before the residual
    and its norm in a post-norm model such as BERT) and rotary tables (``(cos, sin)`` each ``(B, N, D)``, or None)
    at each of ``layers``, from one forward in eval mode.

    ``ids`` ``(B, N)`` with ``mask`` (the ``attention_mask``, 1 = keep, or None), or a mapping of the model's inputs
    (``{"pixel_values": images}``; its ``attention_mask``, if any, masks the keys) with ``mask`` None. Padding
    between real tokens is refused where a layer slides a window (the teacher's window counts padding positions)."""
    hf = _hf()
    kw = _model_inputs(teacher, ids, mask)
    mask = kw.get("attention_mask")
    key = _key_mask(mask)
    _, blocks = hf.find_blocks(teacher)
    seen: dict[int, tuple[Tensor, Tensor, Any]] = {}
    projected: dict[int, Tensor] = {}  # a post-norm module's attention output, before its residual and norm
    sites = {i: hf.read_site(teacher, blocks[i], i) for i in layers}
    if any(site.window is not None for site in sites.values()):
        check_contiguous_padding(key, "the batch's attention_mask")
    hooks = []
    for i, site in sites.items():

        def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Any, i: int = i, rotates: bool = site.rope) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            y = out[0] if isinstance(out, tuple) else out
            rope = kwargs.get("position_embeddings")
            if rope is None and len(args) > 1 and isinstance(args[1], tuple):
                rope = args[1]
            rope = rope if rotates else None  # a NoPE layer (SmolLM3) is handed the tables and leaves them unused
            y = projected.pop(i, y)  # post-norm (BERT): the module returned norm(attention + x)
            seen[i] = (
                x.detach().clone(),
                y.detach().clone(),
                None if rope is None else tuple(t.detach() for t in rope),
            )

        def output(mod: nn.Module, args: tuple, out: Tensor, i: int = i) -> None:
            projected[i] = out  # read here, not as norm input - x: that difference loses half-precision digits

        if site.out_module is not None:
            hooks.append(site.out_module.register_forward_hook(output))
        hooks.append(site.module.register_forward_hook(hook, with_kwargs=True))
    try:
        with evaluating(teacher):
            teacher(**kw)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for i in layers:
        x, y, rope = seen[i]
        if key is not None:
            y = y.masked_fill(~key[..., None], 0.0)  # the students' outputs are zero at padded tokens
        if rope is not None:
            rope = tuple(t.expand(x.shape[0], x.shape[1], -1) for t in rope)  # (B, N, D) each
        out.append((x, y, rope))
    return out


def hf_student_layers(model: nn.Module, layers: Sequence[int]) -> list[AttentionLayer]:
    """The primaldual attention layers inside the converted blocks ``layers`` of ``model``."""
    hf = _hf()
    _, blocks = hf.find_blocks(model)
    converted = {id(m): m for m in hf.converted_layers(model).values()}
    found = []
    for i in layers:
        wrapper = next((m for m in blocks[i].modules() if id(m) in converted), None)
        if wrapper is None:
            raise ValueError(f"layer {i} of this {type(model).__name__} is not converted")
        found.append(wrapper.attn)
    return found


def hf_teacher_layer(teacher: nn.Module, index: int) -> AttentionLayer:
    """The teacher's attention at block ``index`` as a primaldual softmax layer with its weights (grouped K / V heads
    repeated): the layer the initialisation reads per-head outputs from. A sliding-window layer (Mistral, Gemma 2
    and 3) is rebuilt as ``sparse`` softmax on its window."""
    hf = _hf()
    _, blocks = hf.find_blocks(teacher)
    site = hf.read_site(teacher, blocks[index], index)
    window = {} if site.window is None else {"window": site.window - 1}  # sparse's radius: the keys before one's own
    layer = attention_from_projections(
        "sparse" if site.window is not None else "softmax",
        num_heads=site.num_heads,
        q=site.q,
        k=site.k,
        v=site.v,
        out=site.out,
        causal=site.causal,
        scale=site.scale,
        qk_norm=site.qk_norm,
        softcap=site.softcap,
        **window,
    )
    return layer.eval()


def check_student_windows(
    student: str, layers: Sequence[int], sites: Sequence[Any], options: Mapping[str, Any]
) -> None:
    """A ``hybrid`` or ``window`` student keeps the teacher's exact attention in its window, so its ``window`` (the
    option, or the mechanism's default) may not be wider than a sliding teacher layer's (``site.window``); its sinks
    and primal branch see past it by design (:func:`primaldual.integrations.hf.convert` says so)."""
    if check_student(student)[0] != "hybrid":
        return
    keys = options.get("window", inspect.signature(HybridAttention).parameters["window"].default)
    for i, site in zip(layers, sites):
        if site.window is not None and isinstance(keys, int) and keys > site.window:
            raise ValueError(
                f"window: layer {i} of the teacher slides a window of {site.window} keys; the {student} student's "
                f"window of {keys} keys would see more than the teacher did: pass window={site.window} or less"
            )


def convert_hf(
    teacher: nn.Module,
    student: str = "primal",
    layers: int | Sequence[int] | str = (-1,),
    *,
    batches: Iterable[Batch] | None = None,
    steps: int = 0,
    init: str = "teacher",
    lr: float = 3e-4,
    log_every: int = 10,
    on_log: Callable[[dict[str, float]], None] | None = None,
    resume: dict[str, Any] | None = None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
    **options: Any,
) -> tuple[nn.Module, dict[str, Any]]:
    """A converted copy of the transformers model ``teacher`` (left unchanged): swap, initialisation, stage 1.

    Args:
        teacher: a transformers model of a type :func:`primaldual.integrations.hf.convert` supports: a causal LM, or
            a bidirectional encoder (``primal`` students only; causal or not as each layer is).
        student, layers, steps, init, lr, options: as :func:`primaldual.convert.convert`.
        batches: batches of the teacher's data, each ``(input_ids (B, N), attention_mask (B, N) or None)`` or a
            mapping of the model's inputs (``{"pixel_values": images}``, ``{"input_ids": ..., "attention_mask":
            ...}``); the first calibrates the initialisation, the next ``steps`` train stage 1.
        log_every: a stage-1 history row every ``log_every`` updates (and at the first and last); ``on_log(row)`` is
            called with each as it is made.
        on_checkpoint: called every ``log_every`` updates of stage 1 (not at its end) with what ``resume`` takes: the
            new parameters by name, Adam's state, ``step``, ``history``, ``init`` and the random state. A stage 1
            given it back as ``resume`` continues there; ``batches`` must be the same stream from its start (the
            calibration batch and the updates done are skipped), so the result equals an uninterrupted one.

    Returns:
        ``(model, report)``: report holds ``layers``, ``init`` (per-layer figures) and ``history`` (stage 1).
    """
    check_stages(init, steps, log_every)
    name, fixed = check_student(student, options)
    hf = _hf()
    _, blocks = hf.find_blocks(teacher)
    chosen = resolve_layer_indices(layers, len(blocks))
    sites = [hf.read_site(teacher, blocks[i], i) for i in chosen]
    if not all(site.causal for site in sites):
        check_student(student, options, causal=False)  # the window students look back: causal layers only
    check_student_windows(student, chosen, sites, options)
    model = hf.convert(copy.deepcopy(teacher), name, chosen, **fixed, **options)
    report = initialise_and_transfer(
        teacher,
        model,
        chosen,
        HF_READER,
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


def _reader_io(
    teacher: nn.Module, inputs: Tensor | Mapping[str, Any], mask: Tensor | None, layers: Sequence[int]
) -> list[tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None, Tensor | None]]:
    """:func:`hf_attention_io` with each layer's bool key mask: a batch's ``attention_mask`` (a mapping carries its
    own) as the model is given it."""
    if isinstance(inputs, Mapping):
        mask, io = inputs.get("attention_mask"), hf_attention_io(teacher, inputs, None, layers)
    else:
        io = hf_attention_io(teacher, inputs, mask, layers)
    key = _key_mask(mask)
    return [(x, y, rope, key) for x, y, rope in io]


#: how :func:`~primaldual.convert.external.initialise_and_transfer` reads a transformers model
HF_READER = Reader(io=_reader_io, students=hf_student_layers, teacher_layer=hf_teacher_layer, batch=_batch)
