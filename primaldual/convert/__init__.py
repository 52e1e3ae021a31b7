"""From a trained softmax model to a primal one: swap, initialise from the teacher, transfer.

``convert(teacher, "primal", layers=(-1,), batches=..., steps=...)`` returns a converted copy of a trained
:class:`~primaldual.models.CausalLM` (a constant decoding state) or bidirectional classifier after stage 1
(layer-wise attention transfer); stage 2 is ordinary training of the copy on the task's loss (``primaldual convert``
runs both, with a run directory, see ``docs/conversion.md``).

* :mod:`.students`: the students (``primal``, ``hybrid``, ``window``) and :func:`swap_attention`;
* :mod:`.init`: the KSVD and least-squares initialisation from the teacher (:func:`init_from_teacher`);
* :mod:`.transfer`: the teacher-forced stage 1 (:func:`attention_transfer`);
* :mod:`.lora`: low-rank adapters for stage 2 (:func:`add_lora`, :func:`merge_lora`);
* :mod:`.torch_nn`, :mod:`.timm`, :mod:`.modules` and :mod:`.hf`: the same for a model whose attention is
  ``nn.MultiheadAttention`` (:func:`convert_torch`), a timm vision transformer (:func:`convert_timm`), hand-written
  attention modules named by path (:func:`convert_modules`) and a transformers model (``convert_hf``, which needs
  transformers), over :mod:`.external`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import Tensor, nn

from .external import INITS, check_batches, check_stages
from .init import init_from_teacher, ksvd_init, least_squares_map
from .lora import add_lora, merge_lora
from .modules import convert_modules
from .students import STUDENTS, find_blocks, new_parameters, student_plan, swap_attention
from .timm import convert_timm
from .torch_nn import convert_torch
from .transfer import TransferState, attention_transfer, layer_losses, teacher_attention_io

__all__ = [
    "INITS",
    "STUDENTS",
    "TransferState",
    "add_lora",
    "attention_transfer",
    "convert",
    "convert_modules",
    "convert_timm",
    "convert_torch",
    "find_blocks",
    "init_from_teacher",
    "initialise_students",
    "ksvd_init",
    "layer_losses",
    "least_squares_map",
    "merge_lora",
    "new_parameters",
    "student_plan",
    "swap_attention",
    "teacher_attention_io",
]


def initialise_students(
    teacher: nn.Module, student: nn.Module, layers: Sequence[int], inputs: Tensor, mask: Tensor | None = None
) -> dict[int, dict[str, float]]:
    """:func:`init_from_teacher` for every converted layer, on the teacher's attention inputs (and the key masks its
    layers were given) for the calibration batch ``inputs`` (token ids ``(B, N)``, features, images: the teacher's
    first argument). Returns the figures per layer index."""
    io = teacher_attention_io(teacher, inputs, mask, layers, masks=True)
    t_blocks, s_blocks = find_blocks(teacher), find_blocks(student)
    return {i: init_from_teacher(s_blocks[i].attn, t_blocks[i].attn, x, m) for i, (x, _, _, m) in zip(layers, io)}


def convert(
    teacher: nn.Module,
    student: str = "primal",
    layers: int | Sequence[int] | str = (-1,),
    *,
    batches: Iterable[tuple[Tensor, Tensor | None]] | None = None,
    steps: int = 0,
    init: str = "teacher",
    lr: float = 3e-4,
    **options: Any,
) -> tuple[nn.Module, dict[str, Any]]:
    """A converted copy of ``teacher`` (left unchanged): swap, initialisation and stage 1.

    Args:
        teacher: a trained primaldual model with softmax blocks: a ``CausalLM``, or a bidirectional classifier (time
            series, LRA, vision), called as ``teacher(inputs, mask)`` or ``teacher(inputs)``.
        student: ``"primal"`` (the paper's layer, causal as the teacher), ``"hybrid"`` (window + sinks + primal
            branch) or ``"window"`` (the hybrid without its branch: nothing is trained); the last two are causal.
        layers: block indices (negative from the end) or ``"all"``; ``(-1,)`` converts the last layer (Primal.+).
        batches: ``(inputs, mask)`` batches of the teacher's data (``inputs`` its first argument: token ids,
            features or images; ``mask`` ``(B, N)`` bool or None); the first one calibrates the initialisation, the
            next ``steps`` train stage 1. Needed unless ``init="random"`` and ``steps=0``.
        steps: stage-1 updates (0: none, a plain swap).
        init: ``"teacher"`` (KSVD + least squares, :func:`init_from_teacher`) or ``"random"`` (the layers' own).
        lr: stage-1 Adam learning rate (3e-4: see docs/conversion.md on why it is low).
        options: the student mechanism's options (``s``, ``eta``, ``window``, ``sinks``; for a bidirectional teacher
            ``data_dependent``, ``n``, ``rank_multi``, ``max_len``, ...).

    Returns:
        ``(model, report)``: report holds ``layers``, ``init`` (per-layer figures) and ``history`` (stage 1).
    """
    check_stages(init, steps)
    model, chosen = swap_attention(teacher, student, layers, **options)
    report: dict[str, Any] = {"layers": chosen, "init": {}, "history": []}
    trains = student != "window"
    if (init == "teacher" and trains) or (steps and trains):
        check_batches(batches)
        it = iter(batches)
        if init == "teacher" and trains:
            try:
                ids, mask = next(it)
            except StopIteration:
                raise ValueError("batches: empty; the first batch calibrates the teacher initialisation") from None
            report["init"] = initialise_students(teacher, model, chosen, ids, mask)
        if steps:
            report["history"] = attention_transfer(teacher, model, chosen, it, steps, lr=lr).history
    return model, report
