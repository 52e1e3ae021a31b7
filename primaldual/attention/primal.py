"""Primal-Attention layer (Chen et al., NeurIPS 2023): self-attention as asymmetric kernel SVD, in the primal.

Per head h (p = head width, s = low rank), for the layer input X ``(B, N, C)``::

    Q, K       = X W_q + b_q, X W_k + b_k                 (no value projection, no softmax)
    phi_q, phi_k = row-wise L2 normalisation of Q and K   (zero vector -> 0)
    W_{e|X,h}  = f_h(X)^T W_{e,h},  W_{r|X,h} = f_h(X)^T W_{r,h}
                 f_h(X): n evenly spaced tokens of X, channels h*p ... h*p+p-1  -> (n, p)
    e = phi_q W_{e|X},  r = phi_k W_{r|X}                 (B, H, N, s) each
    out = Linear_out( merge_heads( Linear(2s -> p)([e; r]) ) )   (the 2s -> p Linear is shared by all heads)

and the layer stores its KSVD term (see :func:`primaldual.functional.primal.ksvd_loss`) for
:func:`primaldual.collect_aux_loss`, which returns ``eta * mean over primal layers of the term``.

**Causal** (``causal=True``): W_e, W_r are plain ``(H, p, s)`` parameters and q, k are replaced by their
prefix means before the feature map, so position i sees positions <= i only. :meth:`PrimalAttention.step`
decodes one token at a time from a constant-size state (running sums of q and k and a count).

**Padding** (``padding``):

* ``"exact"`` (default): the n tokens are sampled among each sequence's real tokens, padded tokens are
  left out of the KSVD means (and, causal, of the prefix means), padded outputs are zero. Outputs at real
  tokens then do not depend on how much padding a batch carries, which is what a mask promises.
* ``"reference"``: the reference code's behaviour: positions are sampled over the padded length (padding
  tokens enter W_{e|X}), the KSVD means run over every token; only the output is masked. For comparison
  with the published code. Without padding both modes are identical.

**Compiled core** (``compile=True``): the layer's core (sampling, data-dependent weights, projection, feature map,
scores, KSVD term and output map) runs as one ``torch.compile`` region, so that the element-wise work between the
GEMMs (norms, scaling, the KSVD energies and all their backward passes) is fused into a few loops instead of a dozen
token-sized passes with their temporaries (see ``docs/benchmarks.md``). The first call of each layer checks the
compiled result against the eager one; where compilation fails (no C++ compiler for the CPU backend, an unsupported
backend) or disagrees, the layer warns once, naming the cause, and stays eager. Inside an outer ``torch.compile``
(``model.compile()``, ``trainer.compile``) the layer adds no region of its own. Hooks on ``head_outputs`` and
``need_weights=True`` take the eager path.

**Evaluation path** (``path``): ``"auto"`` (default) evaluates long sequences on CPU in the rotated basis of
:mod:`primaldual.functional.primal_rotated` and the rest on the score paths of :mod:`primaldual.functional.primal`
(folded or per-head scores, by cost), deciding per call by shape, device, compiled or not and whether a backward
pass follows, against ``thresholds`` (:class:`~primaldual.functional.primal_rotated.RotatedThresholds`).
``"rotated"`` and ``"scores"`` force one of the two; all of them give the same outputs and gradients up to rounding.

``need_weights=True`` returns the implicit asymmetric kernel ``phi_q(Q) phi_k(K)^T`` per head
``(B, H, N, N)`` (causal: of the prefix-mean features, lower triangle), the matrix whose SVD the KSVD
objective is about. It is not a mixing matrix: the output is not ``weights @ v``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..aux_loss import AuxLossMixin
from ..checks import check_mask, check_tokens
from ..functional.primal import (
    KSVD_REDUCTIONS,
    PADDING_MODES,
    causal_prefix_mean,
    cosine_feature_map,
    data_dependent_weights,
    ksvd_loss_from_energies,
    ksvd_loss_from_scores,
    primal_kernel,
    primal_scores_from_input,
    sample_tokens,
)
from ..functional.primal_rotated import DEFAULT_THRESHOLDS, RotatedThresholds, primal_output_rotated, use_rotated
from ..options import UnusedOptionWarning, check_bool, check_choice, check_int, check_number
from .base import AttentionLayer, accumulation_dtype
from .capabilities import Capabilities
from .registry import register_attention

__all__ = ["PATHS", "PrimalAttention", "PrimalState", "RotatedThresholds", "reset_primal_weights"]

PATHS = ("auto", "rotated", "scores")
KERNELS = ("torch", "triton")


class PrimalState(NamedTuple):
    """Incremental-decoding state of a causal primal layer (constant size in the sequence length).

    Attributes:
        sum_q: ``(B, H, p)`` running sum of the real tokens' queries.
        sum_k: ``(B, H, p)`` running sum of the real tokens' keys.
        count: ``(B,)`` number of real tokens seen.
    """

    sum_q: Tensor
    sum_k: Tensor
    count: Tensor


def reset_primal_weights(w_e: Tensor, w_r: Tensor, lam: Tensor) -> None:
    """The reference initialisation of ``W_e``, ``W_r`` (orthogonal over the whole tensor; half precision drawn in
    float32 and cast, QR has no half kernel) and ``Lambda`` (uniform [0, 1)), in place."""
    with torch.no_grad():
        for w in (w_e, w_r):
            if w.is_meta:
                continue
            dtype = torch.float32 if w.dtype in (torch.float16, torch.bfloat16) else w.dtype
            w.copy_(nn.init.orthogonal_(torch.empty(w.shape, device=w.device, dtype=dtype)))
        nn.init.uniform_(lam)


def _no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off on ``device_type`` (a no-op where autocast does not exist, e.g. the meta device)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


_COMPILED_CORE = None


def _compiled_core():
    """One compiled ``PrimalAttention._core`` shared by every layer (Dynamo guards on each layer's options)."""
    global _COMPILED_CORE
    if _COMPILED_CORE is None:
        _COMPILED_CORE = torch.compile(PrimalAttention._core, dynamic=None)
    return _COMPILED_CORE


def _check_thresholds(value: RotatedThresholds | Mapping[str, int] | None) -> RotatedThresholds:
    """The ``thresholds`` option as a :class:`RotatedThresholds` (None: the defaults; a mapping: its fields)."""
    if value is None:
        return DEFAULT_THRESHOLDS
    if isinstance(value, RotatedThresholds):
        return value
    if isinstance(value, Mapping):
        names = [f.name for f in dataclasses.fields(RotatedThresholds)]
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(
                f"thresholds: unknown field(s) {', '.join(map(repr, unknown))}; RotatedThresholds has {', '.join(names)}"
            )
        return RotatedThresholds(**value)
    raise TypeError(
        f"thresholds must be a RotatedThresholds, a mapping of its fields or None, got {value!r} "
        f"({type(value).__name__})"
    )


def _disagreement(a: Tensor, b: Tensor) -> str | None:
    """Why ``a`` (compiled) is not ``b`` (eager) up to the dtype's rounding, or None when it is."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    tol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(a.dtype, 3e-2)
    err = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    scale = b.float().abs().max().item() if b.numel() else 0.0
    if not err <= tol * max(scale, 1.0):  # also catches NaN
        return f"max abs difference {err:.3g} at scale {scale:.3g}"
    return None


@register_attention(
    "primal",
    Capabilities(
        time="O(N p s)",
        memory="O(N s)",
        aux_loss=True,
        decoding="constant",
        weights_meaning="implicit asymmetric kernel phi_q(Q) phi_k(K)^T per head (not row-stochastic)",
        stochastic_weights=False,
    ),
)
class PrimalAttention(AuxLossMixin, AttentionLayer):
    """Primal-Attention: KSVD projection scores [e; r] instead of a softmax attention matrix.

    Args:
        dim: model width C. num_heads: heads H.
        s: low rank (number of projection directions per head).
        rank_multi: n = s * rank_multi sampled tokens (unless ``n`` is given).
        n: explicit number of sampled tokens (overrides ``s * rank_multi`` and ``max_len``).
        max_len: longest sequence the layer will see; n = min(max_len, s * rank_multi) (the time-series
            code's rule). Longer inputs still work (sampling is by fraction of the length).
        eta: weight of this layer's KSVD term in :func:`primaldual.collect_aux_loss`.
        data_dependent: W_{e|X} = f(X)^T W_e with W_e ``(H, n, s)`` (default for non-causal); False: W_e,
            W_r are ``(H, head_dim, s)`` parameters (always so for causal).
        padding: ``"exact"`` (default) or ``"reference"``; see the module docstring.
        ksvd_reduction: ``"global"`` (LRA / vision code: one mean, squared) or ``"sample"`` (time-series
            code: J per sample, squared, averaged over the batch).
        eps: zero-norm guard of the feature map.
        compile: run the core as one ``torch.compile`` region with an eager fallback (see the module docstring).
        path: how the sequence forward is evaluated (see the module docstring):

            * ``"auto"``: by cost, :func:`~primaldual.functional.primal_rotated.use_rotated` against ``thresholds``
              (the rotated basis on CPU for long sequences when a backward pass follows, else the score paths).
            * ``"rotated"``: always the rotated basis, also without a backward pass (slower there, but correct) and
              on CUDA (its ``torch.linalg.eigh`` reads LAPACK's error codes back to the host on every call, which
              on CUDA synchronises the device: no CUDA graphs; ``"auto"`` never takes it there).
              ``need_weights=True`` computes the kernel matrix beside it. Hooks on ``head_outputs`` raise a
              ``ValueError``: the rotated basis never forms the per-head outputs they observe.
            * ``"scores"``: always the score paths (folded or per-head scores, by cost).

            :meth:`step` decodes one token from its running state whatever the path (there is no sequence to
            rotate); its output equals the forward's on either path.
        kernel: ``"torch"`` (default) or ``"triton"``: the score path as one fused Triton kernel
            (:mod:`primaldual.kernels.primal_scores`; the ``kernels`` extra), on a CUDA device or under
            ``TRITON_INTERPRET=1``. It replaces the score paths (and, with ``path="auto"``, is preferred to the
            rotated basis); where it cannot run, the layer warns once (``RuntimeWarning``, naming the cause) and
            uses the PyTorch score path. With ``compile=True`` the kernel is one opaque operator in the compiled core,
            and the compiler fuses the work around it (the output map, the KSVD term, the casts). Off by default
            until the GPU figures justify it (docs/benchmarks.md 6).
        thresholds: where ``path="auto"`` switches to the rotated basis: a
            :class:`~primaldual.functional.primal_rotated.RotatedThresholds`, or a mapping of its fields (from a
            config file; the fields left out keep their defaults); None: the defaults. Unused by the other paths.
        Remaining arguments as :class:`~primaldual.attention.base.AttentionLayer`; ``qkv_bias`` is the
        bias of the Q/K projection; ``attn_drop`` must be 0 (there is no attention matrix).
    """

    aux_loss_group = "ksvd"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        s: int = 20,
        rank_multi: int = 10,
        n: int | None = None,
        max_len: int | None = None,
        eta: float = 0.1,
        data_dependent: bool | None = None,
        padding: str = "exact",
        ksvd_reduction: str = "global",
        eps: float = 1e-12,
        compile: bool = False,
        path: str = "auto",
        thresholds: RotatedThresholds | Mapping[str, int] | None = None,
        kernel: str = "torch",
        **kw,
    ) -> None:
        if kw.get("attn_drop", 0.0):
            raise ValueError("attn_drop must be 0 for primal attention (no attention matrix is formed)")
        super().__init__(dim, num_heads, **kw)
        check_int("s", s, low=1)
        check_int("rank_multi", rank_multi, low=1)
        check_int("n", n, low=1, allow_none=True)
        check_int("max_len", max_len, low=1, allow_none=True)
        check_choice("padding", padding, PADDING_MODES)
        check_choice("ksvd_reduction", ksvd_reduction, KSVD_REDUCTIONS)
        eta = check_number("eta", eta, low=0.0)
        eps = check_number("eps", eps, low=0.0, low_open=True)
        check_bool("compile", compile)
        check_choice("path", path, PATHS)
        check_choice("kernel", kernel, KERNELS)
        if kernel == "triton" and path == "rotated":
            raise ValueError("kernel='triton' computes the score path; it cannot serve path='rotated'")
        thresholds = _check_thresholds(thresholds)
        if data_dependent is not None:
            check_bool("data_dependent", data_dependent)
        if data_dependent is None:
            data_dependent = not self.causal
        if data_dependent and self.causal:
            raise ValueError(
                "data_dependent=True is not causal (it samples tokens from the whole sequence); "
                "causal primal attention uses data-independent W_e, W_r"
            )
        if data_dependent and self.inner_dim != dim:
            raise ValueError(
                f"data_dependent=True splits the layer input's {dim} channels into {num_heads} heads of "
                f"head_dim={self.head_dim}, so num_heads * head_dim must equal dim; got {self.inner_dim}"
            )
        self.s = s
        if path != "auto" and thresholds != DEFAULT_THRESHOLDS:
            raise ValueError(f"thresholds: only path='auto' reads it; this layer (path={path!r}) would ignore it")
        # the sampling options only the data-dependent weights read: shared option sets (a plan for causal and
        # bidirectional models alike) carry them, so they are named, not refused
        if not data_dependent and (
            unused := [
                k for k, v, d in (("n", n, None), ("rank_multi", rank_multi, 10), ("max_len", max_len, None)) if v != d
            ]
        ):
            it = "it" if len(unused) == 1 else "them"
            warnings.warn(
                f"primal attention: {', '.join(unused)} set, but only the data-dependent weights read {it}; this "
                f"layer (causal={self.causal}, data_dependent=False) ignores {it}",
                UnusedOptionWarning,
                stacklevel=3,
            )
        self.data_dependent = bool(data_dependent)
        self.n = (n if n is not None else min(max_len or s * rank_multi, s * rank_multi)) if data_dependent else None
        self.padding = padding
        self.ksvd_reduction = ksvd_reduction
        self.aux_loss_weight = float(eta)
        self.eps = float(eps)
        self.compile_core = compile
        self.path = path
        self.kernel = kernel
        self._kernel_fallback: str | None = None  # why the kernel could not run (warned once)
        self.thresholds = thresholds
        self._compile_state = "unchecked"  # "unchecked" | "ok" | "eager" (failed or disagreed: stays eager)
        fk = {"device": kw.get("device"), "dtype": kw.get("dtype")}
        H, p = num_heads, self.head_dim
        self.qk = nn.Linear(dim, 2 * self.inner_dim, bias=self.qkv_bias, **fk)
        rows = self.n if data_dependent else p
        self.w_e = nn.Parameter(torch.empty(H, rows, s, **fk))
        self.w_r = nn.Parameter(torch.empty(H, rows, s, **fk))
        self.lam = nn.Parameter(torch.empty(H, s, **fk))
        self.concat = nn.Linear(2 * s, p, **fk)
        self.proj = nn.Linear(self.inner_dim, dim, **fk)
        # the concatenated per-head outputs (B, N, H*p) pass through this when someone observes them (hooks,
        # e.g. the head-redundancy analysis); otherwise the concat and output Linears run fused
        self.head_outputs = nn.Identity()
        self.reset_primal_parameters()

    @property
    def padding_invariant(self) -> bool:
        """Whether outputs at real tokens ignore appended padding (False for the reference padding mode)."""
        return self.padding == "exact"

    def reset_primal_parameters(self) -> None:
        """The reference initialisation: W_e, W_r orthogonal over the whole tensor; Lambda uniform [0, 1).

        Half-precision weights are drawn in float32 and cast (QR has no half kernel).
        """
        reset_primal_weights(self.w_e, self.w_r, self.lam)

    # ----------------------------------------------------------------------------------------------
    def _params(self, dtype: torch.dtype) -> dict[str, Tensor | None]:
        """Every parameter the forward reads, in the compute dtype (a no-op cast unless upcasting half)."""
        named = {
            "qk_w": self.qk.weight,
            "qk_b": self.qk.bias,
            "w_e": self.w_e,
            "w_r": self.w_r,
            "lam": self.lam,
            "concat_w": self.concat.weight,
            "concat_b": self.concat.bias,
            "proj_w": self.proj.weight,
            "proj_b": self.proj.bias,
        }
        return {k: None if v is None else v.to(dtype) for k, v in named.items()}

    def _weights(self, x: Tensor, mask: Tensor | None, p: dict[str, Tensor | None]) -> Tensor:
        """``stack(W_e, W_r)`` as used by the scores: ``(B, 2, H, p, s)`` data-dependent or ``(2, H, p, s)``."""
        w = torch.stack((p["w_e"], p["w_r"]))  # (2, H, n or p, s)
        if not self.data_dependent:
            return w
        samples = sample_tokens(x, self.n, mask, self.padding)  # (B, n, C)
        return data_dependent_weights(samples, w)  # (B, 2, H, p, s)

    def _fused_output(self, p: dict[str, Tensor | None]) -> tuple[Tensor, Tensor]:
        """The concat Linear(2s -> p) of every head followed by the output Linear, as one ``(C, H*2s)`` map."""
        w_o = p["proj_w"].view(self.dim, self.num_heads, self.head_dim)  # (C, H, p)
        weight = (w_o @ p["concat_w"]).reshape(self.dim, -1)  # (C, H, 2s) -> (C, H*2s)
        return weight, w_o.sum(1) @ p["concat_b"] + p["proj_b"]

    def _compute_dtype(self, x: Tensor) -> torch.dtype | None:
        """float32 where float16 could overflow (float16 inputs, or float16 autocast), else None (as is).

        The scores are products of unnormalised projections with data-dependent weights (degree 2 in x), and
        the KSVD term sums their squares: both pass float16's 65,504 for inputs of a few hundred.
        """
        dev = x.device.type
        if x.dtype == torch.float16:
            return torch.float32
        if not torch.amp.is_autocast_available(dev):  # e.g. the meta device
            return None
        if torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.float16:
            return torch.float32
        return None

    def _forward(self, x: Tensor, mask: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        if torch.jit.is_tracing():
            raise RuntimeError(
                "torch.jit.trace cannot record primal attention: the sampled token positions depend on the mask "
                "and the length, which a trace would freeze; use torch.compile or torch.export instead"
            )
        B, N, _ = x.shape
        if B == 0 or N == 0:  # nothing to attend to: an empty output, and no KSVD term (no data)
            weights = x.new_zeros(B, self.num_heads, N, N) if need_weights else None
            # joined to the graph of x and the weights (zero gradients), so that a backward through it works
            anchor = x.sum() * 0 + sum(p.sum() for p in self.parameters()) * 0
            return x.new_zeros(B, N, self.dim) + anchor.to(x.dtype), weights
        upcast = self._compute_dtype(x)
        if upcast is None:
            return self._forward_in(x, mask, need_weights, self._params(x.dtype))
        with _no_autocast(x.device.type):
            out, weights = self._forward_in(x.to(upcast), mask, need_weights, self._params(upcast))
        return out.to(x.dtype), weights

    def _forward_in(
        self, x: Tensor, mask: Tensor | None, need_weights: bool, p: dict[str, Tensor | None]
    ) -> tuple[Tensor, Tensor | None]:
        B, N, _ = x.shape
        ho = self.head_outputs
        observed = bool(ho._forward_pre_hooks or ho._forward_hooks)
        ksvd = self.records_aux_loss()  # skipped under no_grad
        if observed and self.path == "rotated":
            raise ValueError(
                "path='rotated' never forms the per-head outputs that hooks on head_outputs observe; "
                "build the layer with path='scores' (or 'auto') to observe them"
            )
        if not (need_weights or observed):
            out, term = self._core_maybe_compiled(x, mask, p, ksvd)
            if term is not None:
                self.add_aux_loss(term)
            return self.proj_drop(out), None
        if self.path == "rotated":  # the output from the eager rotated core, the kernel matrix beside it
            out, term = self._core(x, mask, p, ksvd)
            if term is not None:
                self.add_aux_loss(term)
            return self.proj_drop(out), self._kernel_weights(x, mask, p)
        exact_mask = mask if self.padding == "exact" else None
        # causal: q, k are affine in x, so the prefix means of q and k are q, k of the prefix means of x
        src = causal_prefix_mean(x, exact_mask) if self.causal else x  # (B, N, C)
        w = self._weights(x, mask, p)
        scores, qk = primal_scores_from_input(src, p["qk_w"], p["qk_b"], w, self.eps)
        if ksvd:
            self.add_aux_loss(
                ksvd_loss_from_scores(scores, p["w_e"], p["w_r"], p["lam"], exact_mask, self.ksvd_reduction)
            )
        if observed:
            heads = F.linear(
                scores.view(B, N, self.num_heads, 2 * self.s), p["concat_w"], p["concat_b"]
            )  # (B, N, H, p)
            out = F.linear(
                ho(heads.reshape(B, N, self.inner_dim)), p["proj_w"], p["proj_b"]
            )  # (B, N, H*p) -> (B, N, C)
        else:
            weight, bias = self._fused_output(p)
            out = F.linear(scores.view(B, N, -1), weight, bias)  # (B, N, H*2s) -> (B, N, C)
        weights = None
        if need_weights:
            weights = self._kernel_from_qk(qk, mask)
        return self.proj_drop(out), weights

    def _kernel_from_qk(self, qk: Tensor, mask: Tensor | None) -> Tensor:
        """``need_weights``: the kernel matrix ``(B, H, N, N)`` from the unnormalised ``(B, N, 2, H, p)`` queries / keys."""
        phi = cosine_feature_map(qk, self.eps).permute(2, 0, 3, 1, 4)  # (2, B, H, N, p)
        return primal_kernel(phi[0], phi[1], mask, self.causal)

    def _kernel_weights(self, x: Tensor, mask: Tensor | None, p: dict[str, Tensor | None]) -> Tensor:
        """``need_weights`` beside the rotated core, which forms no queries / keys: ``(B, H, N, N)``."""
        B, N, _ = x.shape
        src = causal_prefix_mean(x, mask if self.padding == "exact" else None) if self.causal else x  # (B, N, C)
        qk = F.linear(src, p["qk_w"], p["qk_b"]).view(B, N, 2, self.num_heads, self.head_dim)  # (B, N, 2, H, p)
        return self._kernel_from_qk(qk, mask)

    def _use_kernel(self, x: Tensor) -> bool:
        """Whether the fused score kernel runs on ``x``; the first time it cannot, one named warning."""
        if self.kernel != "triton":
            return False
        from ..kernels.primal_scores import triton_unavailable_reason

        reason = triton_unavailable_reason(x, self._kernel_dtype(x))
        if reason is not None and self._kernel_fallback is None:
            self._kernel_fallback = reason
            warnings.warn(
                f"primal attention (kernel='triton'): {reason}; this layer uses its PyTorch score path",
                RuntimeWarning,
                stacklevel=5,
            )
        return reason is None

    def _rotated(self, x: Tensor, p: dict[str, Tensor | None], compiled: bool | None = None) -> bool:
        """Whether the core evaluates in the rotated basis: as ``path`` says, or for ``"auto"``
        :func:`~primaldual.functional.primal_rotated.use_rotated` against ``thresholds`` (by length, device, compiled
        or not (default: whether a trace is running) and whether a backward follows); never where the fused score
        kernel runs."""
        if self.path != "auto":
            return self.path == "rotated"
        if self.kernel == "triton" and self._use_kernel(x):
            return False
        backward = torch.is_grad_enabled() and (
            x.requires_grad or any(v is not None and v.requires_grad for v in p.values())
        )
        B, N, _ = x.shape
        return use_rotated(B, N, self.data_dependent, compiled, x.device.type, backward, thresholds=self.thresholds)

    def _core(
        self,
        x: Tensor,
        mask: Tensor | None,
        p: dict[str, Tensor | None],
        ksvd: bool,
        rotated: bool | None = None,
        kernel: bool | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Input ``(B, N, C)`` -> output ``(B, N, C)`` (before dropout) and the KSVD term (None if not ``ksvd``).

        A pure function of its arguments and the layer's options (no recording, no hooks): the region that
        ``compile=True`` compiles. ``rotated`` overrides the choice of :meth:`_rotated`, so that the eager check of a
        compiled core (run without gradients) evaluates as the compiled graph did; ``kernel`` overrides
        :meth:`_use_kernel` (decided before a compiled call: the fused kernel is one opaque operator in its graph)."""
        B, N, _ = x.shape
        exact_mask = mask if self.padding == "exact" else None
        w = self._weights(x, mask, p)
        if self._use_kernel(x) if kernel is None else kernel:  # prefix means and KSVD energies: in the kernel
            scores, term = self._kernel_scores(x, exact_mask, w, p, ksvd)
        else:
            src = causal_prefix_mean(x, exact_mask) if self.causal else x  # (B, N, C)
            if self._rotated(x, p) if rotated is None else rotated:
                weight, bias = self._fused_output(p)
                out, energy = primal_output_rotated(
                    src, p["qk_w"], p["qk_b"], w, weight, bias, p["lam"], exact_mask, self.eps, with_energy=ksvd
                )
                term = None
                if ksvd:
                    term = ksvd_loss_from_energies(energy, p["w_e"], p["w_r"], exact_mask, N, self.ksvd_reduction)
                return out, term
            scores, _ = primal_scores_from_input(src, p["qk_w"], p["qk_b"], w, self.eps)
            term = None
            if ksvd:
                term = ksvd_loss_from_scores(scores, p["w_e"], p["w_r"], p["lam"], exact_mask, self.ksvd_reduction)
        weight, bias = self._fused_output(p)
        return F.linear(scores.view(B, N, -1), weight, bias), term  # (B, N, H*2s) -> (B, N, C)

    @staticmethod
    def _kernel_dtype(x: Tensor) -> torch.dtype | None:
        """The dtype the kernel computes in for ``x``: autocast's where it is on (an operator has no autocast rule,
        so :meth:`_kernel_scores` casts as autocast would for the score path's GEMMs), else None (x's own). Float16
        autocast never gets here: :meth:`_compute_dtype` computes in float32 and turns autocast off."""
        dev = x.device.type
        if torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev):
            return torch.get_autocast_dtype(dev)
        return None

    def _kernel_scores(
        self, x: Tensor, mask: Tensor | None, w: Tensor, p: dict[str, Tensor | None], ksvd: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Scores ``(B, N, H, 2, s)`` and the KSVD term (None if not ``ksvd``) from the fused kernel: ``x`` is the layer
        input (the causal prefix means are the kernel's prologue), ``mask`` the exact-padding mask or None."""
        from ..kernels.primal_scores import primal_scores_triton

        B, N, _ = x.shape
        qk_w, qk_b = p["qk_w"], p["qk_b"]
        if (low := self._kernel_dtype(x)) is not None:
            x, qk_w, w = x.to(low), qk_w.to(low), w.to(low)
            qk_b = qk_b.to(low) if qk_b is not None else None
        out = primal_scores_triton(x, qk_w, qk_b, w, self.eps, mask=mask, causal=self.causal, energies=ksvd)
        if not ksvd:
            return out, None
        scores, sums = out  # (B, N, H, 2, s), (B, 2, H, s): sum_t m_t score^2
        energy = (sums * p["lam"].square()).sum(-1).reshape(B, 2 * self.num_heads)  # (B, 2, H) -> (B, 2H)
        return scores, ksvd_loss_from_energies(energy, p["w_e"], p["w_r"], mask, N, self.ksvd_reduction)

    def _core_maybe_compiled(
        self, x: Tensor, mask: Tensor | None, p: dict[str, Tensor | None], ksvd: bool
    ) -> tuple[Tensor, Tensor | None]:
        if not self.compile_core or self._compile_state == "eager" or torch.compiler.is_compiling():
            return self._core(x, mask, p, ksvd)
        kernel = self._use_kernel(x)  # outside the trace: it may warn, once
        if self._compile_state == "ok":
            return _compiled_core()(self, x, mask, p, ksvd, kernel=kernel)
        # first call: compile, and compare with eager before trusting it
        try:
            out, term = _compiled_core()(self, x, mask, p, ksvd, kernel=kernel)
        except Exception as err:  # noqa: BLE001 - any compiler failure falls back, with the cause named
            return self._compile_fallback(
                f"compilation failed ({type(err).__name__}: {str(err).splitlines()[0]})", x, mask, p, ksvd
            )
        rotated = self._rotated(x, p, compiled=True)  # the compiled graph's choice, taken before no_grad changes it
        with torch.no_grad():
            ref_out, ref_term = self._core(x, mask, p, ksvd, rotated=rotated, kernel=kernel)
        bad = _disagreement(out.detach(), ref_out) or (None if term is None else _disagreement(term.detach(), ref_term))
        if bad:
            return self._compile_fallback(f"the compiled core disagrees with eager ({bad})", x, mask, p, ksvd)
        self._compile_state = "ok"
        return out, term

    def _compile_fallback(
        self, reason: str, x: Tensor, mask: Tensor | None, p: dict[str, Tensor | None], ksvd: bool
    ) -> tuple[Tensor, Tensor | None]:
        self._compile_state = "eager"
        warnings.warn(f"primal attention (compile=True): {reason}; this layer runs eager", RuntimeWarning, stacklevel=4)
        return self._core(x, mask, p, ksvd)

    # ----------------------------------------------------------------------------------------------
    def init_state(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> PrimalState:
        """An empty decoding state for ``batch`` sequences (causal layers only); its sums are kept in ``dtype``
        (default: float32 for a float16 / bfloat16 layer, as the forward's prefix sums)."""
        if not self.causal:
            raise RuntimeError("incremental decoding needs a causal primal layer (causal=True)")
        ref = self.qk.weight
        fk = {"device": device or ref.device, "dtype": dtype or accumulation_dtype(ref.dtype)}
        zeros = torch.zeros(batch, self.num_heads, self.head_dim, **fk)  # (B, H, p)
        return PrimalState(zeros, zeros.clone(), torch.zeros(batch, **fk))

    def _prefill(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, PrimalState]:
        """The forward and :meth:`prefill_state` (see :meth:`AttentionLayer.prefill`): the state is a sum over the
        prompt, one more linear pass over it."""
        out, _ = self._forward(x, mask, False)
        return out, self.prefill_state(x, mask)

    def prefill_state(self, x: Tensor, mask: Tensor | None = None) -> PrimalState:
        """The decoding state after the tokens ``x`` ``(B, N, C)``: what ``N`` calls of :meth:`step` leave, in one pass.

        ``sum_q = W_q (sum_t x_t) + count * b_q`` over the real tokens (every token in the ``reference`` padding
        mode), likewise for keys. Detached: a state is for decoding, not for training.
        """
        self._check_decoding()
        check_tokens(x, self.dim, "x")
        mask = check_mask(mask, x.shape[0], x.shape[1], x.device, "mask")
        acc = accumulation_dtype(torch.promote_types(x.dtype, self.qk.weight.dtype))  # float32 for a half layer
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):  # in acc, autocast or not
            B = x.shape[0]
            every = mask is None or self.padding == "reference"
            take = x.new_ones(B, x.shape[1], dtype=acc) if every else mask.to(acc)  # (B, N)
            count = take.sum(1)  # (B,)
            qk = F.linear(torch.einsum("bn,bnc->bc", take, x.to(acc)), self.qk.weight.to(acc))  # (B, 2 H p)
            if self.qk.bias is not None:
                qk = qk + count[:, None] * self.qk.bias.to(acc)
            qk = qk.view(B, 2, self.num_heads, self.head_dim)  # (B, 2, H, p)
            return PrimalState(qk[:, 0].contiguous(), qk[:, 1].contiguous(), count)

    def step(
        self, x_t: Tensor, state: PrimalState, mask_t: Tensor | None = None, *, rope: None = None
    ) -> tuple[Tensor, PrimalState]:
        """Decode one token: the same output as the full causal forward at this position.

        Args:
            x_t: ``(B, C)`` the current token of each sequence.
            state: from :meth:`init_state` or the previous step.
            mask_t: ``(B,)`` bool, True = real token. A padded token does not enter the state (exact
                padding mode) and its output is 0.

        Returns:
            ``(y_t, new_state)`` with ``y_t`` of shape ``(B, C)``. No KSVD term is stored (inference).
        """
        if not self.causal:
            raise RuntimeError("incremental decoding needs a causal primal layer (causal=True)")
        given = mask_t
        x_t, mask_t = self._check_step(x_t, mask_t, state)
        mask_t = mask_t if given is not None else None  # no mask: the unmasked update
        self._check_step_rope(rope, x_t)  # takes none: refused by name
        B, acc = x_t.shape[0], state.sum_q.dtype  # the sums' dtype (float32 for a half layer): the step's
        qk = self.qk(x_t).view(B, 2, self.num_heads, self.head_dim).to(acc)  # (B, 2, H, p)
        if mask_t is None or self.padding == "reference":
            take = torch.ones(B, dtype=acc, device=x_t.device)
        else:
            take = mask_t.to(acc)
        sum_q = state.sum_q + qk[:, 0] * take[:, None, None]
        sum_k = state.sum_k + qk[:, 1] * take[:, None, None]
        count = state.count + take
        mean = torch.stack((sum_q, sum_k), 1) / count.clamp_min(1.0)[:, None, None, None]  # (B, 2, H, p)
        phi = cosine_feature_map(mean, self.eps)
        w = torch.stack((self.w_e, self.w_r), 1).to(acc)  # (H, 2, p, s)
        scores = torch.einsum("bthp,htps->bhts", phi, w).reshape(B, self.num_heads, 2 * self.s)  # (B, H, 2s)
        # the maps in the layer's dtype: decoding reads their weights once per token, and the error is the forward's
        out = self.concat(scores.to(self.concat.weight.dtype))  # (B, H, p)
        y = self.proj_drop(self.proj(out.reshape(B, self.inner_dim)))  # (B, C)
        if mask_t is not None:
            y = y.masked_fill(~mask_t[:, None], 0.0)
        return y, PrimalState(sum_q, sum_k, count)

    def extra_repr(self) -> str:
        n = f"n={self.n}" if self.data_dependent else "data_dependent=False"
        return (
            f"{super().extra_repr()}, s={self.s}, {n}, eta={self.aux_loss_weight}, padding={self.padding!r}, "
            f"ksvd_reduction={self.ksvd_reduction!r}"
            + (", compile=True" if self.compile_core else "")
            + (f", path={self.path!r}" if self.path != "auto" else "")
            + (f", kernel={self.kernel!r}" if self.kernel != "torch" else "")
            + (f", thresholds={self.thresholds}" if self.thresholds != DEFAULT_THRESHOLDS else "")
        )
