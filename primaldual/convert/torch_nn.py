"""Converting a trained model built on PyTorch's own layers: the self-attention of an ``nn.TransformerEncoder`` or
``nn.TransformerDecoder``, or the ``nn.MultiheadAttention`` modules of a model's own blocks.

:func:`convert_torch` is :func:`primaldual.convert.convert` for such a model: a converted copy (the teacher is left
unchanged) whose chosen layers are :class:`~primaldual.integrations.torch_nn.MultiheadSelfAttention` stand-ins
holding the students of :mod:`primaldual.convert` (the same call and return as ``nn.MultiheadAttention``),
initialised from the teacher and trained by the same stage 1 (:mod:`primaldual.convert.external`).

The teacher's layer inputs and outputs are read by hooks on its ``nn.MultiheadAttention`` modules, with the key
padding mask and causal mask each layer is given, so the model is called exactly as its own code calls it (its
embedding, positional code and masks are the user's; nothing here needs to know them). PyTorch's fused encoder
fast path, which skips those modules in eval mode, is turned off for the recording forward only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer
from ..integrations.torch_nn import (
    MultiheadSelfAttention,
    call_is_causal,
    key_mask_from_padding_mask,
    resolve_layer_indices,
    same_tensor,
)
from .external import Reader, check_stages, initialise_and_transfer, record_calls
from .students import check_student

__all__ = ["convert_torch", "find_attention", "torch_attention_io"]

STACKS = (nn.TransformerEncoder, nn.TransformerDecoder)


def find_attention(model: nn.Module, stack: str | None = None) -> tuple[list[str], bool]:
    """The attribute paths of the self-attention modules to convert, in order (what ``layers`` index), and whether
    they are a decoder's (causal by default).

    * ``stack`` None: the ``self_attn`` of the layers of the one ``nn.TransformerEncoder`` / ``nn.TransformerDecoder``
      in ``model`` (``model`` itself counts); with none, every ``nn.MultiheadAttention`` of ``model`` (a model built
      of its own blocks, or of PyTorch's layers without their stack; a decoder layer's cross-attention is left
      out); with several (an ``nn.Transformer`` holds both), an error asking for ``stack``.
    * ``stack`` the attribute path of a submodule (``"transformer.encoder"``, ``"blocks"``): the same rule inside it.
    """
    root = ""
    if stack is not None:
        if not isinstance(stack, str):
            raise TypeError(f"stack must be an attribute path (str) such as 'encoder', got {type(stack).__name__}")
        try:
            model = model.get_submodule(stack)
        except AttributeError:
            raise ValueError(f"stack: {type(model).__name__} has no submodule {stack!r}") from None
        root = f"{stack}." if stack else ""
    stacks = [(name, m) for name, m in model.named_modules() if isinstance(m, STACKS)]
    if len(stacks) > 1:
        where = ", ".join(repr(root + name) for name, _ in stacks)
        raise ValueError(
            f"{type(model).__name__} holds {len(stacks)} nn.TransformerEncoder / nn.TransformerDecoder stacks "
            f"({where}); name the one to convert with stack='...'"
        )
    if stacks:
        name, found = stacks[0]
        prefix = f"{root}{name}." if name else root
        return [f"{prefix}layers.{i}.self_attn" for i in range(len(found.layers))], isinstance(found, STACKS[1])
    # a converted copy's stand-ins count: the same indices name the same layers before and after; the
    # cross-attention of PyTorch's decoder layers (multihead_attn) is known not to be self-attention
    cross = {id(m.multihead_attn) for m in model.modules() if isinstance(m, nn.TransformerDecoderLayer)}
    kinds = nn.MultiheadAttention | MultiheadSelfAttention
    paths = [root + n for n, m in model.named_modules() if isinstance(m, kinds) and id(m) not in cross]
    if not paths:
        raise ValueError(
            f"{type(model).__name__} holds no nn.MultiheadAttention, nn.TransformerEncoder or nn.TransformerDecoder"
        )
    return paths, False


def _argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    """``nn.MultiheadAttention.forward``'s argument ``name`` (position ``index``) as it was called."""
    return args[index] if len(args) > index else kwargs.get(name, default)


@torch.no_grad()
def torch_attention_io(
    teacher: nn.Module, batch: Any, layers: Sequence[int], *, stack: str | None = None
) -> list[tuple[Tensor, Tensor, Tensor | None, bool]]:
    """The self-attention input ``x`` ``(B, N, C)``, output ``y`` ``(B, N, C)`` (after the output projection, zero
    at padded tokens), key mask ``(B, N)`` bool (True = real token, or None) and mode (causal or not) of each of
    ``layers`` (indices into :func:`find_attention`'s list), from one forward of ``teacher`` on ``batch`` in eval
    mode (see :func:`convert_torch` for ``batch``)."""
    paths, _ = find_attention(teacher, stack)
    modules = {}
    for i in layers:
        mha = teacher.get_submodule(paths[i])
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"layers: layer {i} ({paths[i]}) is a {type(mha).__name__}, not an nn.MultiheadAttention")
        modules[i] = mha

    def read(i: int, mod: nn.MultiheadAttention, args: tuple, kwargs: dict, out: Any) -> tuple:
        q = _argument(args, kwargs, 0, "query")
        if not same_tensor(_argument(args, kwargs, 1, "key"), q) or not same_tensor(
            _argument(args, kwargs, 2, "value"), q
        ):
            raise ValueError(
                f"layer {i} ({paths[i]}) was called with keys or values other than its queries: not "
                "self-attention (name the module holding the self-attention layers with stack='...')"
            )
        unbatched = q.dim() == 2
        x = q[None] if unbatched else (q if mod.batch_first else q.transpose(0, 1))  # (B, N, C)
        y = out[0][None] if unbatched else (out[0] if mod.batch_first else out[0].transpose(0, 1))  # (B, N, C)
        B, N, _ = x.shape
        padding = _argument(args, kwargs, 3, "key_padding_mask")
        if unbatched and padding is not None:
            padding = padding[None]  # (N,) -> (1, N)
        key = key_mask_from_padding_mask(padding, B, N)
        attn_mask, is_causal = (
            _argument(args, kwargs, 5, "attn_mask"),
            _argument(args, kwargs, 7, "is_causal", False),
        )
        causal = call_is_causal(attn_mask, is_causal, N)
        if key is not None:
            y = y.masked_fill(~key[..., None], 0.0)  # the students' outputs are zero at padded tokens
        return x.detach().clone(), y.detach().clone(), key, causal  # copies: in-place code may change them

    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fused encoder layer would not call self_attn
    try:
        return record_calls(teacher, batch, modules, read, lambda i: f"layer {i}")
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


def _reader(stack: str | None, causal: bool) -> Reader:
    """How :func:`~primaldual.convert.external.initialise_and_transfer` reads a model of ``nn.MultiheadAttention``
    layers whose students are ``causal`` (or not); a layer called in the other mode is an error."""

    def io(teacher: nn.Module, batch: Any, _: Tensor | None, layers: Sequence[int]) -> list[tuple]:
        out = torch_attention_io(teacher, batch, layers, stack=stack)
        for i, (*_, mode) in zip(layers, out):
            if mode != causal:
                raise ValueError(
                    f"causal: layer {i} of the teacher was called {'causal' if mode else 'bidirectional'}, but the "
                    f"students are built with causal={causal}; pass causal={mode}"
                )
        return [(x, y, None, key) for x, y, key, _ in out]

    def students(model: nn.Module, layers: Sequence[int]) -> list[AttentionLayer]:
        paths, _ = find_attention(model, stack)
        return [model.get_submodule(paths[i]).attn for i in layers]

    def teacher_layer(teacher: nn.Module, index: int) -> AttentionLayer:
        mha = teacher.get_submodule(find_attention(teacher, stack)[0][index])
        where = f"layer {index} ({find_attention(teacher, stack)[0][index]})"
        return MultiheadSelfAttention.from_torch(mha, "softmax", causal=causal, where=where).attn.eval()

    return Reader(io=io, students=students, teacher_layer=teacher_layer)


def convert_torch(
    teacher: nn.Module,
    student: str = "primal",
    layers: int | Sequence[int] | str = (-1,),
    *,
    stack: str | None = None,
    causal: bool | None = None,
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
    """A converted copy of ``teacher`` (left unchanged), a model whose attention is PyTorch's: swap, initialisation,
    stage 1.

    Args:
        teacher: any ``nn.Module`` whose self-attention layers are ``nn.MultiheadAttention`` modules (those of an
            ``nn.TransformerEncoder`` / ``nn.TransformerDecoder``, or of its own blocks).
        student, layers, steps, init, lr, log_every, on_log, resume, on_checkpoint, options: as
            :func:`~primaldual.convert.hf.convert_hf` (``layers`` index :func:`find_attention`'s list).
        stack: where the self-attention layers are (:func:`find_attention`): by default the one
            ``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` stack, or with none every ``nn.MultiheadAttention``
            of ``teacher``; an attribute path (``"transformer.encoder"``, ``"blocks"``) looks inside that module.
        causal: the students' mode; default False for an encoder stack and True for a decoder's self-attention.
            Every converted layer must be called in that mode (``is_causal=True`` or a causal mask), which is
            checked on each batch read.
        batches: what ``teacher`` is called with, one item per forward: a tensor (``teacher(x)``), a tuple of
            positional arguments (``teacher(x, padding_mask)``) or a mapping of keyword arguments; masks are read
            where the model hands them to its layers. The first calibrates the initialisation, the next ``steps``
            train stage 1.

    Returns:
        ``(model, report)``: report holds ``layers``, ``init`` (per-layer figures) and ``history`` (stage 1).
        Stage 2 is training the returned model on its task's loss plus :func:`primaldual.collect_aux_loss`.
    """
    check_stages(init, steps, log_every)
    paths, decoder = find_attention(teacher, stack)
    if causal is None:
        causal = decoder
    elif not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool or None, got {causal!r} ({type(causal).__name__})")
    name, fixed = check_student(student, options, causal)
    chosen = resolve_layer_indices(layers, len(paths))
    model = copy.deepcopy(teacher)
    for i in chosen:
        parent, _, attr = paths[i].rpartition(".")
        mha = model.get_submodule(paths[i])
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"layers: layer {i} ({paths[i]}) is a {type(mha).__name__}, not an nn.MultiheadAttention")
        where = f"layer {i} ({paths[i]})"
        stand_in = MultiheadSelfAttention.from_torch(mha, name, causal=causal, where=where, **fixed, **options)
        setattr(model.get_submodule(parent), attr, stand_in.train(mha.training))  # the mode of what it replaces
    for where, m in model.named_modules():
        if isinstance(m, nn.TransformerEncoder) and any(paths[i].startswith(f"{where}.") for i in chosen):
            m.use_nested_tensor = False  # its nested-tensor fast path would bypass the stand-ins
    report = initialise_and_transfer(
        teacher,
        model,
        chosen,
        _reader(stack, causal),
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
