"""Head redundancy: how similar the heads of each attention layer are, on any model.

The SVR paper (Nguyen et al., ICLR 2023) claims Attention-BN and Attention-SH reduce head redundancy. The
measure here is the **mean pairwise cosine similarity between heads**, per layer, of

* the heads' **attention maps** ``(N, N)`` (mechanisms whose capabilities return weights), and
* the heads' **outputs** ``(N, E)``: the per-head slices of the H concatenated head outputs ``(B, N, H * E)``
  before they are mixed, read from the input of the layer's submodule ``head_outputs`` if it has one (an
  ``nn.Identity`` a layer can apply to its concatenated head outputs) and otherwise of its output projection
  ``proj`` (every :class:`~primaldual.attention.base.QKVAttention` calls it). A layer that calls neither (e.g.
  one that fuses the output projection into another matrix) gets ``outputs=None``.

For each sample, a head's map or output is flattened over the real (unpadded) query positions into one vector
and the cosine similarity of every pair of heads is taken; the reported value averages the ``H (H - 1) / 2``
pairs and the samples of every forward call seen. 1 means identical heads (up to scale), 0 orthogonal ones.
Non-negative maps (softmax, linear and their variants) have similarities in [0, 1]; mechanisms whose "weights"
are signed scores (``primal``) can go below 0.

It works on any module tree containing :class:`~primaldual.attention.base.AttentionLayer` layers: forward hooks
ask each capable layer for its weights (``need_weights=True``) and strip them again before the surrounding model
sees the output, and a forward pre-hook on the layer's ``proj`` reads the head outputs. Hand-written: it is a
few hooks and a Gram matrix, and the metric is this project's definition.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer

__all__ = ["LayerRedundancy", "RedundancyTracker", "head_redundancy", "pairwise_head_similarity", "track_redundancy"]


def pairwise_head_similarity(t: Tensor, mask: Tensor | None = None) -> Tensor:
    """Cosine similarity between heads, per sample.

    Args:
        t: ``(B, H, N, E)`` per-head maps (E = N) or outputs (E = head width).
        mask: ``(B, N)`` bool, True = real token; padded query positions are left out.

    Returns:
        ``(B, H, H)`` similarities (a head that is all zero has similarity 0 with every head).
    """
    if t.dim() != 4:
        raise ValueError(f"t must have shape (B, H, N, E), got {tuple(t.shape)}")
    t = t.detach().double()
    if mask is not None:
        t = t.masked_fill(~mask[:, None, :, None], 0.0)
    flat = t.flatten(2)  # (B, H, N*E)
    flat = flat / flat.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return flat @ flat.transpose(1, 2)  # (B, H, H)


def _mean_pairs(s: Tensor) -> float | None:
    h = s.shape[-1]
    if h < 2:
        return None
    return float(s.triu(1).sum() / (h * (h - 1) / 2))


@dataclass
class LayerRedundancy:
    """Head redundancy of one attention layer.

    Attributes:
        name: module path in the model. mechanism: registry name. num_heads: H.
        weights: mean pairwise similarity of attention maps (None: the mechanism has no maps, or H = 1).
        outputs: mean pairwise similarity of head outputs (None: no ``proj`` input seen, or H = 1).
        weights_matrix, outputs_matrix: the ``(H, H)`` mean similarity matrices.
        samples: how many samples were averaged.
    """

    name: str
    mechanism: str
    num_heads: int
    weights: float | None
    outputs: float | None
    weights_matrix: Tensor | None = None
    outputs_matrix: Tensor | None = None
    samples: int = 0


@dataclass
class _Acc:
    mechanism: str
    num_heads: int
    w_sum: Tensor | None = None
    o_sum: Tensor | None = None
    samples: int = 0


class RedundancyTracker:
    """Accumulates per-layer head similarities over every forward call made while it is active."""

    def __init__(self) -> None:
        self._acc: dict[str, _Acc] = {}

    def _add(self, name: str, layer: AttentionLayer, weights: Tensor | None, heads: Tensor | None, mask) -> None:
        acc = self._acc.setdefault(name, _Acc(layer.registry_name or type(layer).__name__, layer.num_heads))
        if weights is not None:
            s = pairwise_head_similarity(weights, mask).sum(0)
            acc.w_sum = s if acc.w_sum is None else acc.w_sum + s
        if heads is not None:
            s = pairwise_head_similarity(heads, mask).sum(0)
            acc.o_sum = s if acc.o_sum is None else acc.o_sum + s
        seen = weights if weights is not None else heads
        acc.samples += 0 if seen is None else seen.shape[0]

    def results(self) -> list[LayerRedundancy]:
        """One :class:`LayerRedundancy` per attention layer that ran, in module order."""
        out = []
        for name, a in self._acc.items():
            n = max(a.samples, 1)
            wm = None if a.w_sum is None else a.w_sum / n
            om = None if a.o_sum is None else a.o_sum / n
            out.append(
                LayerRedundancy(
                    name,
                    a.mechanism,
                    a.num_heads,
                    None if wm is None else _mean_pairs(wm),
                    None if om is None else _mean_pairs(om),
                    wm,
                    om,
                    a.samples,
                )
            )
        return out


@contextmanager
def track_redundancy(model: nn.Module, weights: bool = True) -> Iterator[RedundancyTracker]:
    """Context manager: measure head redundancy of every attention layer of ``model`` during the block.

    Args:
        model: any module containing primaldual attention layers at any depth.
        weights: also compare attention maps where the mechanism returns them (costs an N x N matrix per head).
    """
    tracker = RedundancyTracker()
    handles = []
    for name, module in model.named_modules():
        if not isinstance(module, AttentionLayer):
            continue
        want = weights and type(module).capabilities.weights
        state: dict[str, Any] = {}

        def pre(mod, args, kwargs, want=want, state=state):
            state["mask"] = kwargs.get("mask", args[1] if len(args) > 1 else None)
            state["asked"] = bool(kwargs.get("need_weights", False))
            state["heads"] = None
            if want:
                kwargs = {**kwargs, "need_weights": True}
            return args, kwargs

        def post(mod, args, kwargs, output, name=name, want=want, state=state):
            out, w = output if (want or state["asked"]) else (output, None)
            tracker._add(name, mod, w if want else None, state["heads"], state["mask"])
            return (out, w) if state["asked"] else out

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
        proj = getattr(module, "head_outputs", None) or getattr(module, "proj", None)
        if isinstance(proj, nn.Module):

            def proj_pre(mod, args, layer=module, state=state):
                x = args[0]
                if x.dim() == 3 and x.shape[-1] % layer.num_heads == 0:
                    B, N, _ = x.shape
                    state["heads"] = x.reshape(B, N, layer.num_heads, -1).transpose(1, 2)  # (B, H, N, E)

            handles.append(proj.register_forward_pre_hook(proj_pre))
    try:
        yield tracker
    finally:
        for h in handles:
            h.remove()


def head_redundancy(model: nn.Module, *args: Any, weights: bool = True, **kwargs: Any) -> list[LayerRedundancy]:
    """Run ``model(*args, **kwargs)`` once in eval mode without gradients and return per-layer redundancy.

    Example::

        enc = pd.Encoder(dim=64, depth=2, num_heads=4, attention="softmax_bn")
        for layer in head_redundancy(enc, x, mask):
            print(layer.name, layer.weights, layer.outputs)
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), track_redundancy(model, weights=weights) as tracker:
            model(*args, **kwargs)
    finally:
        model.train(was_training)
    return tracker.results()
