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

Each option group is declared once, as a frozen dataclass that validates itself (:class:`BNOptions`,
:class:`SHOptions`, :class:`SoftmaxKernelOptions`, :class:`LinearKernelOptions`, ...); a layer lists its groups
in ``option_types`` and the registry reads the options and defaults from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from torch import Tensor

from ..functional.svr import check_bn, check_factors, check_pool, memory_ratio, svr_attention
from ..options import check_bool, check_choice, check_int, check_number
from .base import QKVAttention
from .capabilities import Capabilities
from .registry import register_attention

__all__ = [
    "BNOptions",
    "BNSHOptions",
    "LinearBNAttention",
    "LinearBNSHAttention",
    "LinearKernelOptions",
    "LinearSHAttention",
    "LinearScanOptions",
    "SHOptions",
    "SoftmaxBNAttention",
    "SoftmaxBNSHAttention",
    "SoftmaxKernelOptions",
    "SoftmaxSHAttention",
]

_SH_MEMORY = "O(N^2 (1/H) sum_h 1/r_h) eager"


@dataclass(frozen=True)
class BNOptions:
    """Attention-BN: q, k normalised with the keys' statistics.

    Attributes:
        beta: weight on the key mean (0: no centring).
        divide_std: divide by the keys' standard deviation.
        bn_eps: added to the variance (> 0).
        stats_over: ``"tokens"`` (per sequence) or ``"batch"`` (batch x tokens); pads excluded either way.

    Under float16 / bfloat16 (weights or autocast) the statistics, the normalisation and the kernel run in
    float32 and the output is cast back (float16 overflows in the sums of squares and in ``1 / s^2``).
    """

    beta: float = 1.0
    divide_std: bool = True
    bn_eps: float = 1e-5
    stats_over: str = "tokens"

    def __post_init__(self) -> None:
        check_bool("divide_std", self.divide_std)
        check_number("beta", self.beta)
        check_number("bn_eps", self.bn_eps, low=0.0, low_open=True)
        check_choice("stats_over", self.stats_over, ("tokens", "batch"))
        check_bn(self.beta, self.bn_eps, self.stats_over)


@dataclass(frozen=True)
class BNSHOptions(BNOptions):
    """Attention-BN+SH: :class:`BNOptions` plus where the statistics come from.

    Attributes:
        stats_from: ``"pooled"`` (each head's downsampled keys, default) or ``"full"`` (its full-resolution keys).
    """

    stats_from: str = "pooled"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("stats_from", self.stats_from, ("pooled", "full"))


@dataclass(frozen=True)
class SHOptions:
    """Attention-SH: keys and values of head h downsampled by ``factors[h]``.

    Attributes:
        factors: one int >= 1 for all heads, or one per head (None: the ladder ``1, 1, 2, 2, 4, 4, ...``,
            ``1, 2, 4`` below 4 heads; resolved against the number of heads by the layer).
        pooling: ``"avg"`` (average pooling, stride r) or ``"stride"`` (every r-th token). Windows are cut from
            each sequence's real tokens, starting at the first one, so padding on either side (or inside) never
            enters or shifts a window: outputs at real tokens equal those of the unpadded sequence.
        grid: ``(gh, gw)`` to pool a row-major patch grid with ``r x r`` windows (non-causal only). Grid windows are
            spatial: the sequence must be exactly ``num_cls + gh * gw`` tokens (a padded grid is an error), and a
            False in the mask is a missing patch, left out of its window's mean.
        num_cls: leading tokens (e.g. CLS) left unpooled in grid mode.
    """

    factors: Sequence[int] | int | None = None
    pooling: str = "avg"
    grid: tuple[int, int] | None = None
    num_cls: int = 0

    def __post_init__(self) -> None:
        if self.grid is not None:
            if isinstance(self.grid, (str, bytes)) or not isinstance(self.grid, Sequence):
                raise ValueError(f"grid must be None or a pair of ints >= 1, got {self.grid!r}")
            object.__setattr__(self, "grid", tuple(self.grid))
        check_int("num_cls", self.num_cls, low=0)
        check_choice("pooling", self.pooling, ("avg", "stride"))
        check_pool(self.pooling, self.grid, self.num_cls)


@dataclass(frozen=True)
class SoftmaxKernelOptions:
    """The softmax kernel.

    Attributes:
        scale: logit scale (default ``1 / sqrt(head_dim)``).
        backend: ``"auto"``, ``"sdpa"`` or ``"eager"`` (as :class:`~primaldual.attention.softmax.SoftmaxAttention`).
    """

    scale: float | None = None
    backend: str = "auto"

    def __post_init__(self) -> None:
        check_number("scale", self.scale, allow_none=True)
        check_choice("backend", self.backend, ("auto", "sdpa", "eager"))


@dataclass(frozen=True)
class LinearKernelOptions:
    """The linear (elu + 1) kernel.

    Attributes:
        eps: added to the linear-attention normaliser (> 0).
    """

    eps: float = 1e-6

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps", check_number("eps", self.eps, low=0.0, low_open=True))


@dataclass(frozen=True)
class LinearScanOptions(LinearKernelOptions):
    """The linear kernel with a causal chunked scan.

    Attributes:
        chunk_size: chunk length of the causal scan (>= 1).
    """

    chunk_size: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("chunk_size", self.chunk_size, low=1)


class _SVRAttention(QKVAttention):
    """The six SVR-family layers: options come from ``option_types``, ``attend`` runs :func:`svr_attention`.

    Attributes:
        options: the validated option groups, one frozen dataclass per entry of ``option_types``.
        bn_options, sh_options, kernel_options: the same, as keyword dictionaries for :func:`svr_attention`
            (``sh_options["factors"]`` resolved to one int per head).
    """

    kernel: ClassVar[str] = "softmax"
    option_types: ClassVar[tuple[type, ...]] = ()

    def __init__(self, dim: int, num_heads: int, **kw: Any) -> None:
        groups = []
        for group in type(self).option_types:
            names = {f.name for f in fields(group)}
            groups.append(group(**{k: kw.pop(k) for k in list(kw) if k in names}))
        super().__init__(dim, num_heads, **kw)
        self.options = tuple(groups)
        bn = next((asdict(g) for g in groups if isinstance(g, BNOptions)), None)
        sh = next((asdict(g) for g in groups if isinstance(g, SHOptions)), None)
        kern = next(asdict(g) for g in groups if isinstance(g, (SoftmaxKernelOptions, LinearKernelOptions)))
        if sh is not None:
            sh["factors"] = check_factors(sh["factors"], self.num_heads)
            if self.causal and sh["grid"] is not None:
                raise ValueError("grid pooling is for non-causal patch grids; use grid=None with causal=True")
        if kern.get("chunk_size", 64) != 64 and not self.causal:
            raise ValueError("chunk_size: only the causal scan reads it; this layer (causal=False) would ignore it")
        if self.kernel == "linear" and self.attn_drop:
            raise ValueError("attn_drop must be 0 for linear attention (no attention matrix is formed)")
        self.bn_options = bn or {}
        self.sh_options = sh or {}
        self.kernel_options = kern

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

    Options: :class:`BNOptions` (``beta``, ``divide_std``, ``bn_eps``, ``stats_over``) and
    :class:`SoftmaxKernelOptions` (``scale``, ``backend``); the rest as
    :class:`~primaldual.attention.base.AttentionLayer`.
    """

    kernel = "softmax"
    option_types = (BNOptions, SoftmaxKernelOptions)


@register_attention(
    "linear_bn",
    Capabilities(
        causal=False,
        decoding="none",
        time="O(N D^2)",
        memory="O(N D + D^2)",
        weights_meaning="normalised kernel matrix of the normalised q, k (materialised)",
    ),
)
class LinearBNAttention(_SVRAttention):
    """Linear-BN: linear attention (elu + 1 features) on BN-normalised queries and keys. Non-causal only.

    Causal use is refused: per-query prefix statistics would change every key's features for every query.

    Options: :class:`BNOptions` and :class:`LinearKernelOptions` (``eps``); the rest as
    :class:`~primaldual.attention.base.AttentionLayer` (``attn_drop`` must be 0).
    """

    kernel = "linear"
    option_types = (BNOptions, LinearKernelOptions)


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

    Options: :class:`SHOptions` (``factors``, ``pooling``, ``grid``, ``num_cls``) and
    :class:`SoftmaxKernelOptions`; the rest as :class:`~primaldual.attention.base.AttentionLayer`.
    """

    kernel = "softmax"
    option_types = (SHOptions, SoftmaxKernelOptions)


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

    Options: :class:`SHOptions` and :class:`LinearScanOptions` (``eps``, ``chunk_size``); the rest as
    :class:`~primaldual.attention.base.AttentionLayer` (``attn_drop`` must be 0).
    """

    kernel = "linear"
    option_types = (SHOptions, LinearScanOptions)


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

    Options: :class:`BNSHOptions` (:class:`BNOptions` and ``stats_from``), :class:`SHOptions` and
    :class:`SoftmaxKernelOptions`; the rest as :class:`~primaldual.attention.base.AttentionLayer`.
    """

    kernel = "softmax"
    option_types = (BNSHOptions, SHOptions, SoftmaxKernelOptions)


@register_attention(
    "linear_bn_sh",
    Capabilities(
        causal=False,
        decoding="none",
        time="O(N D^2)",
        memory="O(N D + D^2)",
        weights_meaning="normalised kernel matrix; a pooled key's weight spread over its tokens",
    ),
)
class LinearBNSHAttention(_SVRAttention):
    """Linear attention with BN and scaled heads. Non-causal only (as :class:`LinearBNAttention`).

    Options: :class:`BNSHOptions`, :class:`SHOptions` and :class:`LinearKernelOptions`; the rest as
    :class:`~primaldual.attention.base.AttentionLayer` (``attn_drop`` must be 0).
    """

    kernel = "linear"
    option_types = (BNSHOptions, SHOptions, LinearKernelOptions)
