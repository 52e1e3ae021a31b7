"""Converting a model whose attention is hand-written: modules with linear query / key / value and output
projections, called on the tokens (``attn(x)``, or ``attn(x, mask)`` with a padding mask), as nanoGPT's and minGPT's
``CausalSelfAttention``, timm's ``Attention`` (DiT, MAE) and much research code write it.

:func:`convert_modules` is :func:`primaldual.convert.convert` for such a model: the user names the modules by an
attribute-path pattern (``"transformer.h.*.attn"``) and their projections (one fused ``qkv`` linear map in the
order query, key, value, or three; the output map), and says whether they are causal, since a hand-written module
does not show it. The chosen modules are swapped for :class:`ModuleAttention` stand-ins (the same call and return)
holding the students, initialised from the teacher and trained by the same stage 1 (:mod:`primaldual.convert.external`).

What a module computes beyond its projections cannot be read from its weights. Each layer rebuilt from them is
therefore run on the layer's recorded input and compared with the module's own output before anything is fitted
(:func:`~primaldual.convert.external.check_rebuilt`): rotary tables, norms or another scale inside the module, or a
wrong ``causal``, stop the conversion with an error that names the layer.

**Masks.** A module that takes a mask names the argument (``mask="mask"``: a parameter of its ``forward``, passed by
keyword or position) and its convention (``mask_kind``, :data:`MASK_KINDS`): ``"keep"``, a ``(B, N)`` bool or 0 / 1
mask, True = real token (Hugging Face's ``attention_mask``); ``"pad"``, a ``(B, N)`` mask, True (or ``-inf``) =
padding (``nn.MultiheadAttention``'s ``key_padding_mask``); ``"attend"``, a dense bool (True = may attend) or additive
float mask broadcastable to ``(B, H, N, N)`` (SDPA's ``attn_mask``), which must say nothing but padding (and
causality, for causal modules). The teacher's calls are read with it, and the stand-in reads it the same way; the
students' outputs are zero at padded tokens, as the targets are made.
"""

from __future__ import annotations

import copy
import fnmatch
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer
from ..integrations.torch_nn import (
    attention_from_projections,
    keep_frozen,
    key_mask_from_attention_mask,
    key_mask_from_padding_mask,
    resolve_layer_indices,
    with_original,
)
from .external import Reader, check_stages, initialise_and_transfer, record_calls
from .students import check_student

__all__ = [
    "HEAD_ATTRIBUTES",
    "MASK_KINDS",
    "MaskArgument",
    "ModuleAttention",
    "convert_modules",
    "find_modules",
    "layer_from_module",
]

#: the attributes a module's head count is looked up under when ``heads`` is not given (first found wins)
HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "heads", "num_attention_heads")

#: how a module's mask says which tokens are real (see the module docstring)
MASK_KINDS = ("keep", "pad", "attend")


class MaskArgument:
    """Where a hand-written attention module's calls carry their mask and what it means: the ``forward`` parameter
    ``name`` (by keyword, or by position among ``positional``, the parameters after the tokens) of kind ``kind``
    (:data:`MASK_KINDS`); ``name`` None for a module that takes none."""

    def __init__(self, module: nn.Module, name: str | None, kind: str, causal: bool) -> None:
        params = list(inspect.signature(module.forward).parameters.values())[1:]  # after the tokens
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.positional = tuple(p.name for p in params if p.kind in positional)
        if name is not None:
            if not isinstance(name, str):
                raise TypeError(f"mask must be the name of the module's mask parameter or None, got {name!r}")
            names = {p.name for p in params}
            takes_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
            if name not in names and not takes_any:
                raise ValueError(
                    f"mask: {type(module).__name__}.forward has no parameter {name!r} (it takes {sorted(names)})"
                )
        if kind not in MASK_KINDS:
            raise ValueError(f"mask_kind must be one of {', '.join(map(repr, MASK_KINDS))}, got {kind!r}")
        self.name, self.kind, self.causal = name, kind, causal

    def split(self, args: tuple, kwargs: dict) -> tuple[Any, str]:
        """``(the mask passed or None, the other arguments that carry something, as a message names them)``."""
        bound = dict(zip(self.positional, args))
        extra = [f"argument {i + 2}" for i, a in enumerate(args[len(self.positional) :]) if a is not None]
        for key, value in kwargs.items():
            if key in bound:
                raise TypeError(f"attention module got multiple values for argument {key!r}")
            bound[key] = value
        mask = bound.pop(self.name, None) if self.name is not None else None
        given = extra + [f"{k}=..." for k, v in bound.items() if v is not None]
        return mask, ", ".join(given)

    def keys(self, mask: Any, batch: int, n: int) -> Tensor | None:
        """The mask passed as primaldual's ``(B, N)`` key mask (True = real token), or None when all are real."""
        if mask is None:
            return None
        what = f"{self.name} (mask_kind={self.kind!r})"
        if self.kind == "pad":
            return key_mask_from_padding_mask(mask, batch, n, name=what)
        if self.kind == "attend":
            return key_mask_from_attention_mask(mask, batch=batch, q_len=n, kv_len=n, causal=self.causal, name=what)
        if not isinstance(mask, Tensor) or tuple(mask.shape) != (batch, n):
            shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"{what} must be a tensor of shape (B, N) = ({batch}, {n}), got {shape}")
        if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"{what} must be bool or hold 0 (padding) and 1 (real token)")
        keys = mask != 0
        return None if bool(keys.all()) else keys


class ModuleAttention(nn.Module):
    """A primaldual attention in place of a hand-written attention module: ``forward(x, ...)`` ``(B, N, C) -> (B, N,
    C)``, zero at padded tokens. ``attn``: the layer; ``mask``: the :class:`MaskArgument` its calls are read with
    (None: the tokens alone, other arguments None)."""

    def __init__(self, layer: AttentionLayer, mask: MaskArgument | None = None) -> None:
        super().__init__()
        self.attn = layer
        self.mask = mask

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if self.mask is None:
            given, key = _given(args, kwargs), None
        else:
            value, given = self.mask.split(args, kwargs)
            key = None if given else self.mask.keys(value, x.shape[0], x.shape[1])
        if given:
            takes = "the tokens alone" if self.mask is None else f"the tokens and {self.mask.name!r}"
            raise TypeError(
                f"{type(self).__name__} takes {takes} (other arguments None, such as attn_mask=None), as the module "
                f"it replaced was converted; got {given}"
            )
        return self.attn(x, key)

    def extra_repr(self) -> str:
        mask = "" if self.mask is None or self.mask.name is None else f", mask={self.mask.name!r} ({self.mask.kind})"
        return f"causal={self.attn.causal}{mask}"


def _given(args: tuple, kwargs: dict) -> str:
    """The arguments beside the tokens that carry something (not None), as a message names them, or ''."""
    named = [f"argument {i + 2}" for i, a in enumerate(args) if a is not None]
    return ", ".join(named + [f"{k}=..." for k, v in kwargs.items() if v is not None])


def find_modules(model: nn.Module, modules: str) -> list[str]:
    """The attribute paths of ``model``'s submodules matching ``modules``, in the model's order: a path in which
    ``*`` stands for one attribute name (``"transformer.h.*.attn"``, ``"blocks.*.attn"``) or the path of one module."""
    if not isinstance(modules, str) or not modules:
        raise TypeError(f"modules must be an attribute-path pattern such as 'blocks.*.attn', got {modules!r}")
    depth = modules.count(".")
    found = [n for n, _ in model.named_modules() if n and n.count(".") == depth and fnmatch.fnmatchcase(n, modules)]
    if not found:
        raise ValueError(f"modules: no submodule of {type(model).__name__} matches {modules!r}")
    return found


def _linear(module: nn.Module, path: str, role: str) -> nn.Linear:
    try:
        found = module.get_submodule(path)
    except AttributeError:
        raise ValueError(f"{role}: {type(module).__name__} has no submodule {path!r}") from None
    if not isinstance(found, nn.Linear):
        raise TypeError(f"{role}: {path!r} is a {type(found).__name__}, expected an nn.Linear")
    return found


def _heads(module: nn.Module, heads: int | str | None) -> int:
    if heads is None:
        name = next((a for a in HEAD_ATTRIBUTES if isinstance(getattr(module, a, None), int)), None)
        if name is None:
            raise ValueError(
                f"heads: {type(module).__name__} has none of the attributes {HEAD_ATTRIBUTES}; pass heads=<int> or "
                "the attribute's name"
            )
        heads = name
    if isinstance(heads, str):
        value = getattr(module, heads, None)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"heads: {type(module).__name__}.{heads} is {value!r}, not a head count")
        heads = value
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be an int >= 1, an attribute name or None, got {heads!r}")
    return heads


def layer_from_module(
    module: nn.Module,
    attention: str,
    *,
    qkv: str | Sequence[str],
    proj: str,
    heads: int | str | None = None,
    causal: bool,
    **options: Any,
) -> AttentionLayer:
    """Attention ``attention`` built from a hand-written attention ``module`` with its projection weights copied.

    ``qkv``: the path of one fused ``nn.Linear`` ``(3 inner, C)`` (query, key, value in that order, as nanoGPT's
    ``c_attn`` and timm's ``qkv``), or of three (``("q", "k", "v")``); ``proj``: the output ``nn.Linear``;
    ``heads``: the head count, or the attribute holding it (None: :data:`HEAD_ATTRIBUTES`). A float ``scale``
    attribute is the logit scale (timm's); otherwise ``1 / sqrt(head width)``. The module's dropouts are not read
    (pass ``attn_drop`` / ``proj_drop``)."""
    num_heads = _heads(module, heads)
    if isinstance(qkv, str):
        fused = _linear(module, qkv, "qkv")
        if fused.out_features % 3:
            raise ValueError(f"qkv: {qkv!r} has {fused.out_features} outputs, not three equal projections")
        w, b = fused.weight.chunk(3), (None,) * 3 if fused.bias is None else fused.bias.chunk(3)  # 3 x (inner, C)
        q, k, v = zip(w, b)
    elif isinstance(qkv, Sequence) and len(qkv) == 3 and all(isinstance(p, str) for p in qkv):
        q, k, v = ((m.weight, m.bias) for m in (_linear(module, p, "qkv") for p in qkv))
    else:
        raise TypeError(f"qkv must be one attribute path or three, got {qkv!r}")
    out = _linear(module, proj, "proj")
    scale = getattr(module, "scale", None)
    scale = float(scale) if isinstance(scale, float) else None
    layer = attention_from_projections(
        attention,
        num_heads=num_heads,
        q=q,
        k=k,
        v=v,
        out=(out.weight, out.bias),
        causal=causal,
        **with_original(attention, options, scale=scale),
    )
    return keep_frozen(layer, [t for pair in (q, k, v) for t in pair], [out.weight, out.bias])


def modules_attention_io(
    teacher: nn.Module,
    batch: Any,
    layers: Sequence[int],
    paths: Sequence[str],
    masks: Mapping[int, MaskArgument] | None = None,
) -> list[tuple[Tensor, Tensor, Tensor | None]]:
    """Each of ``layers``' (indices into ``paths``) input ``x`` and output ``y``, both ``(B, N, C)`` (``y`` zero at
    padded tokens), and key mask ``(B, N)`` or None, from one forward of ``teacher`` on ``batch`` in eval mode,
    without gradients; ``masks[i]``: how layer ``i``'s calls carry their mask (none: the tokens alone)."""
    masks = masks or {}

    def read(i: int, mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> tuple[Tensor, Tensor, Tensor | None]:
        x = args[0] if args else None
        arg = masks.get(i)
        value, given = arg.split(args[1:], kwargs) if arg is not None else (None, _given(args[1:], kwargs))
        if not isinstance(x, Tensor) or x.dim() != 3 or given:
            takes = "attn(x)" if arg is None or arg.name is None else f"attn(x, {arg.name}=...)"
            raise ValueError(
                f"layer {i} ({paths[i]}) was called with {given or 'no tokens'} beside its tokens: convert_modules "
                f"converts attention modules called as {takes} with x (B, N, C) (other arguments None, such as "
                "attn_mask=None; a mask is named with mask=)"
            )
        if not isinstance(out, Tensor) or out.shape != x.shape:
            raise ValueError(f"layer {i} ({paths[i]}) returned {type(out).__name__}, not tokens of its input's shape")
        key = None if arg is None else arg.keys(value, x.shape[0], x.shape[1])
        y = out.detach().clone()  # copies: the model may change them in place
        if key is not None:
            y = y.masked_fill(~key[..., None], 0.0)  # the students' outputs are zero at padded tokens
        return x.detach().clone(), y, None if key is None else key.clone()

    modules = {i: teacher.get_submodule(paths[i]) for i in layers}
    return record_calls(teacher, batch, modules, read, lambda i: f"layer {i} ({paths[i]})")


def _reader(paths: Sequence[str], layout: dict[str, Any], causal: bool, mask: str | None, kind: str) -> Reader:
    def io(teacher: nn.Module, batch: Any, _: Tensor | None, layers: Sequence[int]) -> list[tuple]:
        masks = (
            {}
            if mask is None
            else {i: MaskArgument(teacher.get_submodule(paths[i]), mask, kind, causal) for i in layers}
        )
        return [(x, y, None, key) for x, y, key in modules_attention_io(teacher, batch, layers, paths, masks)]

    def students(model: nn.Module, layers: Sequence[int]) -> list[AttentionLayer]:
        return [model.get_submodule(paths[i]).attn for i in layers]

    def teacher_layer(teacher: nn.Module, index: int) -> AttentionLayer:
        return layer_from_module(teacher.get_submodule(paths[index]), "softmax", causal=causal, **layout).eval()

    return Reader(io=io, students=students, teacher_layer=teacher_layer)


def convert_modules(
    teacher: nn.Module,
    student: str = "primal",
    layers: int | Sequence[int] | str = (-1,),
    *,
    modules: str,
    qkv: str | Sequence[str],
    proj: str,
    causal: bool,
    heads: int | str | None = None,
    mask: str | None = None,
    mask_kind: str = "keep",
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
    """A converted copy of ``teacher`` (left unchanged), a model with hand-written attention modules: swap,
    initialisation, stage 1.

    Args:
        teacher: any ``nn.Module`` whose attention modules are called as ``attn(x)`` (or with a mask, ``mask``) on
            ``(B, N, C)`` tokens and compute ``proj(softmax(q k^T * scale) v)`` from linear projections of ``x`` (no
            rotary tables or norms inside; the check against the teacher's output refuses them).
        student, layers, steps, init, lr, log_every, on_log, resume, on_checkpoint, options: as
            :func:`~primaldual.convert.hf.convert_hf` (``layers`` index :func:`find_modules`'s list).
        modules: which modules: an attribute-path pattern, ``*`` for one name (``"transformer.h.*.attn"``).
        qkv, proj, heads: the projections and head count (:func:`layer_from_module`).
        causal: whether the modules are causal (each token attends to itself and earlier ones); a wrong value is
            caught by the check against the teacher's output.
        mask, mask_kind: the modules' mask parameter (a name of their ``forward``'s, passed by keyword or position)
            and what it means (:data:`MASK_KINDS`: ``"keep"``, ``"pad"`` or ``"attend"``); None for modules called
            on the tokens alone.
        batches: what ``teacher`` is called with, one item per forward (a tensor, a tuple of positional arguments or a
            mapping of keyword arguments); the first calibrates the initialisation, the next ``steps`` train stage 1.

    Returns:
        ``(model, report)``: report holds ``layers``, ``init`` (per-layer figures, ``rebuild_error`` among them) and
        ``history`` (stage 1). Stage 2 is training the returned model on its task's loss plus
        :func:`primaldual.collect_aux_loss`.
    """
    check_stages(init, steps, log_every)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool (whether the modules are causal), got {causal!r}")
    layout = {"qkv": qkv, "proj": proj, "heads": heads}
    name, fixed = check_student(student, options, causal)
    paths = find_modules(teacher, modules)
    chosen = resolve_layer_indices(layers, len(paths))
    if mask is None and mask_kind != "keep":
        raise ValueError(f"mask_kind: read only with mask (the name of the modules' mask parameter), got {mask_kind!r}")
    model = copy.deepcopy(teacher)
    for i in chosen:
        parent, _, attr = paths[i].rpartition(".")
        old = model.get_submodule(paths[i])
        if isinstance(old, ModuleAttention):
            raise ValueError(f"layers: layer {i} ({paths[i]}) is already converted")
        layer = layer_from_module(old, name, causal=causal, **layout, **fixed, **options)
        reads = MaskArgument(old, mask, mask_kind, causal) if mask is not None else None
        setattr(model.get_submodule(parent), attr, ModuleAttention(layer, reads).train(old.training))  # its mode
    report = initialise_and_transfer(
        teacher,
        model,
        chosen,
        _reader(paths, layout, causal, mask, mask_kind),
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
