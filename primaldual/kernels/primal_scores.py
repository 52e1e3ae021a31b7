"""The primal layer's score path as one Triton kernel: the projection tile never leaves the chip.

:func:`~primaldual.functional.primal.primal_scores_from_input` computes ``[Q, K] = x W^T + b`` (``(B, N, 2C)``,
written to memory), reads it back for the row norms, then multiplies each head by ``W_e`` / ``W_r`` and scales.
Here one program takes ``BLOCK_M`` tokens of one sample and one (query-or-key, head) pair ``g``:

1. ``acc = x_tile @ W_g^T + b_g`` over the width C in ``BLOCK_K`` steps (``(BLOCK_M, p)``, float32 in registers);
2. ``inv = 1 / max(||acc||, eps)`` per row;
3. ``scores = (acc @ w_g) * inv`` with ``w_g`` the ``(p, s)`` weight of that head (the sample's own when the weights
   are data-dependent), stored token-major into ``(B, N, H, 2, s)``; ``inv`` into ``(B, N, 2, H)``.

So the ``(B, N, 2C)`` projection is neither written nor read: per token the kernel moves C inputs in and ``2 H s``
scores out (plus the weights, once per tile). The backward kernel (:class:`PrimalScores` saves the inputs, not the
projection) recomputes each tile the same way, then writes ``d[Q, K]`` (chain rule through the norms and the
per-head products) and one ``(p, s)`` share of ``dW`` per tile, summed afterwards in a fixed order (deterministic:
no atomics); ``dx`` and ``dW_qk`` are two GEMMs on ``d[Q, K]``.

What is not in the kernel yet (issue 44): the causal prefix mean (the caller passes prefix means of x, one
``cumsum``) and the KSVD energies (computed from the returned scores, ``2 H s`` per token).
``TRITON_INTERPRET=1`` runs it on CPU tensors, which is how CI tests it (there its products run in float32 for
bfloat16 inputs: the interpreter's bfloat16 ``tl.dot`` returns garbage, numpy having no bfloat16); on a GPU it is
what ``PrimalAttention(kernel="triton")`` calls, with half-precision products on the tensor cores.

Written by hand: the fusion is specific to this layer; no library kernel computes it.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

__all__ = ["PrimalScores", "primal_scores_triton", "triton_available", "triton_unavailable_reason"]

try:  # triton is optional (the `kernels` extra)
    import triton
    import triton.language as tl

    _IMPORT_ERROR: str | None = None
except ImportError as err:  # pragma: no cover - exercised where triton is missing
    triton, tl = None, None
    _IMPORT_ERROR = f"triton is not installed ({err}); pip install 'primaldual[kernels]'"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_unavailable_reason(x: Tensor) -> str | None:
    """None if the kernel can run on ``x``'s device and dtype, else why not (for the layer's fallback warning)."""
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR
    if x.device.type == "cpu" and not _interpreting():
        return "the input is on the CPU (the kernel runs on a CUDA device, or on the CPU under TRITON_INTERPRET=1)"
    if x.device.type == "cpu" and type(tl.standard.zeros).__name__ != "InterpretedFunction":
        return (
            "TRITON_INTERPRET=1 was set after triton was imported (its language helpers were built for a GPU); "
            "set it before anything imports triton"
        )
    if x.device.type not in ("cpu", "cuda"):
        return f"the input is on {x.device.type}, not a CUDA device"
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dtype {x.dtype} is not supported (float32, float16, bfloat16)"
    return None


def triton_available(x: Tensor) -> bool:
    return triton_unavailable_reason(x) is None


if triton is not None:

    @triton.jit
    def _scores_fwd(
        x_ptr, w_ptr, b_ptr, wes_ptr, out_ptr, inv_ptr,
        N, C, H, P, S,
        sxb, sxn, sxc,  # x (B, N, C)
        sw0, sw1,  # qk weight (2HP, C)
        swb, swg, swp, sws,  # W_e|W_r as (B or 1, 2H, P, S); swb = 0 when shared by the samples
        sob, son, sot, soh, sos,  # scores (B, N, H, 2, S): strides of b, n, q|k, head, s
        sib, sin_, sig,  # inv (B, N, 2H) view of (B, N, 2, H)
        eps,
        HAS_BIAS: tl.constexpr,
        UPCAST: tl.constexpr,  # float32 products: the interpreter's bfloat16 dot is wrong (numpy has no bfloat16)
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        g = tl.program_id(1)  # (query-or-key) * H + head: row block g*P of the fused weight
        t = g // H
        h = g % H
        b = tl.program_id(2)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols_p = tl.arange(0, BLOCK_P)
        row_ok = rows < N
        p_ok = cols_p < P
        acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
        for k0 in range(0, C, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < C
            xt = tl.load(
                x_ptr + b * sxb + rows[:, None] * sxn + ks[None, :] * sxc,
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )  # (BLOCK_M, BLOCK_K)
            wt = tl.load(
                w_ptr + (g * P + cols_p)[None, :] * sw0 + ks[:, None] * sw1,
                mask=k_ok[:, None] & p_ok[None, :],
                other=0.0,
            )  # (BLOCK_K, BLOCK_P): W_g^T
            if UPCAST:
                acc += tl.dot(xt.to(tl.float32), wt.to(tl.float32))
            else:
                acc += tl.dot(xt, wt.to(xt.dtype))  # the input dtype on the tensor cores, accumulated in float32
        if HAS_BIAS:
            bias = tl.load(b_ptr + g * P + cols_p, mask=p_ok, other=0.0)
            acc += bias[None, :].to(tl.float32)
        inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(acc * acc, axis=1)), eps)  # (BLOCK_M,)
        cols_s = tl.arange(0, BLOCK_S)
        s_ok = cols_s < S
        we = tl.load(
            wes_ptr + b * swb + g * swg + cols_p[:, None] * swp + cols_s[None, :] * sws,
            mask=p_ok[:, None] & s_ok[None, :],
            other=0.0,
        )  # (BLOCK_P, BLOCK_S)
        u = tl.dot(acc, we.to(tl.float32)) * inv[:, None]  # (BLOCK_M, BLOCK_S)
        tl.store(
            out_ptr + b * sob + rows[:, None] * son + t * sot + h * soh + cols_s[None, :] * sos,
            u.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & s_ok[None, :],
        )
        tl.store(inv_ptr + b * sib + rows * sin_ + g * sig, inv, mask=row_ok)

    @triton.jit
    def _scores_bwd(
        x_ptr, w_ptr, b_ptr, wes_ptr, g_ptr, dqk_ptr, dwes_ptr,
        N, C, H, P, S, T,
        sxb, sxn, sxc,
        sw0, sw1,
        swb, swg, swp, sws,
        sgb, sgn, sgt, sgh, sgs,  # grad of the scores (B, N, H, 2, S)
        sdb, sdn, sdc,  # d_qk (B, N, 2HP)
        eps,
        HAS_BIAS: tl.constexpr,
        UPCAST: tl.constexpr,  # float32 products: the interpreter's bfloat16 dot is wrong (numpy has no bfloat16)
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        g = tl.program_id(1)
        b = tl.program_id(2)
        t = g // H
        h = g % H
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols_p = tl.arange(0, BLOCK_P)
        cols_s = tl.arange(0, BLOCK_S)
        row_ok = rows < N
        p_ok = cols_p < P
        s_ok = cols_s < S
        # the projection tile, recomputed as in the forward (never stored)
        acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
        for k0 in range(0, C, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < C
            xt = tl.load(
                x_ptr + b * sxb + rows[:, None] * sxn + ks[None, :] * sxc,
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            wt = tl.load(
                w_ptr + (g * P + cols_p)[None, :] * sw0 + ks[:, None] * sw1,
                mask=k_ok[:, None] & p_ok[None, :],
                other=0.0,
            )
            if UPCAST:
                acc += tl.dot(xt.to(tl.float32), wt.to(tl.float32))
            else:
                acc += tl.dot(xt, wt.to(xt.dtype))
        if HAS_BIAS:
            bias = tl.load(b_ptr + g * P + cols_p, mask=p_ok, other=0.0)
            acc += bias[None, :].to(tl.float32)
        nrm = tl.sqrt(tl.sum(acc * acc, axis=1))
        inv = 1.0 / tl.maximum(nrm, eps)
        we = tl.load(
            wes_ptr + b * swb + g * swg + cols_p[:, None] * swp + cols_s[None, :] * sws,
            mask=p_ok[:, None] & s_ok[None, :],
            other=0.0,
        ).to(tl.float32)  # (BLOCK_P, BLOCK_S)
        u = tl.dot(acc, we)  # (BLOCK_M, BLOCK_S), unscaled
        go = tl.load(
            g_ptr + b * sgb + rows[:, None] * sgn + t * sgt + h * sgh + cols_s[None, :] * sgs,
            mask=row_ok[:, None] & s_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        du = go * inv[:, None]  # d(scores)/d(u) = inv
        d_inv = tl.sum(go * u, axis=1)  # (BLOCK_M,)
        # inv = 1 / max(||acc||, eps): d inv / d acc = -acc inv^3 where the norm is above eps, else 0
        coef = tl.where(nrm > eps, -d_inv * inv * inv * inv, 0.0)
        dacc = tl.dot(du, tl.trans(we)) + coef[:, None] * acc  # (BLOCK_M, BLOCK_P)
        tl.store(
            dqk_ptr + b * sdb + rows[:, None] * sdn + (g * P + cols_p)[None, :] * sdc,
            dacc.to(dqk_ptr.dtype.element_ty),
            mask=row_ok[:, None] & p_ok[None, :],
        )
        # this tile's share of dW_g = acc^T du, one slot per (sample, tile, g): summed outside, no atomics
        dw = tl.dot(tl.trans(acc), du)  # (BLOCK_P, BLOCK_S)
        slot = (b * T + pid_m) * (2 * H) + g
        tl.store(
            dwes_ptr + slot * P * S + cols_p[:, None] * S + cols_s[None, :],
            dw,
            mask=p_ok[:, None] & s_ok[None, :],
        )


def _pow2(n: int, low: int = 16) -> int:
    return max(low, 1 << (max(n, 1) - 1).bit_length())


def _launch_args(
    x: Tensor, qk_weight: Tensor, qk_bias: Tensor | None, w: Tensor
) -> tuple[tuple, tuple, dict[str, Any]]:
    """What both kernels take alike: the weights as ``(B or 1, 2H, P, S)``, the leading pointer / size / stride
    arguments, and the compile-time constants."""
    B, N, C = x.shape
    H, P, S = w.shape[-3:]
    wes = w.reshape(-1, 2 * H, P, S) if w.dim() == 5 else w.reshape(1, 2 * H, P, S)  # (B or 1, 2H, P, S)
    bias = qk_bias if qk_bias is not None else qk_weight  # a valid pointer, unread when HAS_BIAS is False
    strides = (
        x.stride(0), x.stride(1), x.stride(2),
        qk_weight.stride(0), qk_weight.stride(1),
        wes.stride(0) if wes.shape[0] > 1 else 0, wes.stride(1), wes.stride(2), wes.stride(3),
    )  # fmt: skip
    meta = {
        "HAS_BIAS": qk_bias is not None,
        "UPCAST": _interpreting() and x.dtype == torch.bfloat16,
        "BLOCK_M": 64 if N >= 64 else _pow2(N),
        "BLOCK_K": 32,
        "BLOCK_P": _pow2(P),
        "BLOCK_S": _pow2(S),
    }
    return (x, qk_weight, bias, wes), strides, meta


def _forward(
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    eps: float,
    out: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Launch the kernel: scores ``(B, N, H, 2, s)`` in x's dtype and ``inv`` ``(B, N, 2, H)`` float32 (into the
    contiguous buffers ``out`` when given: the tests poison them to see that every element is written)."""
    B, N, C = x.shape
    H, P, S = w.shape[-3:]
    pointers, strides, meta = _launch_args(x, qk_weight, qk_bias, w)
    # g = (query-or-key) * H + head indexes the fused weight's row blocks; the scores are stored per (head, q|k)
    if out is None:
        scores = torch.empty(B, N, H, 2, S, device=x.device, dtype=x.dtype)
        inv = torch.empty(B, N, 2, H, device=x.device, dtype=torch.float32)
    else:
        scores, inv = out
    # inv (B, N, 2, H) contiguous: g = t * H + h is its flat (q|k, head) index
    grid = (triton.cdiv(N, meta["BLOCK_M"]), 2 * H, B)
    _scores_fwd[grid](
        *pointers, scores, inv,
        N, C, H, P, S,
        *strides,
        scores.stride(0), scores.stride(1), scores.stride(3), scores.stride(2), scores.stride(4),
        inv.stride(0), inv.stride(1), inv.stride(3),
        eps,
        **meta,
    )  # fmt: skip
    return scores, inv


def _backward(
    grad: Tensor, x: Tensor, qk_weight: Tensor, qk_bias: Tensor | None, w: Tensor, eps: float, needs: tuple[bool, ...]
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """The gradients from the fused backward kernel: it recomputes each projection tile, writes ``d[Q, K]``
    ``(B, N, 2 H p)`` and per-tile shares of ``dW`` (summed here, in a fixed order); two GEMMs give ``dx`` and
    ``dW_qk``."""
    B, N, C = x.shape
    H, P, S = w.shape[-3:]
    pointers, strides, meta = _launch_args(x, qk_weight, qk_bias, w)
    grad = grad.contiguous()
    tiles = triton.cdiv(N, meta["BLOCK_M"])
    # d[Q, K] in the input's dtype: the two GEMMs below then run on the tensor cores, as autograd's would
    dqk = torch.empty(B, N, 2 * H * P, device=x.device, dtype=x.dtype)
    dwes = torch.empty(B, tiles, 2 * H, P, S, device=x.device, dtype=torch.float32)
    _scores_bwd[(tiles, 2 * H, B)](
        *pointers, grad, dqk, dwes,
        N, C, H, P, S, tiles,
        *strides,
        grad.stride(0), grad.stride(1), grad.stride(3), grad.stride(2), grad.stride(4),
        dqk.stride(0), dqk.stride(1), dqk.stride(2),
        eps,
        **meta,
    )  # fmt: skip
    need_x, need_wq, need_b, need_w = needs
    flat = dqk.view(B * N, 2 * H * P)  # (B*N, 2HP)
    gx = (flat @ qk_weight.to(flat.dtype)).view(B, N, C).to(x.dtype) if need_x else None
    gwq = (flat.T @ x.reshape(B * N, C)).to(qk_weight.dtype) if need_wq else None
    gb = flat.float().sum(0).to(qk_bias.dtype) if need_b and qk_bias is not None else None
    gw = None
    if need_w:
        per_sample = dwes.sum(1)  # (B, 2H, P, S)
        gw = (per_sample if w.dim() == 5 else per_sample.sum(0)).reshape(w.shape).to(w.dtype)
    return gx, gwq, gb, gw


class PrimalScores(torch.autograd.Function):
    """Scores by the forward kernel; gradients by the backward kernel (the projection recomputed per tile) and two
    GEMMs. Saves the inputs only."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, qk_weight: Tensor, qk_bias: Tensor | None, w: Tensor, eps: float) -> Tensor:
        scores, _ = _forward(x, qk_weight, qk_bias, w, eps)
        ctx.save_for_backward(x, qk_weight, qk_bias if qk_bias is not None else x.new_empty(0), w)
        ctx.has_bias, ctx.eps = qk_bias is not None, eps
        return scores

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, qk_weight, qk_bias, w = ctx.saved_tensors
        gx, gwq, gb, gw = _backward(
            grad, x, qk_weight, qk_bias if ctx.has_bias else None, w, ctx.eps, tuple(ctx.needs_input_grad[:4])
        )
        return gx, gwq, gb, gw, None


def primal_scores_triton(x: Tensor, qk_weight: Tensor, qk_bias: Tensor | None, w: Tensor, eps: float = 1e-12) -> Tensor:
    """Token-major scores ``(B, N, H, 2, s)``, as ``primal_scores_from_input(...)[0]``, from the fused kernel.

    Args:
        x: ``(B, N, C)`` layer input (prefix means of it for the causal layer).
        qk_weight: ``(2 H p, C)``; qk_bias: ``(2 H p,)`` or None.
        w: ``(B, 2, H, p, s)`` data-dependent or ``(2, H, p, s)`` weights.
        eps: zero-norm guard.

    Raises:
        RuntimeError: the kernel cannot run here (:func:`triton_unavailable_reason` says why).
    """
    reason = triton_unavailable_reason(x)
    if reason is not None:
        raise RuntimeError(f"the primal score kernel cannot run: {reason}")
    return PrimalScores.apply(x.contiguous(), qk_weight.contiguous(), qk_bias, w.contiguous(), float(eps))
