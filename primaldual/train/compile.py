"""``trainer.compile``: compile a run's model with ``torch.compile``, checked against eager before training.

The model is compiled in place (``nn.Module.compile``), so parameter names, checkpoints and ``primaldual analyze``
are the same as for an eager run, and a run may be resumed with compilation switched on or off. Before training,
the first validation batch is run through the model eagerly and compiled (eval mode, no gradients, so dropout and
the KSVD terms play no part) and the two outputs are compared. Where compilation raises (no C++ compiler for the
CPU backend, an unsupported operation) or the outputs disagree, the model is left eager and one line says why;
training never stops for it. Training itself compiles a second graph (with gradients) on its first step.

Random numbers on CPU. The model's ``nn.Dropout`` modules are swapped for :class:`primaldual.CounterDropout`
(:func:`primaldual.use_counter_dropout`): inside the compiled graph their masks are an integer hash of the element
index, fused into the surrounding loops and spread over the threads, where ATen's Bernoulli sampler is serial (it
was a third of a compiled LRA ListOps step). Eagerly they are ``nn.Dropout``. Any other random operation
(functional ``F.dropout``, drop-path) calls ATen's generator through Inductor's ``fallback_random``: Inductor's own
CPU Philox seeds one engine per element and made a ListOps step 1.5x slower than eager. On GPU Inductor's random
numbers are fused Triton code, so its defaults stay (``CounterDropout`` is plain dropout there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..aux_loss import collect_aux_loss
from ..dropout import use_counter_dropout

__all__ = ["compile_model", "compile_options"]

_RTOL, _ATOL = 1e-3, 1e-4  # float32 kernels of another order of summation, not another result


def _uncompile(model: nn.Module) -> None:
    if hasattr(model, "_compiled_call_impl"):
        model._compiled_call_impl = None


def _outputs(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, Sequence):
        return [t for o in out for t in _outputs(o)]
    return []


def compile_options(model: nn.Module) -> dict[str, Any]:
    """Inductor options for compiling ``model``: ``fallback_random`` when its parameters are on the CPU."""
    p = next(model.parameters(), None)
    on_cpu = p is None or p.device.type == "cpu"
    return {"fallback_random": True} if on_cpu else {}


def _compile_kwargs(model: nn.Module, mode: str) -> dict[str, Any]:
    """``torch.compile``'s arguments: ``mode``, or, where :func:`compile_options` has options (it refuses both at
    once), the options that the mode sets (``torch._inductor.list_mode_options``, the listing its documentation
    names) merged with them."""
    options = compile_options(model)
    if mode == "default":
        return {"options": options}
    if not options:
        return {"mode": mode}
    from torch._inductor import list_mode_options

    return {"options": {**list_mode_options(mode), **options}}


def compile_model(model: nn.Module, inputs: Sequence[Any], note: Callable[[str], None], mode: str = "default") -> bool:
    """Compile ``model`` in place and check ``model(*inputs)`` against eager; True when it trains compiled.

    Args:
        model: the task model. inputs: one batch of its inputs (e.g. ``(tokens, mask)``), on the model's device.
        note: where the one-line outcome goes (``print`` on rank 0).
        mode: ``torch.compile``'s ``mode`` (``trainer.compile_mode``): ``reduce-overhead`` replays the compiled
            graphs as CUDA graphs on a GPU (no effect on a CPU).
    """
    was_training = model.training
    swapped = 0
    model.eval()
    try:
        with torch.no_grad():
            ref = _outputs(model(*inputs))
            collect_aux_loss(model)
            swapped = use_counter_dropout(model)  # plain nn.Dropout eagerly, so harmless if compilation fails
            model.compile(**_compile_kwargs(model, mode))
            got = _outputs(model(*inputs))
            collect_aux_loss(model)
    except Exception as e:  # any failure of the compiler: train eagerly
        _uncompile(model)
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        note(f"trainer.compile: compilation failed ({type(e).__name__}: {reason}); training eagerly")
        return False
    finally:
        model.train(was_training)
    if not ref:
        _uncompile(model)
        note("trainer.compile: the model returned no tensors to check the compiled one against; training eagerly")
        return False
    if len(ref) != len(got) or any(
        r.shape != g.shape or not torch.allclose(r.float(), g.float(), rtol=_RTOL, atol=_ATOL)
        for r, g in zip(ref, got, strict=True)
    ):
        _uncompile(model)
        worst = max(((r.float() - g.float()).abs().max().item() for r, g in zip(ref, got)), default=float("nan"))
        note(
            f"trainer.compile: the compiled model disagrees with eager on the first validation batch (max abs "
            f"difference {worst:.3g} > atol {_ATOL} + rtol {_RTOL}); training eagerly"
        )
        return False
    worst = max((r.float() - g.float()).abs().max().item() for r, g in zip(ref, got, strict=True))
    on_cpu = bool(compile_options(model))  # the CPU options are the non-empty ones
    counter = f"; {swapped} dropout modules draw counter-based masks" if swapped and on_cpu else ""
    how = f" (mode {mode})" if mode != "default" else ""
    note(
        f"trainer.compile: compiled with torch.compile{how}{counter}; matches eager on the first validation batch "
        f"({worst:.2g})"
    )
    return True
