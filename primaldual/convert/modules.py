"""Converting a model whose attention is hand-written: modules with linear query / key / value and output
projections, called on the tokens alone (``attn(x)``), as nanoGPT's and minGPT's ``CausalSelfAttention``, timm's
``Attention`` (DiT, MAE) and much research code write it.

:func:`convert_modules` is :func:`primaldual.convert.convert` for such a model: the user names the modules by an
attribute-path pattern (``"transformer.h.*.attn"``) and their projections (one fused ``qkv`` linear map in the
order query, key, value, or three; the output map), and says whether they are causal, since a hand-written module
does not show it. The chosen modules are swapped for :class:`ModuleAttention` stand-ins (the same call and return)
holding the students, initialised from the teacher and trained by the same stage 1 (:mod:`primaldual.convert.external`).

What a module computes beyond its projections cannot be read from its weights. Each layer rebuilt from them is
therefore run on the layer's recorded input and compared with the module's own output before anything is fitted
(:func:`~primaldual.convert.external.check_rebuilt`): rotary tables, norms or another scale inside the module, or a
wrong ``causal``, stop the conversion with an error that names the layer.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch import Tensor, nn

from ..attention.base import AttentionLayer
from ..integrations.torch_nn import attention_from_projections, keep_frozen, resolve_layer_indices, with_original
from .external import Reader, check_stages, initialise_and_transfer, record_calls
from .students import check_student

__all__ = ["HEAD_ATTRIBUTES", "ModuleAttention", "convert_modules", "find_modules", "layer_from_module"]

#: the attributes a module's head count is looked up under when ``heads`` is not given (first found wins)
HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "heads", "num_attention_heads")


class ModuleAttention(nn.Module):
    """A primaldual attention in place of a hand-written attention module: ``forward(x)`` ``(B, N, C) -> (B, N, C)``
    (zero at no token: these modules take no mask). ``attn``: the layer."""

    def __init__(self, layer: AttentionLayer) -> None:
        super().__init__()
        self.attn = layer

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if _given(args, kwargs):
            raise TypeError(
                f"{type(self).__name__} takes the tokens alone (attn(x); other arguments None, such as "
                f"attn_mask=None), as the module it replaced was called when it was converted; got "
                f"{_given(args, kwargs)}"
            )
        return self.attn(x)

    def extra_repr(self) -> str:
        return f"causal={self.attn.causal}"


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
    teacher: nn.Module, batch: Any, layers: Sequence[int], paths: Sequence[str]
) -> list[tuple[Tensor, Tensor]]:
    """Each of ``layers``' (indices into ``paths``) input ``x`` and output ``y``, both ``(B, N, C)``, from one forward
    of ``teacher`` on ``batch`` in eval mode, without gradients."""

    def read(i: int, mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> tuple[Tensor, Tensor]:
        if not args or _given(args[1:], kwargs) or not isinstance(args[0], Tensor) or args[0].dim() != 3:
            raise ValueError(
                f"layer {i} ({paths[i]}) was called with {_given(args[1:], kwargs) or 'no tokens'} beside its "
                "tokens: convert_modules converts attention modules called on the tokens alone, attn(x) with x "
                "(B, N, C) (other arguments None, such as attn_mask=None)"
            )
        if not isinstance(out, Tensor) or out.shape != args[0].shape:
            raise ValueError(f"layer {i} ({paths[i]}) returned {type(out).__name__}, not tokens of its input's shape")
        return args[0].detach().clone(), out.detach().clone()  # copies: the model may change them in place

    modules = {i: teacher.get_submodule(paths[i]) for i in layers}
    return record_calls(teacher, batch, modules, read, lambda i: f"layer {i} ({paths[i]})")


def _reader(paths: Sequence[str], layout: dict[str, Any], causal: bool) -> Reader:
    def io(teacher: nn.Module, batch: Any, _: Tensor | None, layers: Sequence[int]) -> list[tuple]:
        return [(x, y, None, None) for x, y in modules_attention_io(teacher, batch, layers, paths)]

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
        teacher: any ``nn.Module`` whose attention modules are called as ``attn(x)`` on ``(B, N, C)`` tokens and
            compute ``proj(softmax(q k^T * scale) v)`` from linear projections of ``x`` (no mask, rotary tables or
            norms inside; the check against the teacher's output refuses them).
        student, layers, steps, init, lr, log_every, on_log, resume, on_checkpoint, options: as
            :func:`~primaldual.convert.hf.convert_hf` (``layers`` index :func:`find_modules`'s list).
        modules: which modules: an attribute-path pattern, ``*`` for one name (``"transformer.h.*.attn"``).
        qkv, proj, heads: the projections and head count (:func:`layer_from_module`).
        causal: whether the modules are causal (each token attends to itself and earlier ones); a wrong value is
            caught by the check against the teacher's output.
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
    model = copy.deepcopy(teacher)
    for i in chosen:
        parent, _, attr = paths[i].rpartition(".")
        old = model.get_submodule(paths[i])
        if isinstance(old, ModuleAttention):
            raise ValueError(f"layers: layer {i} ({paths[i]}) is already converted")
        layer = layer_from_module(old, name, causal=causal, **layout, **fixed, **options)
        setattr(model.get_submodule(parent), attr, ModuleAttention(layer).train(old.training))  # its mode
    report = initialise_and_transfer(
        teacher,
        model,
        chosen,
        _reader(paths, layout, causal),
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
