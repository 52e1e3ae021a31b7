"""The primal layer's score path as one Triton kernel: the projection tile never leaves the chip.

:func:`~primaldual.functional.primal.primal_scores_from_input` computes ``[Q, K] = x W^T + b`` (``(B, N, 2C)``,
written to memory), reads it back for the row norms, then multiplies each head by ``W_e`` / ``W_r`` and scales;
the KSVD term reads the scores once more for their squares, and the causal layer first writes the prefix means of x.
Here one program takes ``BLOCK_M`` tokens of one sample and one (query-or-key, head) pair ``g``:

1. causal only, the prologue: the prefix sums of ``m * x`` within the tile (``m`` the real-token mask) plus the
   carry of the tiles before it, over the count of real tokens so far: the prefix means, formed in registers;
2. ``acc = src_tile @ W_g^T + b_g`` over the width C in ``BLOCK_K`` steps (``(BLOCK_M, p)``, float32);
3. ``inv = 1 / max(||acc||, eps)`` per row;
4. ``scores = (acc @ w_g) * inv`` with ``w_g`` the ``(p, s)`` weight of that head (the sample's own when the weights
   are data-dependent), stored token-major into ``(B, N, H, 2, s)``;
5. with energies, the tile's share of ``sum_t m_t scores_t^2`` per component, one slot per (sample, tile, g),
   summed afterwards in a fixed order (deterministic: no atomics).

So neither the ``(B, N, 2C)`` projection nor the ``(B, N, C)`` prefix means are written or read: per token the
kernel moves C inputs in and ``2 H s`` scores out (plus the weights, once per tile). The causal carry is one small
reduction kernel over the tiles (``(B, T, C)`` float32, T = N / BLOCK_M) and a scan of its T totals. The backward
kernel (the operator :data:`primal_scores_op` saves the inputs and the carry, not the projection) recomputes each tile the same
way, adds the energies' gradient ``2 m scores`` to the scores', then writes ``d[Q, K]`` (chain rule through the
norms and the per-head products) and one ``(p, s)`` share of ``dW`` per tile, summed afterwards in a fixed order;
``dx`` and ``dW_qk`` are two GEMMs on ``d[Q, K]`` (causal: ``dx`` through the prefix means by a scan from the end,
``dW_qk`` against the prefix means, recomputed).

``TRITON_INTERPRET=1`` runs it on CPU tensors, which is how CI tests it (there its products run in float32 for
bfloat16 inputs: the interpreter's bfloat16 ``tl.dot`` returns garbage, numpy having no bfloat16); on a GPU it is
what ``PrimalAttention(kernel="triton")`` calls, with half-precision products on the tensor cores.

Written by hand: the fusion is specific to this layer; no library kernel computes it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..functional.primal import causal_prefix_mean, primal_scores_from_input
from ..functional.scan import prefix_sum

__all__ = ["primal_scores_op", "primal_scores_triton", "triton_available", "triton_unavailable_reason"]

try:  # triton is optional (the `kernels` extra)
    import triton
    import triton.language as tl

    _IMPORT_ERROR: str | None = None
except ImportError as err:  # pragma: no cover - exercised where triton is missing
    triton, tl = None, None
    _IMPORT_ERROR = f"triton is not installed ({err}); pip install 'primaldual[kernels]'"


BLOCK_K = 32  # the width step of the projection and of the carry's reduction
# warps per program: with 4, the bf16 kernels of a width-768 layer use all 255 registers a thread may have (the causal
# forward, the backward) and the float32 backward spills 2.3 KB per thread (ptxas, sm_90); with 8, the half-precision
# forwards use 79-128 registers, the backwards 184-224, nothing spills in half precision, and the float32 kernels
# spill 100-264 bytes (tests/kernels/test_native_compile.py)
NUM_WARPS = 8
MAX_GRID = 65_535  # CUDA's limit on a launch grid's second and third dimensions (row tiles, samples)
_HAS_CUSTOM_OPS = hasattr(torch.library, "custom_op")  # torch >= 2.4


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_unavailable_reason(x: Tensor, dtype: torch.dtype | None = None) -> str | None:
    """None if the kernel can run on ``x``'s device and shape in ``dtype`` (None: x's), else why not (for the layer's
    fallback warning)."""
    dtype = x.dtype if dtype is None else dtype
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
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dtype {dtype} is not supported (float32, float16, bfloat16)"
    if x.dim() == 3 and (x.shape[0] > MAX_GRID or triton.cdiv(x.shape[1], 64) > MAX_GRID):
        return f"the input {tuple(x.shape)} has more than {MAX_GRID} samples or tiles of 64 tokens (the launch grid's limit)"
    if x.device.type == "cuda" and dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) < (8, 0):
        return "bfloat16 products need a GPU of compute capability 8.0 or newer"
    if not _HAS_CUSTOM_OPS:
        return f"torch {torch.__version__} has no torch.library.custom_op (torch >= 2.4)"
    return None


def triton_available(x: Tensor) -> bool:
    return triton_unavailable_reason(x) is None


if triton is not None:

    @triton.jit
    def _project(
        x_ptr, w_ptr, b_ptr, m_ptr, carry_ptr, ccount_ptr,
        b, pid_m, g, N, C, P, T,
        sxb, sxn, sxc, sw0, sw1,
        rows, cols_p, row_ok, p_ok,
        HAS_BIAS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        CAUSAL: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        """One tile's ``(BLOCK_M, BLOCK_P)`` projection ``src @ W_g^T + b_g`` in float32, and the rows' real-token
        weights ``m`` (1.0 / 0.0; 0.0 past N). Causal: ``src`` is the prefix mean of ``m * x``, formed here from
        the tile's own prefix sums and the carry of the tiles before it."""
        if HAS_MASK:  # noqa: SIM108 - a compile-time branch: Triton drops the load when the flag is off
            m = tl.load(m_ptr + b * N + rows, mask=row_ok, other=0.0)
        else:
            m = row_ok.to(tl.float32)
        if CAUSAL:
            if HAS_MASK:  # noqa: SIM108 - a compile-time branch, as above
                cnt = tl.cumsum(m, axis=0) + tl.load(ccount_ptr + b * T + pid_m)
            else:
                cnt = (rows + 1).to(tl.float32)
            cnt = tl.maximum(cnt, 1.0)  # no real token yet: the prefix mean is 0, as causal_prefix_mean's
        acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
        for k0 in range(0, C, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < C
            xt = tl.load(
                x_ptr + b * sxb + rows[:, None] * sxn + ks[None, :] * sxc,
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )  # (BLOCK_M, BLOCK_K)
            if CAUSAL:
                xs = xt.to(tl.float32)
                if HAS_MASK:
                    xs = xs * m[:, None]
                carry = tl.load(carry_ptr + (b * T + pid_m) * C + ks, mask=k_ok, other=0.0)  # (BLOCK_K,)
                xs = tl.cumsum(xs, axis=0) + carry[None, :]
                # the prefix means rounded to the input dtype, as the PyTorch path feeds its GEMM
                xt = (xs / cnt[:, None]).to(x_ptr.dtype.element_ty)
            wt = tl.load(
                w_ptr + (g * P + cols_p)[None, :] * sw0 + ks[:, None] * sw1,
                mask=k_ok[:, None] & p_ok[None, :],
                other=0.0,
            )  # (BLOCK_K, BLOCK_P): W_g^T
            if UPCAST:
                acc += tl.dot(xt.to(tl.float32), wt.to(tl.float32), input_precision=DOT_PRECISION)
            else:
                # the input dtype on the tensor cores, accumulated in float32
                acc += tl.dot(xt, wt.to(xt.dtype), input_precision=DOT_PRECISION)
        if HAS_BIAS:
            bias = tl.load(b_ptr + g * P + cols_p, mask=p_ok, other=0.0)
            acc += bias[None, :].to(tl.float32)
        return acc, m

    @triton.jit
    def _tile_sums(
        x_ptr, m_ptr, sums_ptr, count_ptr,
        N, C, sxb, sxn, sxc,
        HAS_MASK: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """The causal prologue's carry, part one: per row tile, the float32 sums of ``m * x`` ``(B, T, C)`` and
        (masked) the real-token counts ``(B, T)``."""
        t = tl.program_id(0).to(tl.int64)  # int64 offsets: B * N * C passes 2^31 at large batches
        kb = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        T = tl.num_programs(0)
        rows = t * BLOCK_M + tl.arange(0, BLOCK_M)
        ks = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        row_ok = rows < N
        k_ok = ks < C
        xt = tl.load(
            x_ptr + b * sxb + rows[:, None] * sxn + ks[None, :] * sxc,
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        if HAS_MASK:  # noqa: SIM108 - a compile-time branch: Triton drops the load when the flag is off
            m = tl.load(m_ptr + b * N + rows, mask=row_ok, other=0.0)
            xt = xt * m[:, None]
            if kb == 0:
                tl.store(count_ptr + b * T + t, tl.sum(m, axis=0))
        tl.store(sums_ptr + (b * T + t) * C + ks, tl.sum(xt, axis=0), mask=k_ok)

    @triton.jit
    def _scores_fwd(
        x_ptr, w_ptr, b_ptr, wes_ptr, m_ptr, carry_ptr, ccount_ptr, out_ptr, inv_ptr, en_ptr,
        N, C, H, P, S, T,
        sxb, sxn, sxc,  # x (B, N, C)
        sw0, sw1,  # qk weight (2HP, C)
        swb, swg, swp, sws,  # W_e|W_r as (B or 1, 2H, P, S); swb = 0 when shared by the samples
        sob, son, sot, soh, sos,  # scores (B, N, H, 2, S): strides of b, n, q|k, head, s
        sib, sin_, sig,  # inv (B, N, 2H) view of (B, N, 2, H)
        eps,
        HAS_BIAS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        CAUSAL: tl.constexpr,
        ENERGY: tl.constexpr,
        UPCAST: tl.constexpr,  # float32 products: the interpreter's bfloat16 dot is wrong (numpy has no bfloat16)
        # float32 products: "ieee" unless torch allows TF32 matmuls (Triton's own default is TF32 everywhere)
        DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_S: tl.constexpr,
        STORE_INV: tl.constexpr,  # the inverse norms too (the tests read them; the layer does not)
    ):  # fmt: skip
        # the 2H programs of one row tile run next to each other and share its x tile in L2
        g = tl.program_id(0)  # (query-or-key) * H + head: row block g*P of the fused weight
        pid_m = tl.program_id(1).to(tl.int64)  # int64 offsets: B * N * 2C passes 2^31 at large batches
        t = g // H
        h = g % H
        b = tl.program_id(2).to(tl.int64)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols_p = tl.arange(0, BLOCK_P)
        row_ok = rows < N
        p_ok = cols_p < P
        acc, m = _project(
            x_ptr, w_ptr, b_ptr, m_ptr, carry_ptr, ccount_ptr, b, pid_m, g, N, C, P, T, sxb, sxn, sxc, sw0, sw1,
            rows, cols_p, row_ok, p_ok, HAS_BIAS, HAS_MASK, CAUSAL, UPCAST, DOT_PRECISION, BLOCK_M, BLOCK_K, BLOCK_P,
        )  # fmt: skip
        inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(acc * acc, axis=1)), eps)  # (BLOCK_M,)
        cols_s = tl.arange(0, BLOCK_S)
        s_ok = cols_s < S
        we = tl.load(
            wes_ptr + b * swb + g * swg + cols_p[:, None] * swp + cols_s[None, :] * sws,
            mask=p_ok[:, None] & s_ok[None, :],
            other=0.0,
        )  # (BLOCK_P, BLOCK_S)
        u = tl.dot(acc, we.to(tl.float32), input_precision=DOT_PRECISION) * inv[:, None]  # (BLOCK_M, BLOCK_S)
        tl.store(
            out_ptr + b * sob + rows[:, None] * son + t * sot + h * soh + cols_s[None, :] * sos,
            u.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & s_ok[None, :],
        )
        if STORE_INV:
            tl.store(inv_ptr + b * sib + rows * sin_ + g * sig, inv, mask=row_ok)
        if ENERGY:
            # this tile's share of sum_t m_t score_t^2, one slot per (sample, tile, g): summed outside, no atomics
            part = tl.sum(u * u * m[:, None], axis=0)  # (BLOCK_S,)
            tl.store(en_ptr + ((b * T + pid_m) * (2 * H) + g) * S + cols_s, part, mask=s_ok)

    @triton.jit
    def _scores_bwd(
        x_ptr, w_ptr, b_ptr, wes_ptr, m_ptr, carry_ptr, ccount_ptr, g_ptr, ge_ptr, dqk_ptr, dwes_ptr,
        N, C, H, P, S, T,
        sxb, sxn, sxc,
        sw0, sw1,
        swb, swg, swp, sws,
        sgb, sgn, sgt, sgh, sgs,  # grad of the scores (B, N, H, 2, S)
        sdb, sdn, sdc,  # d_qk (B, N, 2HP)
        eps,
        HAS_BIAS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        CAUSAL: tl.constexpr,
        ENERGY: tl.constexpr,  # a gradient of the energies (B, 2H, S) flows back too
        UPCAST: tl.constexpr,  # float32 products: the interpreter's bfloat16 dot is wrong (numpy has no bfloat16)
        # float32 products: "ieee" unless torch allows TF32 matmuls (Triton's own default is TF32 everywhere)
        DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):  # fmt: skip
        g = tl.program_id(0)  # as in the forward: the programs of one row tile run together
        pid_m = tl.program_id(1).to(tl.int64)
        b = tl.program_id(2).to(tl.int64)
        t = g // H
        h = g % H
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols_p = tl.arange(0, BLOCK_P)
        cols_s = tl.arange(0, BLOCK_S)
        row_ok = rows < N
        p_ok = cols_p < P
        s_ok = cols_s < S
        # the projection tile, recomputed as in the forward (never stored)
        acc, m = _project(
            x_ptr, w_ptr, b_ptr, m_ptr, carry_ptr, ccount_ptr, b, pid_m, g, N, C, P, T, sxb, sxn, sxc, sw0, sw1,
            rows, cols_p, row_ok, p_ok, HAS_BIAS, HAS_MASK, CAUSAL, UPCAST, DOT_PRECISION, BLOCK_M, BLOCK_K, BLOCK_P,
        )  # fmt: skip
        nrm = tl.sqrt(tl.sum(acc * acc, axis=1))
        inv = 1.0 / tl.maximum(nrm, eps)
        we = tl.load(
            wes_ptr + b * swb + g * swg + cols_p[:, None] * swp + cols_s[None, :] * sws,
            mask=p_ok[:, None] & s_ok[None, :],
            other=0.0,
        ).to(tl.float32)  # (BLOCK_P, BLOCK_S)
        u = tl.dot(acc, we, input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_S), unscaled
        go = tl.load(
            g_ptr + b * sgb + rows[:, None] * sgn + t * sgt + h * sgh + cols_s[None, :] * sgs,
            mask=row_ok[:, None] & s_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        if ENERGY:
            # energy_s = sum_t m_t score_ts^2: d energy / d score = 2 m score
            ge = tl.load(ge_ptr + (b * 2 * H + g) * S + cols_s, mask=s_ok, other=0.0)  # (BLOCK_S,)
            go += 2.0 * (u * inv[:, None]) * m[:, None] * ge[None, :]
        du = go * inv[:, None]  # d(scores)/d(u) = inv
        d_inv = tl.sum(go * u, axis=1)  # (BLOCK_M,)
        # inv = 1 / max(||acc||, eps): d inv / d acc = -acc inv^3 where the norm is above eps, else 0
        coef = tl.where(nrm > eps, -d_inv * inv * inv * inv, 0.0)
        dacc = tl.dot(du, tl.trans(we), input_precision=DOT_PRECISION) + coef[:, None] * acc  # (BLOCK_M, BLOCK_P)
        tl.store(
            dqk_ptr + b * sdb + rows[:, None] * sdn + (g * P + cols_p)[None, :] * sdc,
            dacc.to(dqk_ptr.dtype.element_ty),
            mask=row_ok[:, None] & p_ok[None, :],
        )
        # this tile's share of dW_g = acc^T du, one slot per (sample, tile, g): summed outside, no atomics
        dw = tl.dot(tl.trans(acc), du, input_precision=DOT_PRECISION)  # (BLOCK_P, BLOCK_S)
        slot = (b * T + pid_m) * (2 * H) + g
        tl.store(
            dwes_ptr + slot * P * S + cols_p[:, None] * S + cols_s[None, :],
            dw,
            mask=p_ok[:, None] & s_ok[None, :],
        )


def _pow2(n: int, low: int = 16) -> int:
    return max(low, 1 << (max(n, 1) - 1).bit_length())


@dataclass
class _Launch:
    """What both kernels take alike: the leading pointers, the sizes, the strides and the compile-time constants.
    ``mask`` is the float32 ``(B, N)`` real-token weights, or None; ``carry`` / ``count`` the causal prologue's
    per-tile carry ``(B, T, C)`` and real tokens before each tile ``(B, T)`` (None when not causal)."""

    pointers: tuple[Tensor, ...]
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    meta: dict[str, Any]
    tiles: int


def _launch(
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    mask: Tensor | None,
    carry: tuple[Tensor, Tensor] | None,
    energy: bool,
) -> _Launch:
    B, N, C = x.shape
    H, P, S = w.shape[-3:]
    wes = w.reshape(-1, 2 * H, P, S) if w.dim() == 5 else w.reshape(1, 2 * H, P, S)  # (B or 1, 2H, P, S)
    bias = qk_bias if qk_bias is not None else qk_weight  # a valid pointer, unread when HAS_BIAS is False
    block_m = _block_m(N)
    tiles = triton.cdiv(N, block_m)
    # unread pointers where their feature is off (the constexpr flags drop the loads)
    sums, count = carry if carry is not None else (x, x)
    strides = (
        x.stride(0), x.stride(1), x.stride(2),
        qk_weight.stride(0), qk_weight.stride(1),
        wes.stride(0) if wes.shape[0] > 1 else 0, wes.stride(1), wes.stride(2), wes.stride(3),
    )  # fmt: skip
    meta = {
        "HAS_BIAS": qk_bias is not None,
        "HAS_MASK": mask is not None,
        "CAUSAL": carry is not None,
        "ENERGY": energy,
        "UPCAST": _interpreting() and x.dtype == torch.bfloat16,
        "DOT_PRECISION": "tf32" if x.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 else "ieee",
        "BLOCK_M": block_m,
        "BLOCK_K": BLOCK_K,
        "BLOCK_P": _pow2(P),
        "BLOCK_S": _pow2(S),
        "num_warps": NUM_WARPS,
    }
    pointers = (x, qk_weight, bias, wes, mask if mask is not None else x, sums, count)
    return _Launch(pointers, (N, C, H, P, S, tiles), strides, meta, tiles)


def _block_m(n: int) -> int:
    return 64 if n >= 64 else _pow2(n)


def _causal_carry(x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """The causal prologue's carry: per row tile, the float32 sums of ``mask * x`` over every tile before it
    ``(B, T, C)``, and (masked) the real tokens before it ``(B, T)``: one reduction kernel and a scan over the T tile
    totals, so that the ``(B, N, C)`` prefix means are never written."""
    B, N, C = x.shape
    block_m = _block_m(N)
    tiles = triton.cdiv(N, block_m)
    sums = torch.empty(B, tiles, C, device=x.device, dtype=torch.float32)
    count = torch.empty(B, tiles, device=x.device, dtype=torch.float32)
    _tile_sums[(tiles, triton.cdiv(C, BLOCK_K), B)](
        x, mask if mask is not None else x, sums, count,
        N, C, x.stride(0), x.stride(1), x.stride(2),
        HAS_MASK=mask is not None, BLOCK_M=block_m, BLOCK_K=BLOCK_K,
    )  # fmt: skip
    carry = torch.zeros_like(sums)  # (B, T, C): exclusive prefix sums of the tile totals
    carry[:, 1:] = prefix_sum(sums[:, :-1])
    before = torch.zeros_like(count)  # (B, T)
    if mask is not None:
        before[:, 1:] = count[:, :-1].cumsum(1)  # integer-valued float32: exact below 2^24 tokens
    return carry, before


def _forward(
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    eps: float,
    mask: Tensor | None = None,
    carry: tuple[Tensor, Tensor] | None = None,
    energy: bool = False,
    out: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Launch the forward kernel: scores ``(B, N, H, 2, s)`` in x's dtype and, with ``energy``, the per-tile energy
    shares ``(B, T, 2, H, s)`` float32; into the contiguous buffers ``out`` when given, with the inverse norms
    ``(B, N, 2, H)`` float32 as well (the tests poison them to see that every element is written; otherwise the norms
    are not stored, and the second value returned is None)."""
    B, N, C = x.shape
    H, P, S = w.shape[-3:]
    la = _launch(x, qk_weight, qk_bias, w, mask, carry, energy)
    if out is None:
        scores = torch.empty(B, N, H, 2, S, device=x.device, dtype=x.dtype)
        inv = None
        shares = torch.empty(B, la.tiles, 2, H, S, device=x.device, dtype=torch.float32) if energy else None
    else:
        scores, inv, shares = out
    inv_buf = inv if inv is not None else scores  # a valid pointer, unwritten without STORE_INV
    # g = (query-or-key) * H + head indexes the fused weight's row blocks; the scores are stored per (head, q|k);
    # inv (B, N, 2, H) and the shares (B, T, 2, H, s) are contiguous, so g is their flat (q|k, head) index
    _scores_fwd[(2 * H, la.tiles, B)](
        *la.pointers, scores, inv_buf, shares if energy else inv_buf,
        *la.sizes,
        *la.strides,
        scores.stride(0), scores.stride(1), scores.stride(3), scores.stride(2), scores.stride(4),
        *((inv.stride(0), inv.stride(1), inv.stride(3)) if inv is not None else (0, 0, 0)),
        eps,
        **la.meta,
        STORE_INV=inv is not None,
    )  # fmt: skip
    return scores, inv, shares


def _backward(
    grad: Tensor,
    grad_energy: Tensor | None,
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    eps: float,
    mask: Tensor | None,
    carry: tuple[Tensor, Tensor] | None,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """The gradients from the fused backward kernel: it recomputes each projection tile (with the causal prologue),
    writes ``d[Q, K]`` ``(B, N, 2 H p)`` and per-tile shares of ``dW`` (summed here, in a fixed order); two GEMMs
    give ``dx`` and ``dW_qk`` (causal: through the prefix means, with a reversed scan)."""
    B, N, C = x.shape
    H, P, S = w.shape[-3:]
    la = _launch(x, qk_weight, qk_bias, w, mask, carry, grad_energy is not None)
    grad = grad.contiguous()
    ge = grad_energy.contiguous() if grad_energy is not None else grad  # (B, 2, H, s); unread without
    # d[Q, K] in the input's dtype: the two GEMMs below then run on the tensor cores, as autograd's would
    dqk = torch.empty(B, N, 2 * H * P, device=x.device, dtype=x.dtype)
    dwes = torch.empty(B, la.tiles, 2 * H, P, S, device=x.device, dtype=torch.float32)
    _scores_bwd[(2 * H, la.tiles, B)](
        *la.pointers, grad, ge, dqk, dwes,
        *la.sizes,
        *la.strides,
        grad.stride(0), grad.stride(1), grad.stride(3), grad.stride(2), grad.stride(4),
        dqk.stride(0), dqk.stride(1), dqk.stride(2),
        eps,
        **la.meta,
    )  # fmt: skip
    need_x, need_wq, need_b, need_w = needs
    flat = dqk.view(B * N, 2 * H * P)  # (B*N, 2HP)
    src = x
    if carry is not None and need_wq:
        # the prefix means the kernel formed (and did not store): dW_qk = d[Q, K]^T src
        src = causal_prefix_mean(x, None if mask is None else mask.bool())
    gx = (flat @ qk_weight.to(flat.dtype)).view(B, N, C) if need_x else None  # (B, N, C): d src
    if gx is not None and carry is not None:
        # src_i = sum_{j <= i} m_j x_j / c_i, so dx_j = m_j sum_{i >= j} dsrc_i / c_i: a scan from the end
        m = mask if mask is not None else x.new_ones(B, N, dtype=torch.float32)  # (B, N)
        count = m.cumsum(1).clamp_min(1.0)  # (B, N): integer-valued float32
        per = gx.float() / count[..., None]  # (B, N, C)
        gx = prefix_sum(per.flip(1)).flip(1) * m[..., None]
    gx = gx.to(x.dtype) if gx is not None else None
    gwq = (flat.T @ src.reshape(B * N, C)).to(qk_weight.dtype) if need_wq else None
    # summed in float32 inside the reduction (no float32 copy of d[Q, K])
    gb = flat.sum(0, dtype=torch.float32).to(qk_bias.dtype) if need_b and qk_bias is not None else None
    gw = None
    if need_w:
        per_sample = dwes.sum(1)  # (B, 2H, P, S)
        gw = (per_sample if w.dim() == 5 else per_sample.sum(0)).reshape(w.shape).to(w.dtype)
    return gx, gwq, gb, gw


_EMPTY = (0,)  # the shape of an output or saved tensor that a call does not use


def _scores_op(
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    mask: Tensor | None,
    causal: bool,
    energy: bool,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward as one operator: scores ``(B, N, H, 2, s)``, energies ``(B, 2, H, s)`` float32 (empty without
    ``energy``) and the causal carry ``(B, T, C)`` / ``(B, T)`` (empty when not causal; saved for the backward)."""
    mask = mask.contiguous() if mask is not None else None  # the kernels index it as (B, N) rows
    with _on(x.device):
        carry = _causal_carry(x, mask) if causal else None
        scores, _, shares = _forward(x, qk_weight, qk_bias, w, eps, mask, carry, energy)
    f32 = {"device": x.device, "dtype": torch.float32}
    energies = shares.sum(1) if energy else torch.empty(_EMPTY, **f32)  # (B, 2, H, s): the tiles in a fixed order
    sums, count = carry if carry is not None else (torch.empty(_EMPTY, **f32), torch.empty(_EMPTY, **f32))
    return scores, energies, sums, count


def _scores_fake(x: Tensor, _wq: Any, _b: Any, w: Tensor, _m: Any, causal: bool, energy: bool, _eps: Any) -> tuple:
    """:func:`_scores_op`'s outputs without data (for tracing)."""
    B, N, C = x.shape
    H, S = w.shape[-3], w.shape[-1]
    tiles = -(-N // _block_m(N))
    f32 = {"device": x.device, "dtype": torch.float32}
    return (
        x.new_empty(B, N, H, 2, S),
        torch.empty((B, 2, H, S) if energy else _EMPTY, **f32),
        torch.empty((B, tiles, C) if causal else _EMPTY, **f32),
        torch.empty((B, tiles) if causal else _EMPTY, **f32),
    )


def _grads_op(
    grad: Tensor,
    grad_energy: Tensor | None,
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    mask: Tensor | None,
    sums: Tensor,
    count: Tensor,
    causal: bool,
    eps: float,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward as one operator: the gradients of x, the qk weight, its bias and w (empty where not needed)."""
    mask = mask.contiguous() if mask is not None else None
    with _on(x.device):
        grads = _backward(
            grad, grad_energy, x, qk_weight, qk_bias, w, eps, mask, (sums, count) if causal else None, tuple(needs)
        )
    return tuple(g if g is not None else x.new_empty(_EMPTY) for g in grads)


def _grads_fake(_g: Any, _ge: Any, x: Tensor, qk_weight: Tensor, qk_bias: Any, w: Tensor, *rest: Any) -> tuple:
    """:func:`_grads_op`'s outputs without data (for tracing); ``rest`` ends with ``needs``."""
    needs = rest[-1]
    like = (x, qk_weight, qk_bias, w)
    return tuple(t.new_empty(t.shape) if n and t is not None else x.new_empty(_EMPTY) for t, n in zip(like, needs))


def _on(device: torch.device) -> Any:
    """The launches' device: Triton launches on the current CUDA device, which need not be the tensors'."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    x, qk_weight, qk_bias, w, mask, causal, energy, eps = inputs
    _, _, sums, count = output
    ctx.mark_non_differentiable(sums, count)  # the carry is saved for the backward, not an output to differentiate
    ctx.save_for_backward(x, qk_weight, qk_bias, w, mask, sums, count)
    ctx.causal, ctx.energy, ctx.eps = causal, energy, eps


def _grads(ctx: Any, grad: Tensor | None, grad_energy: Tensor | None, *_: Tensor | None) -> tuple[Tensor | None, ...]:
    x, qk_weight, qk_bias, w, mask, sums, count = ctx.saved_tensors
    needs = [bool(n) and t is not None for n, t in zip(ctx.needs_input_grad[:4], (x, qk_weight, qk_bias, w))]
    if grad is None:  # only the energies were used
        grad = torch.zeros(*x.shape[:2], *w.shape[-3:-2], 2, w.shape[-1], device=x.device, dtype=x.dtype)
    ge = grad_energy if ctx.energy and grad_energy is not None else None
    if torch.is_grad_enabled():  # create_graph=True: a derivative of these gradients follows
        out = _grads_as_graph(grad, ge, x, qk_weight, qk_bias, w, mask, ctx.causal, ctx.eps, needs)
    else:
        out = primal_scores_grads(grad, ge, x, qk_weight, qk_bias, w, mask, sums, count, ctx.causal, ctx.eps, needs)
    return (*(g if n else None for g, n in zip(out, needs)), None, None, None, None)


def _grads_as_graph(
    grad: Tensor,
    grad_energy: Tensor | None,
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    mask: Tensor | None,
    causal: bool,
    eps: float,
    needs: list[bool],
) -> tuple[Tensor | None, ...]:
    """The gradients with a graph of their own, for double backward (gradient penalties, Hessian-vector
    products): the backward kernel has no derivative, so the forward is recomputed on the PyTorch score path (the
    same function, in float32 energies) and differentiated with ``create_graph=True``. Costs the unfused layer's
    memory, only when asked for."""
    # fresh nodes: each input's gradient is then its own partial (w may be a function of x: data-dependent weights)
    x, qk_weight, w = x.view_as(x), qk_weight.view_as(qk_weight), w.view_as(w)
    qk_bias = qk_bias.view_as(qk_bias) if qk_bias is not None else None
    src = causal_prefix_mean(x, None if mask is None else mask.bool()) if causal else x  # (B, N, C)
    scores = primal_scores_from_input(src, qk_weight, qk_bias, w, eps)[0]  # (B, N, H, 2, s)
    outputs, grads = [scores], [grad]
    if grad_energy is not None:
        m = mask if mask is not None else x.new_ones(x.shape[:2], dtype=torch.float32)  # (B, N)
        outputs.append(torch.einsum("bn,bnhts->bths", m, scores.float().square()))  # (B, 2, H, s)
        grads.append(grad_energy)
    inputs = [t for t, n in zip((x, qk_weight, qk_bias, w), needs) if n]
    got = iter(torch.autograd.grad(outputs, inputs, grads, create_graph=True))
    return tuple(next(got) if n else None for n in needs)


# Registered as operators (opaque to torch.compile, which fuses the work around them), with
# shapes for tracing and the backward kernel as their gradient.
if _HAS_CUSTOM_OPS:
    primal_scores_op = torch.library.custom_op("primaldual::primal_scores", _scores_op, mutates_args=())
    primal_scores_op.register_fake(_scores_fake)
    primal_scores_grads = torch.library.custom_op("primaldual::primal_scores_grads", _grads_op, mutates_args=())
    primal_scores_grads.register_fake(_grads_fake)
    primal_scores_op.register_autograd(_grads, setup_context=_setup_context)


def primal_scores_triton(
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    eps: float = 1e-12,
    *,
    mask: Tensor | None = None,
    causal: bool = False,
    energies: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Token-major scores ``(B, N, H, 2, s)``, as ``primal_scores_from_input(...)[0]``, from the fused kernel.

    Args:
        x: ``(B, N, C)`` layer input.
        qk_weight: ``(2 H p, C)``; qk_bias: ``(2 H p,)`` or None.
        w: ``(B, 2, H, p, s)`` data-dependent or ``(2, H, p, s)`` weights.
        eps: zero-norm guard.
        mask: ``(B, N)`` bool, True = real token: padded tokens are left out of the causal prefix means and of the
            energies (None: every token counts). The scores of padded tokens are computed all the same.
        causal: score the prefix means of ``x`` (:func:`~primaldual.functional.primal.causal_prefix_mean`), formed
            in the kernel's prologue.
        energies: also return ``sum_t m_t score_t^2`` per (q|k, head, component), ``(B, 2, H, s)`` float32: the
            sums the KSVD term is built from, reduced per tile in the kernel (differentiable).

    Returns:
        The scores, or ``(scores, energies)`` with ``energies``.

    Raises:
        RuntimeError: the kernel cannot run here (:func:`triton_unavailable_reason` says why).
        ValueError: ``mask`` is not a ``(B, N)`` bool tensor on x's device.
    """
    reason = triton_unavailable_reason(x)
    if reason is not None:
        raise RuntimeError(f"the primal score kernel cannot run: {reason}")
    if mask is not None:
        if mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2]) or mask.device != x.device:
            raise ValueError(
                f"mask: expected a bool tensor of shape {tuple(x.shape[:2])} on {x.device}, got {mask.dtype} "
                f"{tuple(mask.shape)} on {mask.device}"
            )
        mask = mask.to(torch.float32).contiguous()  # (B, N) 1.0 / 0.0
    scores, sums, _, _ = primal_scores_op(
        x.contiguous(), qk_weight.contiguous(), qk_bias, w.contiguous(), mask, bool(causal), bool(energies), float(eps)
    )
    return (scores, sums) if energies else scores
