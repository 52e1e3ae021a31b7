"""The shared backbone: transformer blocks whose attention is chosen per layer by registry name.

``Encoder(dim=64, depth=2, num_heads=2, attention=["softmax", "primal"])`` is a Primal.+ stack;
``attention="primal"`` makes every layer primal (PrimalFormer). Pre-LN (``norm_first=True``, LRA and
ViT style) and post-LN (the UEA reference protocol) blocks, GELU (or ReLU) feed-forward, dropout and drop-path.
All tensors are ``(B, N, dim)``; the mask is ``(B, N)`` bool with True = real token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .attention.registry import build_attention
from .checks import check_finite, check_mask, check_tokens
from .options import check_bool, check_choice, check_int, check_number

__all__ = [
    "DropPath",
    "Encoder",
    "EncoderBlock",
    "FeedForward",
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
]


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample with probability ``p`` (training only)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = check_number("drop_path", p, low=0.0, high=1.0, high_open=True)

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU}


class FeedForward(nn.Module):
    """Linear(dim -> hidden) -> activation -> dropout(ffn_drop) -> Linear(hidden -> dim) -> dropout.

    ``activation``: ``"gelu"`` (the default, ViT / BERT) or ``"relu"`` (the Decision Transformer's GPT-2 setting).
    ``ffn_drop``: dropout on the hidden units; None takes ``dropout`` (timm's ``Mlp``), 0 drops only the output
    (GPT-2's MLP).
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        dropout: float = 0.0,
        *,
        activation: str = "gelu",
        ffn_drop: float | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_choice("activation", activation, tuple(ACTIVATIONS))
        check_number("ffn_drop", ffn_drop, low=0.0, high=1.0, high_open=True, allow_none=True)
        fk = {"device": device, "dtype": dtype}
        self.net = nn.Sequential(
            nn.Linear(dim, hidden, **fk),
            ACTIVATIONS[activation](),
            nn.Dropout(dropout if ffn_drop is None else ffn_drop),
            nn.Linear(hidden, dim, **fk),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class EncoderBlock(nn.Module):
    """One transformer block with a registry attention.

    Args:
        dim: width. num_heads: heads.
        attention: registry name (see :func:`primaldual.list_attentions`).
        attention_options: mechanism options passed to :func:`primaldual.build_attention`.
        ffn_dim: feed-forward hidden width (default ``4 * dim``).
        dropout: dropout after attention and in the FFN. attn_drop: attention-weight dropout.
        drop_path: stochastic-depth probability. norm_first: pre-LN if True, post-LN if False.
        causal: causal attention. activation: the FFN's, ``"gelu"`` or ``"relu"``. ffn_drop: dropout on the FFN's
            hidden units (None: ``dropout``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: str = "softmax",
        attention_options: dict[str, Any] | None = None,
        *,
        ffn_dim: int | None = None,
        dropout: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_first: bool = True,
        causal: bool = False,
        activation: str = "gelu",
        ffn_drop: float | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_int("ffn_dim", ffn_dim, low=1, allow_none=True)
        check_number("dropout", dropout, low=0.0, high=1.0, high_open=True)
        check_number("attn_drop", attn_drop, low=0.0, high=1.0, high_open=True)
        check_bool("norm_first", norm_first)
        fk = {"device": device, "dtype": dtype}
        opts = dict(attention_options or {})
        opts.setdefault("causal", causal)
        if attn_drop:
            opts.setdefault("attn_drop", attn_drop)
        self.attn = build_attention(attention, dim, num_heads, device=device, dtype=dtype, **opts)
        self.attention_name = attention
        self.norm1 = nn.LayerNorm(dim, **fk)
        self.norm2 = nn.LayerNorm(dim, **fk)
        self.ffn = FeedForward(dim, ffn_dim or 4 * dim, dropout, activation=activation, ffn_drop=ffn_drop, **fk)
        self.drop = nn.Dropout(dropout)
        self.drop_path = DropPath(drop_path)
        self.norm_first = norm_first

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        positions: slice | None = None,
    ) -> Tensor | tuple[Tensor, Tensor | None]:
        """x ``(B, N, dim)``; mask ``(B, N)`` bool (True = real). Returns ``(B, N, dim)`` [and weights].

        ``positions``: only these token positions are returned, ``(B, len(range(N)[positions]), dim)``; the
        attention still runs over every token (its keys, values and any regulariser are unchanged), the residual and
        FFN after it only at those positions.
        """
        a = self.attn(self._attention_input(x), mask, need_weights=need_weights)
        a, w = a if need_weights else (a, None)
        if positions is not None:
            x, a = x[:, positions], a[:, positions]  # (B, M, dim): the FFN's work shrinks with M
        x = self._after_attention(x, a)
        return (x, w) if need_weights else x

    def _attention_input(self, x: Tensor) -> Tensor:
        return self.norm1(x) if self.norm_first else x

    def _after_attention(self, x: Tensor, a: Tensor) -> Tensor:
        """The rest of the block once the attention output ``a`` of input ``x`` is known (forward, prefill, step)."""
        x = x + self.drop_path(self.drop(a))
        if not self.norm_first:
            x = self.norm1(x)
        h = self.norm2(x) if self.norm_first else x
        x = x + self.drop_path(self.ffn(h))
        if not self.norm_first:
            x = self.norm2(x)
        return x

    def prefill(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Any]:
        """The block's forward over a prompt ``x`` ``(B, N, dim)`` and its attention's decoding state after it
        (causal attention; see :meth:`~primaldual.attention.base.AttentionLayer.prefill`). Returns ``(B, N, dim)``
        equal to :meth:`forward`, and the state that :meth:`step` continues."""
        a, state = self.attn.prefill(self._attention_input(x), mask)
        return self._after_attention(x, a), state

    def step(self, x_t: Tensor, state: Any, mask_t: Tensor | None = None) -> tuple[Tensor, Any]:
        """Decode one token through the block (causal attention): ``x_t`` ``(B, dim)`` -> ``(B, dim)``, new state.

        Equal to :meth:`forward` at that position; dropout and drop-path act as in the current mode (call
        ``eval()`` for deterministic decoding).
        """
        a, state = self.attn.step(self._attention_input(x_t), state, mask_t)
        return self._after_attention(x_t, a), state


def _per_layer(value: Any, depth: int, name: str) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if len(value) != depth:
            raise ValueError(f"{name} has {len(value)} entries but depth is {depth}")
        return list(value)
    return [value] * depth


class Encoder(nn.Module):
    """A stack of :class:`EncoderBlock`; the attention is chosen per layer.

    Args:
        dim, depth, num_heads: width, number of blocks, heads.
        attention: one registry name for all layers, or a list of ``depth`` names
            (e.g. ``["softmax", "primal"]`` is Primal.+Trans.).
        attention_options: one dict for all layers or a list of ``depth`` dicts (None entries allowed).
        final_norm: LayerNorm after the stack (default: True for pre-LN, False for post-LN).
        Other arguments as :class:`EncoderBlock`; ``drop_path`` rises linearly from 0 to the value.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        attention: str | Sequence[str] = "softmax",
        attention_options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        *,
        ffn_dim: int | None = None,
        dropout: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_first: bool = True,
        final_norm: bool | None = None,
        causal: bool = False,
        activation: str = "gelu",
        ffn_drop: float | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_int("depth", depth, low=1)
        check_number("drop_path", drop_path, low=0.0, high=1.0, high_open=True)
        if final_norm is not None:
            check_bool("final_norm", final_norm)
        names = _per_layer(attention, depth, "attention")
        options = _per_layer(attention_options, depth, "attention_options")
        dpr = [drop_path * i / max(depth - 1, 1) for i in range(depth)]
        self.dim = dim
        self.blocks = nn.ModuleList(
            EncoderBlock(
                dim,
                num_heads,
                names[i],
                options[i],
                ffn_dim=ffn_dim,
                dropout=dropout,
                attn_drop=attn_drop,
                drop_path=dpr[i],
                norm_first=norm_first,
                causal=causal,
                activation=activation,
                ffn_drop=ffn_drop,
                device=device,
                dtype=dtype,
            )
            for i in range(depth)
        )
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(dim, device=device, dtype=dtype) if final_norm else nn.Identity()

    @property
    def attention_names(self) -> list[str]:
        return [b.attention_name for b in self.blocks]

    def init_state(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> list[Any]:
        """Per-layer decoding states for ``batch`` sequences (every layer must be causal). ``dtype`` None lets each
        layer choose: a KV / window / prefix cache in the layer's dtype (another is refused), a constant-size state's
        sums in float32 for a float16 / bfloat16 layer; given, it sets the sums' dtype too."""
        return [b.attn.init_state(batch, device=device, dtype=dtype) for b in self.blocks]

    def prefill(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, list[Any]]:
        """The forward over a prompt and every layer's decoding state after it, in one pass (every layer causal).

        Args:
            x: ``(B, N, dim)``; mask: ``(B, N)`` bool (True = real token, None: no padding).

        Returns:
            ``(h, states)``: ``h`` ``(B, N, dim)`` equal to :meth:`forward`, and per-layer states that :meth:`step`
            continues (those ``N`` calls of :meth:`step` from :meth:`init_state` leave).
        """
        check_tokens(x, self.dim, "x")
        check_finite(x, "x")
        mask = check_mask(mask, x.shape[0], x.shape[1], x.device, "mask")
        states = []
        for block in self.blocks:
            x, state = block.prefill(x, mask)
            states.append(state)
        return self.norm(x), states

    def step(self, x_t: Tensor, states: list[Any], mask_t: Tensor | None = None) -> tuple[Tensor, list[Any]]:
        """Decode one token through the stack: ``x_t`` ``(B, dim)``; returns ``(B, dim)`` and the new states."""
        new = []
        for block, state in zip(self.blocks, states, strict=True):
            x_t, state = block.step(x_t, state, mask_t)
            new.append(state)
        return self.norm(x_t), new

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        positions: slice | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor | None]]:
        """x ``(B, N, dim)``; mask ``(B, N)`` bool (True = real). Returns ``(B, N, dim)`` [and per-layer weights].

        ``positions`` (a slice of ``range(N)``): return only the outputs at those positions, ``(B, M, dim)``. Equal to
        ``forward(x, mask)[:, positions]``, cheaper: the last block's FFN and the final norm run on M tokens only
        (the Decision Transformer reads its actions off one token in three).
        """
        check_tokens(x, self.dim, "x")
        check_finite(x, "x")  # the one value check of a forward (a host sync; off with set_input_checks(False))
        mask = check_mask(mask, x.shape[0], x.shape[1], x.device, "mask")
        if positions is not None and not isinstance(positions, slice):
            raise TypeError(f"positions must be a slice of the token positions or None, got {type(positions).__name__}")
        weights: list[Tensor | None] = []
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            at = positions if i == last else None
            if need_weights:
                x, w = block(x, mask, need_weights=True, positions=at)
                weights.append(w)
            else:
                x = block(x, mask, positions=at)
        x = self.norm(x)
        return (x, weights) if need_weights else x


class LearnedPositionalEncoding(nn.Module):
    """Adds a learned ``(max_len, dim)`` table to ``(B, N, dim)`` inputs (N <= max_len)."""

    def __init__(self, max_len: int, dim: int, *, init_std: float = 0.02, device=None, dtype=None) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, dim, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, std=init_std)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} exceeds the positional table's max_len {self.max_len}")
        return x + self.weight[: x.shape[1]]


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sin/cos encoding of Vaswani et al. to ``(B, N, dim)`` inputs (any N)."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"sinusoidal encoding needs an even dim, got {dim}")
        self.dim, self.base = dim, base

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        pos = torch.arange(n, device=x.device, dtype=torch.float32)[:, None]  # (N, 1)
        freq = torch.exp(
            torch.arange(0, self.dim, 2, device=x.device, dtype=torch.float32) * (-math.log(self.base) / self.dim)
        )
        pe = torch.zeros(n, self.dim, device=x.device)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq)
        return x + pe.to(x.dtype)
