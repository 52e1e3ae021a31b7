"""Stage 1 of a conversion: layer-wise, teacher-forced attention transfer (as LoLCATs' first stage).

One teacher forward (eval mode, no gradients) records, for every converted layer, the attention's input (the block's
normalised residual stream) and its output. Each student layer then runs on the *teacher's* input, so the layers
learn independently and one teacher forward serves all of them, and is fitted to the teacher's output by the mean
squared error normalised per layer, ``sum ||y_student - y_teacher||^2 / sum ||y_teacher||^2`` over the real tokens
(1 for a student that outputs zeros, 0 for an exact one). Only the students' new parameters train
(:func:`~primaldual.convert.students.new_parameters`); the layers' KSVD terms (weight ``eta``) are added to the loss,
as in any training of a primal layer
(averaged over the layers, as :func:`~primaldual.collect_aux_loss` does), and reported beside it.

The loop is written here rather than on Lightning because its step is not a model's training step: a frozen
teacher forward, then independent per-layer losses on recorded activations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..aux_loss import aux_loss_terms
from .students import find_blocks, new_parameters

__all__ = ["TransferState", "attention_transfer", "evaluating", "layer_losses", "teacher_attention_io"]


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block; afterwards every submodule is back in its own mode (a frozen
    backbone in eval beside layers in training stays so), exception or not."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, mode in modes:  # parents first; train(), not the flag: a module may do more in it (fold adapters)
            m.train(mode)


@torch.no_grad()
def teacher_attention_io(
    teacher: nn.Module, inputs: Tensor, mask: Tensor | None, layers: Sequence[int], *, masks: bool = False
) -> list[tuple[Tensor, ...]]:
    """The teacher's attention input ``(B, N, C)`` and output ``(B, N, C)`` at each of ``layers``, from one forward
    in eval mode (the teacher's mode is restored; its parameters are not touched).

    Args:
        teacher: a primaldual model, called as ``teacher(inputs, mask)`` (``teacher(inputs)`` when ``mask`` is None).
        inputs: its first argument: token ids ``(B, N)``, features ``(B, N, F)`` or images ``(B, C, H, W)``.
        mask: ``(B, N)`` bool, True = real token, or None.
        masks: also return the key mask each layer was given (a classifier's stack may see another length than
            ``inputs``, e.g. with a class token): items ``(x, y, None, mask)``, the form :func:`layer_losses` reads
            (the third place holds rotary tables, which primaldual blocks apply inside the layer).
    """
    blocks = find_blocks(teacher)
    seen: dict[int, tuple[Tensor, Tensor, Tensor | None]] = {}
    hooks = []
    for i in layers:

        def hook(module: nn.Module, args: tuple, kwargs: dict, out: Any, i: int = i) -> None:
            if i in seen:
                raise ValueError(
                    f"block {i} ran twice in one forward of {type(teacher).__name__} (a tower shared by two inputs, "
                    "as LRA retrieval's): the transfer reads one call per layer"
                )
            m = args[1] if len(args) > 1 else kwargs.get("mask")
            y = out[0] if isinstance(out, tuple) else out
            seen[i] = (args[0].detach().clone(), y.detach().clone(), m)  # copies: in-place code may change them

        hooks.append(blocks[i].attn.register_forward_hook(hook, with_kwargs=True))
    try:
        with evaluating(teacher):
            teacher(inputs) if mask is None else teacher(inputs, mask)
    finally:
        for h in hooks:
            h.remove()
    return [(x, y, None, m) if masks else (x, y) for x, y, m in (seen[i] for i in layers)]


def layer_losses(students: Sequence[nn.Module], io: Sequence[tuple[Tensor, ...]], mask: Tensor | None) -> Tensor:
    """Per-layer normalised output errors ``(L,)`` of the students run on the teacher's inputs (with gradients).

    ``io`` holds ``(x, target)``, ``(x, target, rope)`` or ``(x, target, rope, layer_mask)`` per layer; ``rope``
    (the teacher's rotary tables, or None) is handed to students that take it (``capabilities.rope``);
    ``layer_mask``, where given, is the key mask of that layer in place of ``mask``."""
    losses = []
    for layer, item in zip(students, io, strict=True):
        x, target = item[0], item[1]
        rope = item[2] if len(item) > 2 else None
        m = item[3] if len(item) > 3 else mask
        kw = {"rope": rope} if rope is not None and type(layer).capabilities.rope else {}
        y = layer(x, m, **kw)  # (B, N, C); zero at padded tokens, as the teacher's output
        losses.append((y - target).square().sum() / target.square().sum().clamp_min(1e-30))
    return torch.stack(losses)


IOFn = Callable[[nn.Module, Tensor, Tensor | None, Sequence[int]], list[tuple[Tensor, ...]]]
LayersFn = Callable[[nn.Module, Sequence[int]], list[nn.Module]]


def _primaldual_io(
    teacher: nn.Module, inputs: Tensor, mask: Tensor | None, layers: Sequence[int]
) -> list[tuple[Tensor, ...]]:
    return teacher_attention_io(teacher, inputs, mask, layers, masks=True)


def _primaldual_layers(model: nn.Module, layers: Sequence[int]) -> list[nn.Module]:
    blocks = find_blocks(model)
    return [blocks[i].attn for i in layers]


@dataclass
class TransferState:
    """Progress of a stage-1 run: ``step`` updates done, ``history`` one row per logged step."""

    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


def attention_transfer(
    teacher: nn.Module,
    student: nn.Module,
    layers: Sequence[int],
    batches: Iterable[tuple[Tensor, Tensor | None]],
    steps: int,
    *,
    lr: float = 3e-4,
    optimizer: torch.optim.Optimizer | None = None,
    state: TransferState | None = None,
    log_every: int = 10,
    on_log: Callable[[dict[str, float]], None] | None = None,
    on_step: Callable[[TransferState, torch.optim.Optimizer], None] | None = None,
    io_fn: IOFn = _primaldual_io,
    layers_fn: LayersFn = _primaldual_layers,
) -> TransferState:
    """Train the new parameters of ``student``'s converted ``layers`` to reproduce ``teacher``'s attention outputs.

    Args:
        teacher, student: the trained model and its converted copy (:func:`~primaldual.convert.swap_attention`).
        layers: the converted block indices.
        batches: ``(inputs, mask (B, N) bool or None)``, at least ``steps - state.step`` of them: ``inputs`` is the
            teacher's first argument (token ids ``(B, N)``, features, images; see :func:`teacher_attention_io`).
        steps: total updates (a resumed ``state`` continues from its step).
        lr: Adam's learning rate (when no ``optimizer`` is given).
        optimizer: an optimiser over the new parameters (to resume one); default Adam.
        log_every: a history row every ``log_every`` updates, and at the first and last.
        on_log: called with each history row. on_step: called after each update (checkpointing).
        io_fn, layers_fn: how to read the teacher's attention inputs and outputs, and find the student's converted
            attention layers; the defaults are for primaldual models, :mod:`primaldual.convert.hf` gives those of a
            converted Hugging Face model.

    Returns:
        The state: ``history`` rows hold ``step``, ``loss`` (mean normalised error), ``loss/layer<i>`` per layer,
        ``ksvd`` (the eta-weighted KSVD term, as :func:`~primaldual.collect_aux_loss` sums it) and ``J2/<module>`` (each
        layer's unweighted term J^2 this step).
    """
    if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
        raise ValueError(f"log_every must be an int >= 1, got {log_every!r}")
    state = state or TransferState()
    students = layers_fn(student, layers)
    params = [p for layer in students for p in new_parameters(layer)]
    if not params:
        raise ValueError("the converted layers have no new parameters to train (the window-only student)")
    # stage 1 trains the new parameters alone, the students in eval mode: their targets were recorded without
    # dropout, and a layer's mode switches nothing else (its KSVD term is recorded wherever gradients are on); the
    # model's own flags and modes come back after
    trainable = [(p, p.requires_grad) for p in student.parameters()]
    modes = [(m, m.training) for layer in students for m in layer.modules()]
    for p in student.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = optimizer or torch.optim.Adam(params, lr=lr)
    for layer in students:
        layer.eval()
    it: Iterator = iter(batches)
    try:
        while state.step < steps:
            try:
                ids, mask = next(it)
            except StopIteration:
                raise ValueError(
                    f"batches: ran out before stage-1 update {state.step + 1} of {steps}; stage 1 needs {steps} "
                    "batches of its own (with init='teacher' the calibration batch comes before them)"
                ) from None
            io = io_fn(teacher, ids, mask, layers)
            losses = layer_losses(students, io, mask)
            terms = aux_loss_terms(student)  # {group: [(name, weight, term), ...]}
            # as collect_aux_loss: the weighted terms averaged over the calls of a group, the groups summed
            ksvd = sum(
                (torch.stack([w * t for _, w, t in g]).mean() for g in terms.values() if g), losses.new_zeros(())
            )
            loss = losses.mean() + ksvd
            if not bool(torch.isfinite(loss)):  # one host sync per update; a stage 1 gone NaN stops here
                half = params[0].dtype == torch.float16
                raise ValueError(
                    f"stage 1: the loss at update {state.step + 1} is {float(loss.detach())}"
                    + (": float16 students overflow or lose Adam's updates; convert a float32 or bfloat16 copy and "
                       "cast the result" if half else "")
                )  # fmt: skip
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            state.step += 1
            if state.step == 1 or state.step % log_every == 0 or state.step == steps:
                row = {"step": float(state.step), "loss": float(losses.detach().mean()), "ksvd": float(ksvd.detach())}
                row.update({f"loss/layer{i}": float(v) for i, v in zip(layers, losses.detach())})
                for group in terms.values():
                    for name, _, term in group:
                        row[f"J2/{name}"] = float(term.detach())
                state.history.append(row)
                if on_log is not None:
                    on_log(row)
            if on_step is not None:
                on_step(state, opt)
    finally:
        for p in params:  # stage 1's gradients would add to the first backward of stage 2
            p.grad = None
        for p, flag in trainable:
            p.requires_grad_(flag)
        for m, mode in modes:  # parents first, each by its own train()
            m.train(mode)
    return state
