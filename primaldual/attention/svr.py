"""Attention-BN, Attention-SH and Attention-BN+SH layers (Nguyen et al., "A Primal-Dual Framework for
Transformers and Neural Networks", ICLR 2023), on softmax and on linear attention.

Six registered names, all :class:`~primaldual.attention.base.QKVAttention` subclasses:

=================  ==========================================================  =======
name               what changes against ``softmax`` / ``linear``                causal
=================  ==========================================================  =======
``softmax_bn``     q, k normalised with the keys' mean / std (Attention-BN)     yes (prefix statistics)
``linear_bn``      the same before the elu + 1 feature map                      no (refused)
``softmax_sh``     keys and values of head h downsampled by r_h (scaled heads)  yes (windows ending <= i)
``linear_sh``      the same on linear attention                                 yes (windows ending <= i)
``softmax_bn_sh``  both; statistics from each head's pooled keys by default     yes
``linear_bn_sh``   both, on linear attention                                    no (refused)
=================  ==========================================================  =======

Option defaults (``beta=1``, ``divide_std=True``, ``bn_eps=1e-5``, ``stats_over="tokens"``,
``factors=None`` = ladder ``1, 1, 2, 2, 4, 4, ...`` (``1, 2, 4`` below 4 heads), ``pooling="avg"``,
``stats_from="pooled"``) are this project's reading of the derivation in the paper's framework, **not**
hyperparameters taken from the paper, whose code and settings are not public. The kernels, the causal rules and
the meaning of the returned weights are documented in :mod:`primaldual.functional.svr`; ``docs/svr_framework.md``
walks through the derivation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from ..functional.svr import _check_bn, _check_pool, check_factors, memory_ratio, svr_attention
from .base import QKVAttention
from .registry import Capabilities, register_attention

__all__ = [
    "LinearBNAttention",
    "LinearBNSHAttention",
    "LinearSHAttention",
    "SoftmaxBNAttention",
    "SoftmaxBNSHAttention",
    "SoftmaxSHAttention",
]

_SH_MEMORY = "O(N^2 (1/H) sum_h 1/r_h) eager"


class _SVRAttention(QKVAttention):
    """Shared ``attend`` for the six layers; subclasses call :meth:`_setup` with their options.

    No ``__init__`` here on purpose: the registry lists a layer's options from the constructors along its MRO,
    and each layer should list only the options it has.
    """

    kernel: str = "softmax"

    def _setup(self, bn: dict[str, Any] | None, sh: dict[str, Any] | None, **kernel_opts: Any) -> None:
        if bn is not None:
            _check_bn(bn["beta"], bn["bn_eps"], bn["stats_over"])
            if bn.get("stats_from", "pooled") not in ("pooled", "full"):
                raise ValueError(f"stats_from must be 'pooled' or 'full', got {bn['stats_from']!r}")
        if sh is not None:
            sh["factors"] = check_factors(sh["factors"], self.num_heads)
            if sh["grid"] is not None:
                sh["grid"] = tuple(sh["grid"])
            _check_pool(sh["pooling"], sh["grid"], sh["num_cls"])
            if self.causal and sh["grid"] is not None:
                raise ValueError("grid pooling is for non-causal patch grids; use grid=None with causal=True")
        if self.kernel == "linear" and self.attn_drop:
            raise ValueError("attn_drop must be 0 for linear attention (no attention matrix is formed)")
        self.bn_options = dict(bn or {})
        self.sh_options = dict(sh or {})
        self.kernel_options = kernel_opts

    @property
    def factors(self) -> list[int]:
        """Per-head downsampling factors (all 1 without SH)."""
        return list(self.sh_options.get("factors", [1] * self.num_heads))

    def memory_ratio(self) -> float:
        """Predicted attention-matrix memory relative to full multi-head attention."""
        return memory_ratio(self.factors, self.sh_options.get("grid"))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, need_weights: bool):
        """q, k, v: ``(B, H, N, D)``; key_mask ``(B, N)`` bool, True = real. Returns ``(B, H, N, D)``."""
        opts = dict(self.kernel_options)
        if self.kernel == "softmax":
            opts["dropout_p"] = self.attn_drop if self.training else 0.0
        return svr_attention(
            q,
            k,
            v,
            kernel=self.kernel,
            key_mask=key_mask,
            causal=self.causal,
            bn=bool(self.bn_options),
            **self.bn_options,
            **self.sh_options,
            need_weights=need_weights,
            **opts,
        )

    def extra_repr(self) -> str:
        parts = [super().extra_repr()]
        parts += [f"{k}={v!r}" for k, v in {**self.bn_options, **self.sh_options}.items()]
        return ", ".join(parts)


@register_attention(
    "softmax_bn",
    Capabilities(time="O(N^2 D)", memory="O(N) fused (SDPA) / O(N^2) eager"),
)
class SoftmaxBNAttention(_SVRAttention):
    """Attention-BN: softmax attention on queries and keys normalised with the keys' statistics.

    ``q^ = (q - beta mu) / s``, ``k^ = (k - beta mu) / s`` with ``mu``, ``s`` the mean and standard deviation of the
    real keys of each sequence and head (per channel). Causal use normalises query i with the statistics of keys
    ``j <= i`` (prefix statistics), so nothing leaks from the future.

    Args:
        beta: weight on the key mean (0: no centring).
        divide_std: divide by the keys' standard deviation.
        bn_eps: added to the variance.
        stats_over: ``"tokens"`` (per sequence) or ``"batch"`` (batch x tokens); pads excluded either way.
        scale: logit scale (default ``1 / sqrt(head_dim)``).
        backend: ``"auto"``, ``"sdpa"`` or ``"eager"`` (as :class:`~primaldual.attention.softmax.SoftmaxAttention`).
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer`.
    """

    kernel = "softmax"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        beta: float = 1.0,
        divide_std: bool = True,
        bn_eps: float = 1e-5,
        stats_over: str = "tokens",
        scale: float | None = None,
        backend: str = "auto",
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        bn = {"beta": beta, "divide_std": bool(divide_std), "bn_eps": bn_eps, "stats_over": stats_over}
        self._setup(bn, None, scale=scale, backend=_check_backend(backend))


@register_attention(
    "linear_bn",
    Capabilities(
        causal=False,
        time="O(N D^2)",
        memory="O(N D + D^2)",
        weights_meaning="normalised kernel matrix of the normalised q, k (materialised)",
    ),
)
class LinearBNAttention(_SVRAttention):
    """Linear-BN: linear attention (elu + 1 features) on BN-normalised queries and keys. Non-causal only.

    Causal use is refused: per-query prefix statistics would change every key's features for every query.

    Args:
        beta, divide_std, bn_eps, stats_over: as :class:`SoftmaxBNAttention`.
        eps: added to the linear-attention normaliser.
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer` (``attn_drop`` must be 0).
    """

    kernel = "linear"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        beta: float = 1.0,
        divide_std: bool = True,
        bn_eps: float = 1e-5,
        stats_over: str = "tokens",
        eps: float = 1e-6,
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        bn = {"beta": beta, "divide_std": bool(divide_std), "bn_eps": bn_eps, "stats_over": stats_over}
        self._setup(bn, None, eps=float(eps))


@register_attention(
    "softmax_sh",
    Capabilities(
        time="O(N D sum_h N/r_h)",
        memory=_SH_MEMORY,
        weights_meaning="row-stochastic; a pooled key's weight spread over its tokens by the pooling weights",
    ),
)
class SoftmaxSHAttention(_SVRAttention):
    """Attention-SH: softmax attention whose head h sees keys and values downsampled by ``r_h``.

    Queries stay at full length. Heads sharing a factor run as one batched group.

    Args:
        factors: per-head factors ``r_h >= 1`` (one int for all heads; default ladder ``1, 1, 2, 2, 4, 4, ...``,
            ``1, 2, 4`` below 4 heads).
        pooling: ``"avg"`` (padding-aware average pooling, stride r) or ``"stride"`` (every r-th token).
        grid: ``(gh, gw)`` to pool a row-major patch grid with ``r x r`` windows (non-causal only).
        num_cls: leading tokens (e.g. CLS) left unpooled in grid mode.
        scale, backend: as :class:`SoftmaxBNAttention`.
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer`.
    """

    kernel = "softmax"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        factors: Sequence[int] | int | None = None,
        pooling: str = "avg",
        grid: tuple[int, int] | None = None,
        num_cls: int = 0,
        scale: float | None = None,
        backend: str = "auto",
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        sh = {"factors": factors, "pooling": pooling, "grid": grid, "num_cls": num_cls}
        self._setup(None, sh, scale=scale, backend=_check_backend(backend))


@register_attention(
    "linear_sh",
    Capabilities(
        time="O(N D^2)",
        memory="O(N D + D^2)",
        weights_meaning="normalised kernel matrix; a pooled key's weight spread over its tokens",
    ),
)
class LinearSHAttention(_SVRAttention):
    """Linear attention with scaled heads: head h's keys and values downsampled by ``r_h``.

    Args:
        factors, pooling, grid, num_cls: as :class:`SoftmaxSHAttention`.
        eps: added to the linear-attention normaliser. chunk_size: chunk length of the causal scan.
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer` (``attn_drop`` must be 0).
    """

    kernel = "linear"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        factors: Sequence[int] | int | None = None,
        pooling: str = "avg",
        grid: tuple[int, int] | None = None,
        num_cls: int = 0,
        eps: float = 1e-6,
        chunk_size: int = 64,
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        sh = {"factors": factors, "pooling": pooling, "grid": grid, "num_cls": num_cls}
        self._setup(None, sh, eps=float(eps), chunk_size=_check_chunk(chunk_size))


@register_attention(
    "softmax_bn_sh",
    Capabilities(
        time="O(N D sum_h N/r_h)",
        memory=_SH_MEMORY,
        weights_meaning="row-stochastic; a pooled key's weight spread over its tokens by the pooling weights",
    ),
)
class SoftmaxBNSHAttention(_SVRAttention):
    """Attention-BN+SH: scaled heads, each normalised with the statistics of its own keys.

    Args:
        beta, divide_std, bn_eps, stats_over: as :class:`SoftmaxBNAttention`.
        stats_from: ``"pooled"`` (statistics of each head's downsampled keys, default) or ``"full"``
            (of its full-resolution keys).
        factors, pooling, grid, num_cls: as :class:`SoftmaxSHAttention`.
        scale, backend: as :class:`SoftmaxBNAttention`.
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer`.
    """

    kernel = "softmax"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        beta: float = 1.0,
        divide_std: bool = True,
        bn_eps: float = 1e-5,
        stats_over: str = "tokens",
        stats_from: str = "pooled",
        factors: Sequence[int] | int | None = None,
        pooling: str = "avg",
        grid: tuple[int, int] | None = None,
        num_cls: int = 0,
        scale: float | None = None,
        backend: str = "auto",
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        bn = {
            "beta": beta,
            "divide_std": bool(divide_std),
            "bn_eps": bn_eps,
            "stats_over": stats_over,
            "stats_from": stats_from,
        }
        sh = {"factors": factors, "pooling": pooling, "grid": grid, "num_cls": num_cls}
        self._setup(bn, sh, scale=scale, backend=_check_backend(backend))


@register_attention(
    "linear_bn_sh",
    Capabilities(
        causal=False,
        time="O(N D^2)",
        memory="O(N D + D^2)",
        weights_meaning="normalised kernel matrix; a pooled key's weight spread over its tokens",
    ),
)
class LinearBNSHAttention(_SVRAttention):
    """Linear attention with BN and scaled heads. Non-causal only (as :class:`LinearBNAttention`).

    Args:
        beta, divide_std, bn_eps, stats_over, stats_from: as :class:`SoftmaxBNSHAttention`.
        factors, pooling, grid, num_cls: as :class:`SoftmaxSHAttention`.
        eps: added to the linear-attention normaliser.
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer` (``attn_drop`` must be 0).
    """

    kernel = "linear"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        beta: float = 1.0,
        divide_std: bool = True,
        bn_eps: float = 1e-5,
        stats_over: str = "tokens",
        stats_from: str = "pooled",
        factors: Sequence[int] | int | None = None,
        pooling: str = "avg",
        grid: tuple[int, int] | None = None,
        num_cls: int = 0,
        eps: float = 1e-6,
        **kw,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        bn = {
            "beta": beta,
            "divide_std": bool(divide_std),
            "bn_eps": bn_eps,
            "stats_over": stats_over,
            "stats_from": stats_from,
        }
        sh = {"factors": factors, "pooling": pooling, "grid": grid, "num_cls": num_cls}
        self._setup(bn, sh, eps=float(eps))


def _check_backend(backend: str) -> str:
    if backend not in ("auto", "sdpa", "eager"):
        raise ValueError(f"backend must be 'auto', 'sdpa' or 'eager', got {backend!r}")
    return backend


def _check_chunk(chunk_size: int) -> int:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    return chunk_size
