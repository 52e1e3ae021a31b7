"""Base classes for attention layers: ``(B, N, C) -> (B, N, C)`` with one mask convention.

Every layer takes ``forward(x, mask=None, *, need_weights=False)``:

* ``x``: ``(B, N, dim)`` floating tensor;
* ``mask``: ``(B, N)`` boolean, **True = real token**, False = padding (None: no padding);
* returns ``out`` of shape ``(B, N, dim)``, or ``(out, weights)`` when ``need_weights`` is True, with
  ``weights`` of shape ``(B, H, N, N)`` (None for mechanisms whose capabilities say they have none).

Outputs at padded positions are exactly zero, so padded inputs never receive gradient and appending
padding never changes the outputs at real positions.

:class:`QKVAttention` adds the usual fused Q/K/V projection and output projection around a
functional kernel on ``(B, H, N, D)`` tensors; mechanisms only implement :meth:`QKVAttention.attend`.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from ..checks import check_heads, check_mask, check_tokens
from ..functional.qk_norm import QK_NORM_EPS, QK_NORMS, QKNorm, qk_rms_norm
from ..functional.rotary import apply_rope, check_rope
from ..options import check_bool, check_choice, check_number
from .capabilities import Capabilities

__all__ = ["AttentionLayer", "KVCache", "PrefixState", "QKVAttention", "accumulation_dtype", "cache_dtype"]


class PrefixState(NamedTuple):
    """Decoding state of a layer without an incremental path: its input prefix, rerun at every step.

    Attributes:
        x: ``(B, T, C)`` the layer inputs of the tokens seen so far.
        mask: ``(B, T)`` bool, True = real token.
    """

    x: Tensor
    mask: Tensor


class KVCache(NamedTuple):
    """Keys and values of the prefix for softmax-family decoding, in buffers that grow by doubling.

    Appending writes in place (amortised O(1) per token, not a copy of the whole cache), so a state is consumed by
    the ``step`` that returns its successor, as a Hugging Face cache is. The first ``length`` slots are in use.

    Attributes:
        k_buf, v_buf: ``(B, H, capacity, D)`` projected keys / values.
        mask_buf: ``(B, capacity)`` bool, True = real token.
        rank_buf: ``(B, capacity)`` int64 rank of each kept token among its sequence's real tokens (the number of
            real tokens before it), which a pattern counted over real tokens (sparse) reads; a window cache drops
            old slots, so it cannot be recomputed from the kept mask.
        length: slots in use. t: number of tokens seen, padding included.
        count: ``(B,)`` int64 real tokens seen per sequence (the rank of the next real token).
    """

    k_buf: Tensor
    v_buf: Tensor
    mask_buf: Tensor
    rank_buf: Tensor
    length: int
    t: int
    count: Tensor

    @property
    def k(self) -> Tensor:
        """``(B, H, length, D)`` the kept keys."""
        return self.k_buf[:, :, : self.length]

    @property
    def v(self) -> Tensor:
        """``(B, H, length, D)`` the kept values."""
        return self.v_buf[:, :, : self.length]

    @property
    def mask(self) -> Tensor:
        """``(B, length)`` bool, True = real token."""
        return self.mask_buf[:, : self.length]

    @property
    def rank(self) -> Tensor:
        """``(B, length)`` ranks of the kept tokens among their sequence's real tokens."""
        return self.rank_buf[:, : self.length]

    @classmethod
    def of(cls, k: Tensor, v: Tensor, mask: Tensor, rank: Tensor | None = None, t: int | None = None) -> KVCache:
        """A full cache from ``(B, H, T, D)`` keys / values and their ``(B, T)`` mask.

        ``rank`` ``(B, T)`` defaults to the real-token ranks of a cache that dropped nothing (``cumsum(mask) - 1``
        at real tokens); ``t`` (tokens seen) to ``T``. The count of real tokens seen is one past the last real rank.
        """
        real = mask.long()  # (B, T)
        if rank is None:
            rank = real.cumsum(1) - real  # (B, T): real tokens before each slot
        count = (rank + real).amax(1) if rank.shape[1] else real.new_zeros(mask.shape[0])  # (B,)
        return cls(k, v, mask, rank, k.shape[2], k.shape[2] if t is None else t, count)

    def append(self, k: Tensor, v: Tensor, mask_t: Tensor) -> KVCache:
        """The cache with one token's key / value (``(B, H, 1, D)``) added (in place)."""
        n, cap = self.length, self.k_buf.shape[2]
        k_buf, v_buf, mask_buf, rank_buf = self.k_buf, self.v_buf, self.mask_buf, self.rank_buf
        if n == cap:  # grow by doubling: amortised O(1) per token
            new = max(16, 2 * cap)
            k_buf = torch.cat([k_buf, k_buf.new_empty(*k_buf.shape[:2], new - cap, k_buf.shape[3])], 2)
            v_buf = torch.cat([v_buf, v_buf.new_empty(*v_buf.shape[:2], new - cap, v_buf.shape[3])], 2)
            mask_buf = torch.cat([mask_buf, mask_buf.new_zeros(mask_buf.shape[0], new - cap)], 1)
            rank_buf = torch.cat([rank_buf, rank_buf.new_zeros(rank_buf.shape[0], new - cap)], 1)
        k_buf[:, :, n] = k[:, :, 0]
        v_buf[:, :, n] = v[:, :, 0]
        mask_buf[:, n] = mask_t
        rank_buf[:, n] = self.count
        return KVCache(k_buf, v_buf, mask_buf, rank_buf, n + 1, self.t + 1, self.count + mask_t.long())

    def keep(self, keep: Tensor) -> KVCache:
        """Only the slots where ``keep`` ``(length,)`` is True, moved to the front (in place)."""
        idx = keep.nonzero()[:, 0]  # (kept,)
        n = idx.numel()
        self.k_buf[:, :, :n] = self.k_buf[:, :, idx]
        self.v_buf[:, :, :n] = self.v_buf[:, :, idx]
        self.mask_buf[:, :n] = self.mask_buf[:, idx]
        self.rank_buf[:, :n] = self.rank_buf[:, idx]
        return self._replace(length=n)


RopeTables = tuple[Tensor, Tensor]  # (cos, sin) rotary tables, see primaldual.functional.rotary


class AttentionLayer(nn.Module):
    """Common constructor arguments, input validation and padding handling.

    Args:
        dim: model width C of the ``(B, N, C)`` input and output.
        num_heads: number of heads H.
        head_dim: per-head width D (default ``dim // num_heads``).
        qkv_bias: bias in the input projections.
        attn_drop: dropout on attention weights (or the mechanism's analogue).
        proj_drop: dropout after the output projection.
        causal: position i attends only to positions <= i.
        device, dtype: factory arguments for every parameter.
    """

    registry_name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: base-class options this class refuses (left out of :func:`~primaldual.attention.registry.attention_options`)
    not_options: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        causal: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_heads(dim, num_heads, head_dim)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype (e.g. torch.float32) or None, got {dtype!r}")
        if device is not None and not isinstance(device, torch.device):
            try:
                torch.device(device)
            except (RuntimeError, TypeError):
                raise ValueError(
                    f"device: expected a torch.device or a name such as 'cpu' or 'cuda:0', got {device!r}"
                ) from None
        self.dim = dim
        self.num_heads = num_heads
        self.inner_dim = num_heads * self.head_dim
        self.qkv_bias = check_bool("qkv_bias", qkv_bias)
        self.attn_drop = check_number("attn_drop", attn_drop, low=0.0, high=1.0, high_open=True)
        check_number("proj_drop", proj_drop, low=0.0, high=1.0, high_open=True)
        self.causal = check_bool("causal", causal)
        caps = type(self).capabilities
        name = type(self).registry_name or type(self).__name__
        if self.causal and not caps.causal:
            raise ValueError(f"attention {name!r} does not support causal=True")
        if not self.causal and not caps.non_causal:
            raise ValueError(f"attention {name!r} supports only causal=True")
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False, rope: RopeTables | None = None
    ) -> Tensor | tuple[Tensor, Tensor | None]:
        """Args: x ``(B, N, dim)``; mask ``(B, N)`` bool, True = real token; rope: rotary tables ``(cos, sin)``,
        each ``(N, R)`` or ``(B, N, R)`` with ``R`` the head width ``D`` (or, partial rotary, an even width below
        it: the first ``R`` channels turn), applied to the queries and keys (mechanisms with ``capabilities.rope``
        only). Returns ``(B, N, dim)``."""
        check_tokens(x, self.dim, "x")
        mask = check_mask(mask, x.shape[0], x.shape[1], x.device, "mask")
        if need_weights and not type(self).capabilities.weights:
            raise ValueError(f"attention {self.registry_name!r} cannot return attention weights")
        tables = self._check_rope(rope, x.shape[0], x.shape[1], x.device)
        if tables is None:
            out, weights = self._forward(x, mask, need_weights)
        else:
            out, weights = self._forward(x, mask, need_weights, rope=tables)
        if mask is not None:
            out = out.masked_fill(~mask[..., None], 0.0)
        return (out, weights) if need_weights else out

    def _forward(self, x: Tensor, mask: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def _check_rope(self, rope: object, batch: int, n: int, device: torch.device) -> RopeTables | None:
        """None, or the validated tables ``(B or 1, 1, n, D)``; an error where the mechanism takes none."""
        if rope is None:
            return None
        if not type(self).capabilities.rope:
            from .registry import list_attentions

            takes = [i.name for i in list_attentions() if i.capabilities.rope]
            raise ValueError(
                f"rope: attention {self.registry_name or type(self).__name__!r} takes no rotary position "
                f"embeddings (those that do: {', '.join(takes)})"
            )
        return check_rope(rope, batch, n, self.head_dim, device, "rope")

    def _check_step_rope(self, rope: object, x_t: Tensor) -> RopeTables | None:
        """One decoding position's tables ``(cos_t, sin_t)``, each ``(B, D)`` or ``(D,)`` -> ``(B or 1, 1, 1, D)``."""
        if rope is None:
            return None
        pair = isinstance(rope, (tuple, list)) and len(rope) == 2 and all(isinstance(t, Tensor) for t in rope)
        if pair and all(t.dim() in (1, 2) for t in rope):
            rope = tuple(t[None] if t.dim() == 1 else t[:, None] for t in rope)  # (1 or B, 1, D)
        return self._check_rope(rope, x_t.shape[0], 1, x_t.device)

    # ---- incremental decoding: init_state / step, the same output as the causal forward at each position ----
    def _check_decoding(self) -> None:
        if not self.causal:
            raise RuntimeError(
                f"incremental decoding needs a causal layer; this {self.registry_name or type(self).__name__!r} "
                f"layer was built with causal=False"
            )

    def init_state(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Any:
        """An empty decoding state for ``batch`` sequences (causal layers only).

        This default keeps the layer's input prefix (``capabilities.decoding == "recompute"``); mechanisms with an
        incremental path override it (KV cache, window cache, constant-size state).
        """
        self._check_decoding()
        ref = next(self.parameters())
        fk = {"device": device or ref.device, "dtype": cache_dtype(dtype, ref.dtype, self.registry_name)}
        return PrefixState(
            torch.zeros(batch, 0, self.dim, **fk), torch.zeros(batch, 0, dtype=torch.bool, device=fk["device"])
        )

    def prefill(self, x: Tensor, mask: Tensor | None = None, *, rope: RopeTables | None = None) -> tuple[Tensor, Any]:
        """The causal forward over a prompt and the decoding state it leaves, in one pass (causal layers only).

        Args:
            x: ``(B, N, C)`` the layer inputs of the prompt.
            mask: ``(B, N)`` bool, True = real token (None: no padding); padding may sit anywhere.
            rope: rotary tables as in :meth:`forward` (mechanisms with ``capabilities.rope`` only); the state then
                holds rotated keys, and :meth:`step` takes each new position's tables.

        Returns:
            ``(out, state)``: ``out`` ``(B, N, C)`` equal to ``forward(x, mask)`` (zero at padded tokens), and the state
            that ``N`` calls of :meth:`step` from :meth:`init_state` leave, so that :meth:`step` continues the
            sequence. The state is detached: it is for decoding, not for training.
        """
        self._check_decoding()
        check_tokens(x, self.dim, "x")
        mask = check_mask(mask, x.shape[0], x.shape[1], x.device, "mask")
        tables = self._check_rope(rope, x.shape[0], x.shape[1], x.device)
        out, state = self._prefill(x, mask) if tables is None else self._prefill(x, mask, rope=tables)
        if mask is not None:
            out = out.masked_fill(~mask[..., None], 0.0)
        return out, state

    def _prefill(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Any]:
        """``(out (B, N, C), state)``. This default is for layers that decode by recomputation: their state is the
        input prefix itself, so the forward and the state come from one pass. Incremental mechanisms override it."""
        out, _ = self._forward(x, mask, False)
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask  # (B, N)
        return out, PrefixState(x.detach(), real)

    def step(
        self, x_t: Tensor, state: Any, mask_t: Tensor | None = None, *, rope: RopeTables | None = None
    ) -> tuple[Tensor, Any]:
        """Decode one token: ``x_t`` ``(B, C)``, ``mask_t`` ``(B,)`` bool (True = real token; a padded token is
        kept out of the state where the forward keeps it out, and its output is 0); ``rope``: this position's
        rotary tables ``(cos_t, sin_t)``, each ``(B, D)`` or ``(D,)`` (mechanisms with ``capabilities.rope``).
        Returns ``(y_t (B, C), state)``, ``y_t`` equal to the causal forward's output at this position. No auxiliary
        term is recorded."""
        self._check_decoding()
        self._check_step_rope(rope, x_t)  # recomputing mechanisms take none: refused by name
        x_t, mask_t = self._check_step(x_t, mask_t, state)
        x = torch.cat([state.x, x_t[:, None]], 1)  # (B, T+1, C)
        mask = torch.cat([state.mask, mask_t[:, None]], 1)  # (B, T+1)
        out, _ = self._forward(x, mask, False)  # (B, T+1, C): the causal output at the last position is y_t
        y = out[:, -1].masked_fill(~mask_t[:, None], 0.0)  # (B, C)
        return y, PrefixState(x, mask)

    def _check_step(self, x_t: Tensor, mask_t: Tensor | None, state: Any = None) -> tuple[Tensor, Tensor]:
        """``(x_t, mask_t)`` checked (``mask_t`` None: all real), and ``x_t``'s batch against ``state``'s."""
        if not isinstance(x_t, Tensor) or x_t.dim() != 2 or x_t.shape[-1] != self.dim:
            shape = tuple(x_t.shape) if isinstance(x_t, Tensor) else type(x_t).__name__
            raise ValueError(f"x_t must have shape (B, {self.dim}) (one token per sequence), got {shape}")
        B = x_t.shape[0]
        if (held := _state_batch(state)) is not None and held != B:
            raise ValueError(f"x_t has {B} sequences, but the state was built for {held} (init_state / prefill)")
        if mask_t is None:
            return x_t, torch.ones(B, dtype=torch.bool, device=x_t.device)
        if not isinstance(mask_t, Tensor) or mask_t.dim() != 1:
            raise ValueError(f"mask_t must be a (B,) = ({B},) torch.bool tensor (True = real token) or None")
        return x_t, check_mask(mask_t[:, None], B, 1, x_t.device, "mask_t")[:, 0]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, causal={self.causal}"


class QKVAttention(AttentionLayer):
    """An :class:`AttentionLayer` with fused Q/K/V projections and an output projection.

    Subclasses implement :meth:`attend` on ``(B, H, N, D)`` tensors.

    Args:
        qk_norm: None, or RMS norms with learned gains on the queries and on the keys, applied after the projection
            and before any rotary embedding (:mod:`primaldual.functional.qk_norm`): ``"head"`` normalises each
            head's ``D`` features (Qwen3, Gemma 3), ``"all_heads"`` a token's ``H * D`` features (OLMo 2). The
            gains are the parameters ``q_norm.weight`` and ``k_norm.weight``.
        qk_norm_eps: the norms' epsilon (read only with ``qk_norm``).
        Remaining arguments as :class:`AttentionLayer`.
    """

    def __init__(
        self, dim: int, num_heads: int, *, qk_norm: str | None = None, qk_norm_eps: float = QK_NORM_EPS, **kwargs
    ) -> None:
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        super().__init__(dim, num_heads, **kwargs)
        fk = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(dim, 3 * self.inner_dim, bias=self.qkv_bias, **fk)
        self.proj = nn.Linear(self.inner_dim, dim, **fk)
        self.qk_norm = check_choice("qk_norm", qk_norm, (None, *QK_NORMS))
        eps = check_number("qk_norm_eps", qk_norm_eps, low=0.0, low_open=True)
        if qk_norm is None and eps != QK_NORM_EPS:
            raise ValueError("qk_norm_eps: only a layer with qk_norm ('head' or 'all_heads') reads it")
        if self.qk_norm is not None:
            width = self.head_dim if self.qk_norm == "head" else self.inner_dim
            self.q_norm = nn.RMSNorm(width, eps=eps, **fk)
            self.k_norm = nn.RMSNorm(width, eps=eps, **fk)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", qk_norm={self.qk_norm!r}" if self.qk_norm is not None else "")

    def qk_norm_gains(self) -> QKNorm | None:
        """This layer's query / key norms, gains detached (None without ``qk_norm``): what a layer built from it
        copies."""
        if self.qk_norm is None:
            return None
        return QKNorm(self.qk_norm, self.q_norm.eps, self.q_norm.weight.detach(), self.k_norm.weight.detach())

    def _normed(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q, k ``(B, H, N, D)`` through their RMS norms (``qk_norm``); unchanged without."""
        if self.qk_norm is None:
            return q, k
        eps = self.q_norm.eps
        return qk_rms_norm(q, self.q_norm.weight, eps, self.qk_norm), qk_rms_norm(
            k, self.k_norm.weight, eps, self.qk_norm
        )

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """q, k, v: ``(B, H, N, D)``; key_mask ``(B, N)`` bool or None. Returns ``(B, H, N, D)``."""
        raise NotImplementedError

    def _qkv_step(self, x_t: Tensor, rope: RopeTables | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Project one token per sequence: ``x_t`` ``(B, C)`` -> q, k, v ``(B, H, 1, D)`` each (q, k rotated by
        ``rope`` ``(B or 1, 1, 1, D)`` tables when given)."""
        B = x_t.shape[0]
        qkv = self.qkv(x_t).reshape(B, 3, self.num_heads, 1, self.head_dim)  # (B, 3, H, 1, D)
        q, k, v = qkv.unbind(1)
        q, k = self._normed(q, k)
        if rope is not None:
            q, k = apply_rope(q, k, *rope)
        return q, k, v

    def _out_step(self, out: Tensor, mask_t: Tensor) -> Tensor:
        """``out`` ``(B, H, 1, D)`` -> the layer output ``(B, C)``, zero for padded tokens."""
        y = self.proj_drop(self.proj(out.reshape(out.shape[0], self.inner_dim)))  # (B, H*D) -> (B, C)
        return y.masked_fill(~mask_t[:, None], 0.0)

    def _empty_cache(self, batch: int, device: torch.device | str | None, dtype: torch.dtype | None) -> KVCache:
        self._check_decoding()
        ref = self.qkv.weight
        fk = {"device": device or ref.device, "dtype": cache_dtype(dtype, ref.dtype, self.registry_name)}
        empty = torch.zeros(batch, self.num_heads, 0, self.head_dim, **fk)  # (B, H, 0, D)
        dev = fk["device"]
        mask = torch.zeros(batch, 0, dtype=torch.bool, device=dev)  # (B, 0)
        return KVCache.of(empty, empty.clone(), mask)

    def _qkv(self, x: Tensor, rope: RopeTables | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Project ``x`` ``(B, N, C)`` -> q, k, v ``(B, H, N, D)`` each (q, k rotated by ``rope``, validated
        ``(B or 1, 1, N, D)`` tables, when given)."""
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, N, D)
        q, k = self._normed(q, k)
        if rope is not None:
            q, k = apply_rope(q, k, *rope)
        return q, k, v

    def _out(self, out: Tensor) -> Tensor:
        """Merge the heads of ``out`` ``(B, H, N, D)`` and project: the layer output ``(B, N, C)``."""
        B, _, N, _ = out.shape
        out = out.transpose(1, 2).reshape(B, N, self.inner_dim)  # (B, N, H*D)
        return self.proj_drop(self.proj(out))

    def _forward(
        self, x: Tensor, mask: Tensor | None, need_weights: bool, rope: RopeTables | None = None
    ) -> tuple[Tensor, Tensor | None]:
        q, k, v = self._qkv(x, rope)  # (B, H, N, D) each
        out, weights = self.attend(q, k, v, mask, need_weights)
        return self._out(out), weights

    def _kv_prefill(self, x: Tensor, mask: Tensor | None, rope: RopeTables | None = None) -> tuple[Tensor, KVCache]:
        """The forward over ``x`` ``(B, N, C)`` and the KV cache of its N tokens (softmax family): the keys and
        values are projected once, for the attention and for the cache (keys rotated when ``rope`` is given)."""
        q, k, v = self._qkv(x, rope)  # (B, H, N, D) each
        out, _ = self.attend(q, k, v, mask, False)
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask  # (B, N)
        # the cache owns its buffers (appending and pruning write in place; k and v are views of one projection)
        k_buf, v_buf = (t.detach().clone(memory_format=torch.contiguous_format) for t in (k, v))
        return self._out(out), KVCache.of(k_buf, v_buf, real.clone())


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a running sum over a context is kept in for a layer of ``dtype``: float32 for float16 / bfloat16
    layers (their forwards sum in float32 too), the layer's own otherwise."""
    return torch.promote_types(dtype, torch.float32)


def cache_dtype(requested: torch.dtype | None, layer: torch.dtype, name: str) -> torch.dtype:
    """The dtype of a cache of keys, values or inputs, which the layer reads back as they are: the layer's own; another
    ``dtype`` asked of ``init_state`` is an error that names it."""
    if requested is not None and requested != layer:
        raise ValueError(
            f"dtype: attention {name!r} keeps its decoding cache in the layer's dtype ({layer}); got {requested} "
            "(cast the layer instead)"
        )
    return layer


def _state_batch(state: Any) -> int | None:
    """The batch of a decoding state: dim 0 of its first tensor (states are named tuples of tensors, nested), or
    None where it holds none."""
    if isinstance(state, Tensor):
        return state.shape[0] if state.dim() else None
    for part in state if isinstance(state, tuple) else ():
        if (b := _state_batch(part)) is not None:
            return b
    return None
