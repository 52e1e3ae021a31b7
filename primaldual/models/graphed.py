"""A language model's decoding step replayed from a CUDA graph: one launch per token instead of tens per layer.

At a decoding step every kernel is small (one token per sequence), so an eager step is bound by kernel launches:
a 4-layer model launches about a hundred per token, and its time per token is that launch overhead, whatever the
context. A CUDA graph records the step once and replays it as one launch. Only a state whose tensors keep their
shapes from step to step can be recorded (``Capabilities.decoding == "constant"``: the primal and linear layers);
a KV or window cache grows and stays eager.

The static tensors are the state itself (advanced in place by every replay: the step's new state is copied into
it), the input ids and the real-token flags; the logits are a buffer of the graph, overwritten by the next replay.
The step is :meth:`~primaldual.models.lm.CausalLM.unchecked_step`: nothing in it reads a value back to the host,
which a capture cannot hold. Hand-written around ``torch.cuda.CUDAGraph`` (PyTorch's own capture API; its
``make_graphed_callables`` records training steps with autograd, not a step that updates its inputs in place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..options import check_bool, check_int

if TYPE_CHECKING:
    from .lm import CausalLM, LMState

__all__ = ["GraphedStep", "check_graphable", "state_tensors"]


def state_tensors(state: LMState) -> list[Tensor]:
    """The tensors of a decoding state, in a fixed order: the per-sequence count, then each layer's."""
    return [state.count] + [t for layer in state.layers for t in layer if isinstance(t, Tensor)]


def check_graphable(model: CausalLM, device: torch.device, what: str = "cuda_graph") -> None:
    """Raise ValueError, naming ``what``, unless every layer of ``model`` decodes through a constant-size state and
    ``device`` is a CUDA device."""
    kinds = [block.attn.capabilities.decoding for block in model.decoder.blocks]
    if growing := [f"{i} ({k})" for i, k in enumerate(kinds) if k != "constant"]:
        raise ValueError(
            f"{what}: only a constant-size decoding state can be captured in a CUDA graph; layer "
            f"{', '.join(growing)} keeps a cache that grows with the context (decode those eagerly)"
        )
    if not _is_cuda(device):
        raise ValueError(f"{what}: CUDA graphs need the model on a CUDA device, got {device.type}")


def _is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


class GraphedStep:
    """:meth:`CausalLM.unchecked_step` on ``state``, captured once and replayed per token.

    Args:
        model: a :class:`~primaldual.models.lm.CausalLM` in eval mode on a CUDA device, every layer with a
            constant-size decoding state (:func:`check_graphable`).
        state: ``(B, ...)`` its decoding state (e.g. from :meth:`~primaldual.models.lm.CausalLM.prefill`). It
            becomes the graph's: every call advances it in place, as ``model.step`` would return it.
        feed_back: inside the graph, write ``argmax(logits)`` into the input ids, so greedy decoding replays with
            no work on the host between tokens (a benchmark's loop); otherwise each call passes its ids.
        warmup: eager steps before the capture, run on a side stream (cuBLAS and the caching allocator set up
            there, as capture requires); the state and ids are restored afterwards, so they advance nothing.

    Calling it with ``ids`` ``(B,)`` int64 and ``real`` ``(B,)`` bool (True = a real token; None: all real)
    returns the ``(B, vocab)`` logits, a buffer the next call overwrites. The graph holds the addresses of the
    model's parameters: moving or casting the model afterwards (``.to``, ``.half()``) needs a new ``GraphedStep``.
    """

    def __init__(self, model: CausalLM, state: LMState, *, feed_back: bool = False, warmup: int = 1) -> None:
        check_bool("feed_back", feed_back)
        check_int("warmup", warmup, low=1)
        check_graphable(model, state.count.device)
        if model.training:  # dropout and other training branches would be frozen into the graph as captured
            raise ValueError("GraphedStep: the model is in training mode; call model.eval() first")
        batch, device = state.count.shape[0], state.count.device
        self.ids = torch.zeros(batch, dtype=torch.long, device=device)
        self.real = torch.ones(batch, dtype=torch.bool, device=device)
        static = state_tensors(state)

        def step() -> Tensor:
            logits, new = model.unchecked_step(self.ids, state, self.real)
            src = state_tensors(new)
            if [(t.shape, t.dtype) for t in src] != [(t.shape, t.dtype) for t in static]:
                raise ValueError("the decoding state changes shape or dtype from step to step: it cannot be captured")
            for dst, value in zip(static, src, strict=True):
                dst.copy_(value)
            if feed_back:
                self.ids.copy_(logits.argmax(-1))
            return logits

        saved = [t.clone() for t in (*static, self.ids, self.real)]
        # one stream of this step's own, on the model's device, for the warm-up and the capture: torch.cuda.graph's
        # shared default capture stream is made on whichever device was current at its first use
        side = _side_stream(device)
        with torch.no_grad():
            _warm_up(step, warmup, device, side)
            for dst, value in zip((*static, self.ids, self.real), saved, strict=True):
                dst.copy_(value)
            self._replay = _record(step, device, side)  # recorded, not run: the state is untouched until then

    def __call__(self, ids: Tensor | None = None, real: Tensor | None = None) -> Tensor:
        if ids is not None:
            self.ids.copy_(ids)
        if real is not None:
            self.real.copy_(real)
        elif ids is not None:
            self.real.fill_(True)
        return self._replay()


def _side_stream(device: torch.device) -> Any:
    return torch.cuda.Stream(device)


def _warm_up(step: Callable[[], Tensor], times: int, device: torch.device, side: Any) -> None:
    """Run ``step`` on the side stream, as capture requires (the caching allocator keeps its pools apart)."""
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(times):
            step()
    torch.cuda.current_stream(device).wait_stream(side)


def _record(step: Callable[[], Tensor], device: torch.device, side: Any) -> Callable[[], Tensor]:
    """``step`` recorded in a CUDA graph on ``side``: returns ``replay() -> output``, the output a buffer of the
    graph."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device), torch.cuda.graph(graph, stream=side):
        out = step()

    def replay() -> Tensor:
        graph.replay()
        return out

    return replay
