"""The teacher initialisation and a resumable stage 1 for a model primaldual did not build.

:func:`~primaldual.convert.hf.convert_hf` (transformers models), :func:`~primaldual.convert.timm.convert_timm` (timm
vision transformers), :func:`~primaldual.convert.torch_nn.convert_torch` (models whose attention is
``nn.MultiheadAttention``) and :func:`~primaldual.convert.modules.convert_modules` (hand-written attention) differ
only in how they find a layer and read its inputs; a :class:`Reader` says that, and :func:`initialise_and_transfer`
does the rest the same way for each: the KSVD and least-squares initialisation on the calibration batch (after
:func:`check_rebuilt` has compared each layer rebuilt from the teacher's weights with the teacher's own), then
:func:`~primaldual.convert.transfer.attention_transfer` with checkpoints a killed stage 1 resumes from.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer
from .init import init_from_teacher, rebuild_error
from .students import new_parameters
from .transfer import TransferState, attention_transfer, evaluating

__all__ = [
    "CHECKPOINT_KEYS",
    "INITS",
    "Reader",
    "call_model",
    "check_batches",
    "check_rebuilt",
    "check_stages",
    "initialise_and_transfer",
    "record_calls",
]

#: the ``init`` choices of a conversion
INITS = ("teacher", "random")
#: what a stage-1 checkpoint (``on_checkpoint``'s argument, ``resume``) holds
CHECKPOINT_KEYS = frozenset({"params", "optimizer", "step", "history", "init", "rng"})


def check_stages(init: str, steps: int, log_every: int = 10) -> None:
    """The initialisation and stage-1 arguments of :func:`~primaldual.convert.convert`,
    :func:`~primaldual.convert.hf.convert_hf`, :func:`~primaldual.convert.timm.convert_timm` and
    :func:`~primaldual.convert.torch_nn.convert_torch`."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    if not isinstance(log_every, int) or isinstance(log_every, bool) or log_every < 1:
        raise ValueError(f"log_every must be an int >= 1, got {log_every!r}")


def check_batches(batches: Any) -> None:
    """The ``batches`` argument of a conversion that reads the teacher: an iterable of batches, not one batch."""
    if batches is None:
        raise ValueError("batches: needed for the teacher initialisation and for stage 1")
    one = isinstance(batches, tuple) and any(isinstance(b, Tensor) for b in batches)  # (x, padding): one batch
    # [x, padding] written for [(x, padding)]: tensors as items, a bool one after one that is not
    tensors = [b for b in batches if isinstance(b, Tensor)] if isinstance(batches, list) else []
    one = one or (
        isinstance(batches, list)
        and len(tensors) == len(batches) > 1
        and tensors[0].dtype != torch.bool
        and any(t.dtype == torch.bool for t in tensors[1:])
    )
    if one or isinstance(batches, Tensor | Mapping) or not isinstance(batches, Iterable):
        raise TypeError(
            f"batches: an iterable of batches (a list, a generator, a data loader), got {type(batches).__name__}; "
            "wrap a single batch as [batch]"
        )


def check_rebuilt(
    index: int, rebuilt: AttentionLayer, x: Tensor, y: Tensor, mask: Tensor | None, rope: Any = None
) -> float:
    """The relative error of layer ``index`` rebuilt from the teacher's weights (``rebuilt``) against the teacher's
    own output ``y`` on its input ``x`` (:func:`~primaldual.convert.init.rebuild_error`); an error above rounding
    (1e-3, or 3e-2 for 16-bit outputs) is a ``ValueError``. The initialisation fits the rebuilt layer: a teacher
    that computes something its weights do not show (rotary tables or norms inside a hand-written block, another
    scale, a mask the reader does not see) would be converted to the wrong target without a word."""
    error = rebuild_error(rebuilt, x, y, mask, rope)
    tolerance = 1e-3 if torch.finfo(y.dtype).bits >= 32 else 3e-2
    if not error <= tolerance:  # NaN included
        raise ValueError(
            f"layer {index}: the teacher's attention rebuilt from its weights is {error:.3g} (relative) away from "
            f"the layer's own output on the calibration batch (rounding allows {tolerance:g}): the layer computes "
            "something its weights do not show (rotary embeddings, norms, another scale or mask), so it cannot be "
            "converted"
        )
    return error


def call_model(model: nn.Module, batch: Any) -> Any:
    """Call ``model`` on one batch of a conversion's stream: a tensor as ``model(x)``, a tuple as ``model(*batch)``,
    a mapping as ``model(**batch)``."""
    if isinstance(batch, Tensor):
        return model(batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    raise TypeError(
        f"batches: each batch is what the model is called with (a tensor, a tuple of positional arguments or a "
        f"mapping of keyword arguments), got {type(batch).__name__}"
    )


def record_calls(
    teacher: nn.Module,
    batch: Any,
    modules: Mapping[int, nn.Module],
    read: Callable[[int, nn.Module, tuple, dict, Any], Any],
    label: Callable[[int], str],
    plural: str = "layers",
) -> list[Any]:
    """One forward of ``teacher`` on ``batch`` (:func:`call_model`) in eval mode without gradients, each call of
    ``modules`` (layer index -> module) read by ``read(i, module, args, kwargs, out)``; the reads in the order of
    ``modules``. A module called twice, or not at all, is an error that ``label(i)`` names."""
    seen: dict[int, Any] = {}

    def hook_for(i: int) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            if i in seen:
                raise ValueError(f"{label(i)} ran twice in one forward: the transfer reads one call per layer")
            seen[i] = read(i, mod, args, kwargs, out)

        return hook

    hooks = [m.register_forward_hook(hook_for(i), with_kwargs=True) for i, m in modules.items()]
    try:
        with torch.no_grad(), evaluating(teacher):
            call_model(teacher, batch)
    finally:
        for h in hooks:
            h.remove()
    missing = [i for i in modules if i not in seen]
    if missing:
        raise ValueError(f"{plural} {missing} did not run in the teacher's forward on this batch")
    return [seen[i] for i in modules]


#: ``io(teacher, inputs, mask, layers)``: per layer ``(x (B, N, C), y (B, N, C), rope or None, key_mask or None)``
IO = Callable[[nn.Module, Any, Tensor | None, Sequence[int]], list[tuple[Tensor, Tensor, Any, Tensor | None]]]


@dataclass(frozen=True)
class Reader:
    """How a conversion reads one family of models.

    Attributes:
        io: one teacher forward in eval mode, no gradients: per converted layer its attention input ``x``, output
            ``y`` (zero at padded tokens, before any residual), rotary tables (or None) and key mask ``(B, N)`` bool
            (True = real token, or None).
        students: ``(model, layers)`` -> the primaldual attention layers in the converted copy's ``layers``.
        teacher_layer: ``(teacher, layer)`` -> that layer of the teacher as a primaldual softmax layer with its
            weights (what the initialisation reads per-head outputs from).
        batch: one item of the user's ``batches`` -> ``(inputs, mask)`` for ``io`` (default: the item, no mask).
    """

    io: IO
    students: Callable[[nn.Module, Sequence[int]], list[AttentionLayer]]
    teacher_layer: Callable[[nn.Module, int], AttentionLayer]
    batch: Callable[[Any], tuple[Any, Tensor | None]] = lambda item: (item, None)


def initialise_and_transfer(
    teacher: nn.Module,
    model: nn.Module,
    layers: Sequence[int],
    reader: Reader,
    batches: Iterable[Any] | None,
    *,
    student: str,
    steps: int,
    init: str,
    lr: float,
    log_every: int,
    on_log: Callable[[dict[str, float]], None] | None,
    resume: dict[str, Any] | None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    """Initialise the students of ``model`` (the converted copy of ``teacher``) and run stage 1.

    ``batches`` are the user's (each made ``(inputs, mask)`` by ``reader.batch``): the first calibrates the
    initialisation (with ``init="teacher"``), the next ``steps`` train stage 1; they are not read where nothing
    trains (the ``window`` student, or ``init="random"`` without stage 1). The other arguments are
    :func:`~primaldual.convert.hf.convert_hf`'s. Returns the report: ``layers``, ``init`` (per-layer figures) and
    ``history`` (stage 1).
    """
    report: dict[str, Any] = {"layers": list(layers), "init": {}, "history": []}
    if student == "window" or (init != "teacher" and not steps):
        return report
    check_batches(batches)
    batches = map(reader.batch, batches)
    if resume is not None:
        if not isinstance(resume, Mapping) or (missing := sorted(CHECKPOINT_KEYS - set(resume))):
            what = f"it lacks {missing}" if isinstance(resume, Mapping) else f"got {type(resume).__name__}"
            raise ValueError(f"resume: expected a stage-1 checkpoint (what on_checkpoint was handed); {what}")
        if steps <= resume["step"]:
            raise ValueError(
                f"resume: the checkpoint is at stage-1 update {resume['step']}; steps must be above it, got {steps}"
            )
        made = "teacher" if resume.get("calibrated", init == "teacher") else "random"
        if made != init:  # the calibration batch is drawn only with init="teacher": the batches would not line up
            raise ValueError(f"resume: the checkpoint was made with init={made!r}, this call has init={init!r}")
    if init == "teacher":
        inputs, mask = _next(batches, "batches: empty; the first batch calibrates the teacher initialisation")
        if resume is None:
            io = reader.io(teacher, inputs, mask, layers)
            for i, layer, (x, y, rope, key) in zip(layers, reader.students(model, layers), io, strict=True):
                rebuilt = reader.teacher_layer(teacher, i)
                error = check_rebuilt(i, rebuilt, x, y, key, rope)
                use = rope if type(layer).capabilities.rope else None
                report["init"][i] = {**init_from_teacher(layer, rebuilt, x, key, use), "rebuild_error": error}
    if not steps:
        return report
    state, opt, names = _stage1_state(model, reader.students(model, layers), lr, resume, report)
    for k in range(state.step):  # the updates done before: their batches, drawn again
        _next(batches, f"batches: ran out after {k} of the {state.step} batches the resumed stage 1 had used")
    if resume is not None:  # after those draws, so that a stream drawing from torch's generator lines up
        _set_rng_state(resume["rng"])

    def checkpoint(st: TransferState, optimiser: torch.optim.Optimizer) -> None:
        if on_checkpoint is not None and st.step % log_every == 0 and st.step < steps:
            params = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
            # copies: Adam's moments and the history change in place as stage 1 goes on
            on_checkpoint({"params": params, "optimizer": copy.deepcopy(optimiser.state_dict()), "step": st.step,
                           "history": list(st.history), "init": report["init"], "calibrated": init == "teacher",
                           "rng": _rng_state()})  # fmt: skip

    state = attention_transfer(
        teacher,
        model,
        layers,
        batches,
        steps,
        optimizer=opt,
        state=state,
        log_every=log_every,
        on_log=on_log,
        on_step=checkpoint,
        io_fn=reader.io,
        layers_fn=reader.students,
    )
    report["history"] = state.history
    return report


def _stage1_state(
    model: nn.Module, students: Sequence[AttentionLayer], lr: float, resume: dict[str, Any] | None, report: dict
) -> tuple[TransferState, torch.optim.Optimizer, set[str]]:
    """Stage 1's optimiser over the students' new parameters (their names returned), fresh or as ``resume`` left
    it; a resumed stage 1 also takes back its parameters, progress and initialisation figures (the caller restores
    the random state once the batches already used are drawn again)."""
    params = [p for layer in students for p in new_parameters(layer)]
    ids = {id(p) for p in params}
    names = {n for n, p in model.named_parameters() if id(p) in ids}
    opt = torch.optim.Adam(params, lr=lr)
    if resume is None:
        return TransferState(), opt, names
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if n in names}
    theirs = {n: tuple(t.shape) for n, t in resume["params"].items()}
    if theirs != shapes:
        raise ValueError(
            "resume: its parameters are not this conversion's (another student, layer set, model or options such as "
            f"s or max_len): {_first_difference(theirs, shapes)}"
        )
    model.load_state_dict(resume["params"], strict=False)
    opt.load_state_dict(copy.deepcopy(resume["optimizer"]))  # Adam updates its state in place: keep the caller's
    for group in opt.param_groups:
        group["lr"] = lr  # this call's, as for a fresh stage 1 (the loaded state carries the checkpoint's)
    report["init"] = resume["init"]
    return TransferState(resume["step"], list(resume["history"])), opt, names


def _first_difference(theirs: dict[str, tuple], ours: dict[str, tuple]) -> str:
    for name in sorted(set(theirs) | set(ours)):
        if theirs.get(name) != ours.get(name):
            return f"{name} is {theirs.get(name, 'absent')} there, {ours.get(name, 'absent')} here"
    return ""


def _next(batches: Iterator[Any], message: str) -> Any:
    try:
        return next(batches)
    except StopIteration:
        raise ValueError(message) from None


def _set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["cpu"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _rng_state() -> dict[str, Any]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"cpu": torch.get_rng_state(), "cuda": cuda}
