"""Hybrid attention (an extension, not a layer of either paper): an exact sliding window with sink tokens, plus a
causal Primal-Attention branch on what the window misses, mixed per head by a learned gate.

Per head h, for a causal sequence (ranks count real tokens, as in :mod:`primaldual.functional.sparse`)::

    window_h(i) = softmax over the keys j <= i with i - j < window, or j < sinks, of q_i k_j / sqrt(D), applied to v
    primal_h(i) = Linear(2s -> D)([phi(qbar_i) W_e,h ; phi(kbar_i) W_r,h])     qbar, kbar: prefix means of q, k
    out_h(i)    = window_h(i) + gate_h * primal_h(i)
    out         = Linear_out(merge_heads(out_h))

The window branch is :class:`~primaldual.attention.sparse.SparseAttention` with ``window - 1`` neighbours and
``sinks`` global tokens (so ``window`` keys including the query's own). The primal branch is the causal layer of
Primal-Attention (Chen et al., 2023) on the same queries and keys: prefix means, the cosine feature map,
data-independent ``W_e, W_r`` ``(H, D, s)``, a ``2s -> D`` map shared by the heads, and the KSVD term on its scores
(recorded for :func:`primaldual.collect_aux_loss`, weight ``eta``). The gate starts at ``gate_init`` (0: the layer
is the window alone, and the branch learns in); :func:`primaldual.convert.init_from_teacher` fits the branch to the
teacher's residual and sets the gate to 1. ``primal_branch=False`` drops the branch (the window-only ablation).

This is the student that :mod:`primaldual.convert` turns a trained softmax layer into: the window and sinks keep
the teacher's exact local attention (and attention sinks), the primal branch carries the rest of the context.
Rotary position embeddings (``rope=``, a Llama teacher's) rotate the window's queries and keys; the branch works on
the unrotated ones (a prefix mean of rotated vectors would average positions away). Its
decoding state does not grow with the context: the last ``window`` keys and values, the ``sinks`` first ones, and the
primal branch's running sums of q and k (:class:`HybridState`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..aux_loss import AuxLossMixin
from ..functional.primal import KSVD_REDUCTIONS, causal_prefix_mean, cosine_feature_map, ksvd_loss_from_scores
from ..functional.rotary import apply_rope
from ..options import check_bool, check_choice, check_int, check_number
from .base import AttentionLayer, KVCache, RopeTables, accumulation_dtype
from .capabilities import Capabilities
from .primal import PrimalState, reset_primal_weights
from .registry import register_attention
from .sparse import SparseAttention

__all__ = ["HybridAttention", "HybridState"]


class HybridState(NamedTuple):
    """Decoding state of a :class:`HybridAttention` layer (bounded in the context length).

    Attributes:
        window: the window cache (the sink tokens and the last ``window`` real tokens' keys and values).
        primal: the primal branch's running sums of q and k and the real-token count (``sum_q`` is empty,
            ``(B, H, 0)``, when the layer has no primal branch).
    """

    window: KVCache
    primal: PrimalState


@register_attention(
    "hybrid",
    Capabilities(
        non_causal=False,
        weights=False,
        aux_loss=True,
        time="O(N (w + g + s) D)",
        memory="O(N (w + g + s))",
        weights_meaning="none (a window softmax plus a primal branch: no single matrix)",
        decoding="window_cache",
        rope=True,
    ),
)
class HybridAttention(AuxLossMixin, SparseAttention):
    """Sliding-window softmax with sink tokens plus a causal primal branch, mixed by a per-head gate (causal only).

    Args:
        dim, num_heads: width C and heads H (head width D = C / H unless ``head_dim``).
        window: keys per query in the local window, the query's own included (default 64).
        sinks: the first ``sinks`` real tokens stay visible to every query (default 4).
        s: rank of the primal branch (default 20; at most needs ``s <= D`` for a KSVD initialisation).
        eta: weight of the branch's KSVD term in :func:`primaldual.collect_aux_loss`.
        ksvd_reduction: ``"global"`` or ``"sample"`` (as :class:`~primaldual.attention.primal.PrimalAttention`).
        primal_branch: False drops the branch (window and sinks only).
        gate_init: the gates' initial value (default 0: the window alone at first).
        eps: zero-norm guard of the feature map.
        Remaining arguments as :class:`~primaldual.attention.sparse.SparseAttention` (``scale``, ``qkv_bias``,
        ``attn_drop``, ``proj_drop``, device and dtype); ``causal`` must be True.
    """

    aux_loss_group = "ksvd"
    not_options = ("stride", "num_global")  # the base class's pattern options: this layer's is window + sinks

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        window: int = 64,
        sinks: int = 4,
        s: int = 20,
        eta: float = 0.1,
        ksvd_reduction: str = "global",
        primal_branch: bool = True,
        gate_init: float = 0.0,
        eps: float = 1e-12,
        **kw,
    ) -> None:
        check_int("window", window, low=1)
        check_int("sinks", sinks, low=0)
        for name in self.not_options:
            if name in kw:
                raise ValueError(f"{name}: not an option of hybrid attention (its pattern is window + sinks)")
        super().__init__(dim, num_heads, window=window - 1, num_global=sinks, **kw)
        check_int("s", s, low=1)
        check_choice("ksvd_reduction", ksvd_reduction, KSVD_REDUCTIONS)
        self.aux_loss_weight = check_number("eta", eta, low=0.0)
        self.has_branch = check_bool("primal_branch", primal_branch)
        branch = {
            "s": (s, 20),
            "eta": (eta, 0.1),
            "ksvd_reduction": (ksvd_reduction, "global"),
            "gate_init": (gate_init, 0.0),
            "eps": (eps, 1e-12),
        }
        if not self.has_branch and (unused := [k for k, (v, d) in branch.items() if v != d]):
            raise ValueError(f"{unused[0]}: an option of the primal branch, which primal_branch=False drops")
        gate_init = check_number("gate_init", gate_init)
        self.eps = check_number("eps", eps, low=0.0, low_open=True)
        self.keys_in_window, self.sinks, self.s, self.ksvd_reduction = window, sinks, s, ksvd_reduction
        fk = {"device": kw.get("device"), "dtype": kw.get("dtype")}
        H, D = num_heads, self.head_dim
        if self.has_branch:
            self.w_e = nn.Parameter(torch.empty(H, D, s, **fk))
            self.w_r = nn.Parameter(torch.empty(H, D, s, **fk))
            self.lam = nn.Parameter(torch.empty(H, s, **fk))
            self.concat = nn.Linear(2 * s, D, **fk)
            self.gate = nn.Parameter(torch.full((H,), float(gate_init), **fk))
            self.reset_primal_parameters()

    def reset_primal_parameters(self) -> None:
        """The primal layer's initialisation: W_e, W_r orthogonal, Lambda uniform [0, 1)."""
        reset_primal_weights(self.w_e, self.w_r, self.lam)

    # ------------------------------------------------------------------------------------------------
    def branch_scores(self, q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
        """The primal branch's scores from the layer's q, k ``(B, H, N, D)``: token-major ``(B, N, H, 2, s)``."""
        B, H, N, D = q.shape
        qk = torch.stack((q, k), 2).permute(0, 3, 2, 1, 4)  # (B, H, 2, N, D) -> (B, N, 2, H, D)
        phi = cosine_feature_map(causal_prefix_mean(qk, mask), self.eps)  # (B, N, 2, H, D)
        w = torch.stack((self.w_e, self.w_r))  # (2, H, D, s)
        return torch.einsum("bnthd,thds->bnhts", phi, w)  # (B, N, H, 2, s)

    def branch_heads(self, scores: Tensor) -> Tensor:
        """``(B, N, H, 2, s)`` scores -> the branch's per-head output ``(B, H, N, D)`` (before the gate)."""
        B, N, H = scores.shape[:3]
        return self.concat(scores.reshape(B, N, H, 2 * self.s)).transpose(1, 2)  # (B, N, H, D) -> (B, H, N, D)

    def heads(self, x: Tensor, mask: Tensor | None, rope: RopeTables | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Per-head outputs before the output projection: ``(window, branch, q|k|v)``, window and branch
        ``(B, H, N, D)`` (branch ungated, zeros without a branch), and the window's projections
        ``(3, B, H, N, D)``; records the KSVD term in a training forward. ``rope`` (validated tables) rotates the
        window's queries and keys only: the branch takes prefix means of the unrotated ones."""
        q, k, v = self._qkv(x)  # (B, H, N, D) each
        qr, kr = (q, k) if rope is None else apply_rope(q, k, *rope)
        win, _ = self.attend(qr, kr, v, mask, False)  # (B, H, N, D)
        if not self.has_branch:
            return win, torch.zeros_like(win), torch.stack((qr, kr, v))
        scores = self.branch_scores(q, k, mask)  # (B, N, H, 2, s)
        if self.records_aux_loss():
            self.add_aux_loss(ksvd_loss_from_scores(scores, self.w_e, self.w_r, self.lam, mask, self.ksvd_reduction))
        return win, self.branch_heads(scores), torch.stack((qr, kr, v))

    def _forward(
        self, x: Tensor, mask: Tensor | None, need_weights: bool, rope: RopeTables | None = None
    ) -> tuple[Tensor, Tensor | None]:
        win, branch, _ = self.heads(x, mask, rope)
        if self.has_branch:
            win = win + self.gate.view(1, -1, 1, 1).to(win.dtype) * branch  # (B, H, N, D)
        return self._out(win), None

    # ---- decoding -----------------------------------------------------------------------------------
    def _primal_state(self, batch: int, device, dtype) -> PrimalState:
        width = self.head_dim if self.has_branch else 0
        zeros = torch.zeros(batch, self.num_heads, width, device=device, dtype=dtype)  # (B, H, D)
        return PrimalState(zeros, zeros.clone(), torch.zeros(batch, device=device, dtype=dtype))

    def init_state(
        self, batch: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> HybridState:
        """An empty state for ``batch`` sequences: an empty window cache (in the layer's dtype) and zero primal sums
        (float32 for a float16 / bfloat16 layer, as the forward's prefix sums)."""
        cache = self._empty_cache(batch, device, dtype)
        return HybridState(cache, self._primal_state(batch, cache.k_buf.device, accumulation_dtype(cache.k_buf.dtype)))

    def _prefill(self, x: Tensor, mask: Tensor | None, rope: RopeTables | None = None) -> tuple[Tensor, HybridState]:
        win, branch, qkv = self.heads(x, mask, rope)
        if self.has_branch:
            win = win + self.gate.view(1, -1, 1, 1).to(win.dtype) * branch
        q, k, v = qkv.detach()  # (B, H, N, D) each, q and k rotated when rope is given
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask  # (B, N)
        k_buf, v_buf = (t.clone(memory_format=torch.contiguous_format) for t in (k, v))
        cache = self._prune(KVCache.of(k_buf, v_buf, real.clone()))
        acc = accumulation_dtype(q.dtype)
        take = real.to(acc)  # (B, N)
        primal = self._primal_state(x.shape[0], x.device, acc)
        if self.has_branch:
            if rope is not None:  # the branch sums the unrotated queries and keys
                q, k, _ = (t.detach() for t in self._qkv(x))
            with torch.autocast(x.device.type, enabled=False):  # the sums in acc, autocast or not
                sums = torch.einsum("bn,bhnd->bhd", take, torch.stack((q, k), 1).flatten(1, 2).to(acc))  # (B, 2H, D)
            sum_q, sum_k = sums.view(x.shape[0], 2, self.num_heads, -1).unbind(1)  # (B, H, D) each
            primal = PrimalState(sum_q.contiguous(), sum_k.contiguous(), take.sum(1))
        return self._out(win), HybridState(cache, primal)

    def step(
        self, x_t: Tensor, state: HybridState, mask_t: Tensor | None = None, *, rope: RopeTables | None = None
    ) -> tuple[Tensor, HybridState]:
        """Decode one token: the window on the cache plus the primal branch on the running sums (see
        :meth:`AttentionLayer.step`); equal to the forward at this position."""
        self._check_decoding()
        x_t, mask_t = self._check_step(x_t, mask_t, state)
        tables = self._check_step_rope(rope, x_t)
        q, k, v = self._qkv_step(x_t)  # (B, H, 1, D) each
        qr, kr = (q, k) if tables is None else apply_rope(q, k, *tables)
        out, cache = self._window_step(qr, kr, v, state.window, mask_t)  # (B, H, 1, D)
        primal = state.primal
        if self.has_branch:
            acc = primal.sum_q.dtype  # the sums' dtype (float32 for a half layer): the branch's
            take = mask_t.to(acc)[:, None, None]  # (B, 1, 1)
            sum_q = primal.sum_q + q[:, :, 0].to(acc) * take  # (B, H, D)
            sum_k = primal.sum_k + k[:, :, 0].to(acc) * take
            count = primal.count + mask_t.to(acc)
            mean = torch.stack((sum_q, sum_k), 1) / count.clamp_min(1.0)[:, None, None, None]  # (B, 2, H, D)
            phi = cosine_feature_map(mean, self.eps)
            w = torch.stack((self.w_e, self.w_r)).to(acc)  # (2, H, D, s)
            scores = torch.einsum("bthd,thds->bhts", phi, w)  # (B, H, 2, s)
            scores = scores.flatten(2).to(self.concat.weight.dtype)  # the map in the layer's dtype, as the forward
            branch = F.linear(scores, self.concat.weight, self.concat.bias)  # (B, H, D)
            out = out + (self.gate.view(1, -1, 1).to(out.dtype) * branch.to(out.dtype))[:, :, None]  # (B, H, 1, D)
            primal = PrimalState(sum_q, sum_k, count)
        return self._out_step(out, mask_t), HybridState(cache, primal)

    def extra_repr(self) -> str:
        branch = f"s={self.s}, eta={self.aux_loss_weight}" if self.has_branch else "primal_branch=False"
        cap = "" if self.softcap is None else f", softcap={self.softcap}"
        return f"{AttentionLayer.extra_repr(self)}, window={self.keys_in_window}, sinks={self.sinks}, {branch}{cap}"
