"""``CounterDropout``: ``nn.Dropout`` whose compiled CPU graphs draw counter-based masks (fused, multi-threaded).

Eagerly, and on every device but the CPU, it *is* ``nn.Dropout`` (same masks for the same seed, same state dict,
no parameters). Inside a ``torch.compile`` graph on the CPU it calls
:func:`primaldual.functional.dropout.counter_dropout`, whose mask is an integer hash of the element index that
Inductor fuses into the surrounding loop, instead of ATen's serial Bernoulli sampler (a third of a compiled LRA
ListOps step, docs/benchmarks.md section 2). GPU graphs keep Inductor's fused Philox.

:func:`use_counter_dropout` swaps a model's plain ``nn.Dropout`` modules in place; ``trainer.compile`` and
``primaldual bench lra --compile`` do it before compiling. For your own loop::

    primaldual.use_counter_dropout(model)
    model.compile(options={"fallback_random": True})  # ATen's sampler for any other random op on CPU
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .functional.dropout import counter_dropout

__all__ = ["CounterDropout", "use_counter_dropout"]


class CounterDropout(nn.Dropout):
    """``nn.Dropout(p)``; counter-based masks when traced by ``torch.compile`` on CPU in training mode.

    Input: any shape; output: the same shape and dtype.
    """

    def forward(self, x: Tensor) -> Tensor:
        use_counter = (
            self.training
            and not self.inplace
            and 0.0 < self.p < 1.0
            and x.device.type == "cpu"
            and x.is_floating_point()
            and x.numel() < (1 << 31)
            and torch.compiler.is_compiling()
        )
        return counter_dropout(x, self.p) if use_counter else super().forward(x)


def use_counter_dropout(model: nn.Module) -> int:
    """Replace every module of exact type ``nn.Dropout`` in ``model`` by a :class:`CounterDropout` of the same p.

    Subclasses of ``nn.Dropout`` (which may mean something else) and functional ``F.dropout`` calls are left alone.
    The state dict does not change (dropout has none). Returns the number of modules replaced.
    """
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Dropout
    ]
    for parent, name, child in swaps:
        new = CounterDropout(child.p, inplace=child.inplace)
        new.train(child.training)
        setattr(parent, name, new)
    return len(swaps)
