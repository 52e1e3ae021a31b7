"""The primal layer's output and KSVD energies in a rotated basis: the floor's GEMMs and little else.

Per group g (queries or keys of head h; ``G = 2H`` groups, t-major as in ``w``) the layer computes
``e = phi(q) W`` with ``q = x W_g^T + b_g`` ``(p,)``, ``phi(q) = q / max(||q||, eps)`` and ``W`` ``(p, s)``, then
``out = sum_g e_g O_g`` (``O_g`` ``(s, C)``, the fused concat and output map) and the energy
``E_g = sum_t m_t ||lambda_h * e_{t,g}||^2``. Written so, the scores need a product per head on top of the
Q/K projection (``2 C s`` multiply-adds per token, in skinny GEMMs) or, folded into the projection, a third wide
GEMM (``C 2H s``): 1.2-1.4x the dense maps the layer cannot avoid.

Here an orthogonal ``T`` ``(p, p)`` per group (and per sample when ``W`` is data-dependent) is chosen whose first
``k = min(p, s)`` columns span the range of ``W`` (a complete QR of ``W``) and, within it, diagonalise
``A = R diag(lambda^2) R^T`` (an eigendecomposition of that ``k x k`` matrix), ``R = T[:, :k]^T W``. Rotating the
projection, ``q' = x (W_g^T T) + b_g T``, changes no norm, so ``phi(q) W = y R`` with ``y = phi(q')[:k]``:

* the output is ``out = y F`` with ``F = R O``, a ``G k -> C`` map (at most the floor's ``2Hs -> C``);
* the energy is ``sum_t m_t sum_j A_jj y_tj^2``, element-wise, and so is its gradient in ``y``;
* the other ``p - k`` rotated coordinates ``z`` enter only through the norm.

``T`` is a function of ``W`` computed without gradient; the gradients stay exact because ``M = T^T W``
(``(p, s)``, its last ``p - k`` rows zero in value) is formed with autograd and two small
``autograd.Function`` s supply what those zero rows receive: ``sum_t z_t^T dout_t`` for the output map and
``sum_t m_t z_t^T y_t`` for the energy. No step divides by ``R``, so rank-deficient ``W`` (sequences shorter
than s, all-padding samples) differentiate as well as full-rank ones. Multiply-adds per token, forward and
backward: the floor's ``3 (C 2C + 2H s C)`` plus ``(p - k) C`` and ``G p k`` (the complement's output-map
gradient and the energies' Gram), against ``3 C 2H s`` more for the folded scores.

Each call pays a QR and, when the energies are computed, an eigendecomposition per group and sample (small, but
serial on one core), so the rotated basis pays only for long sequences and when a backward pass follows (its saving
is in the gradient's GEMMs). :func:`use_rotated` decides by shape against a :class:`RotatedThresholds`; the layer's
``path`` option can force either evaluation (``docs/primal_attention.md``, "Fast paths"; the measurements behind the
default thresholds are in ``docs/benchmarks.md`` section 1b).

Hand-written: the rotation and its gradients are this library's own derivation; the tensor work is plain torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..options import check_int

__all__ = ["DEFAULT_THRESHOLDS", "RotatedThresholds", "primal_output_rotated", "rotated_basis", "use_rotated"]


@dataclass(frozen=True)
class RotatedThresholds:
    """Where :func:`use_rotated` starts taking the rotated basis (each a positive int; frozen, checked on creation).

    The defaults are the crossovers against the folded scores measured on 2 CPU threads (``docs/benchmarks.md``
    section 1b). The decompositions run on one core however many there are, so the more cores share the rest of
    the pass, the later the crossover: ``benchmarks/rotated_crossover.py`` measures it on another machine.

    Attributes:
        min_tokens_compiled: tokens per sample from which data-dependent weights take the rotated basis inside a
            ``torch.compile`` graph, when a backward pass follows.
        min_tokens_eager: the same, eager.
        min_rows_shared_compiled: rows (batch x tokens) from which data-independent weights (the causal layer: one
            decomposition per group for the whole batch) take it, compiled, when a backward pass follows.
        min_rows_shared_eager: the same, eager.
        min_tokens_forward_compiled: tokens per sample from which a compiled forward with no backward to follow
            takes it (data-dependent weights only; eager forwards and shared weights keep the score paths).
    """

    min_tokens_compiled: int = 2560
    min_tokens_eager: int = 2048
    min_rows_shared_compiled: int = 16384
    min_rows_shared_eager: int = 8192
    min_tokens_forward_compiled: int = 16384

    def __post_init__(self) -> None:
        for f in fields(self):
            check_int(f"thresholds.{f.name}", getattr(self, f.name), low=1)


DEFAULT_THRESHOLDS = RotatedThresholds()
"""The default thresholds (frozen): what the primal layer uses unless given ``thresholds=``."""


def use_rotated(
    batch: int,
    tokens: int,
    data_dependent: bool,
    compiled: bool | None = None,
    device_type: str = "cpu",
    backward: bool = True,
    *,
    thresholds: RotatedThresholds = DEFAULT_THRESHOLDS,
) -> bool:
    """Whether :func:`primal_output_rotated` is the cheaper evaluation for this shape (see the module docstring).

    Args:
        batch, tokens: the input's ``B`` and ``N``.
        data_dependent: per-sample ``W`` (decided by tokens per sample) or shared ``W`` (by rows, ``B N``).
        compiled: the compiled or the eager thresholds (None: whether a ``torch.compile`` trace is running).
        device_type: CPU only: on CUDA ``torch.linalg.eigh`` synchronises the device with the host (it checks
            LAPACK's error codes), which the layer's forward must not do unasked (CUDA graphs, ``fullgraph=True``).
        backward: whether a backward pass will follow (without one: compiled data-dependent weights only, from
            ``thresholds.min_tokens_forward_compiled``).
        thresholds: where each case starts (:class:`RotatedThresholds`).

    Reads nothing but its arguments (and, for ``compiled=None``, whether a trace is running).
    """
    if device_type != "cpu":
        return False
    if compiled is None:
        compiled = torch.compiler.is_compiling()
    t = thresholds
    if not backward:
        return data_dependent and compiled and tokens >= t.min_tokens_forward_compiled
    if data_dependent:
        return tokens >= (t.min_tokens_compiled if compiled else t.min_tokens_eager)
    return batch * tokens >= (t.min_rows_shared_compiled if compiled else t.min_rows_shared_eager)


def rotated_basis(w: Tensor, lam: Tensor | None) -> Tensor:
    """The orthogonal bases ``T`` of the module docstring, without gradient.

    Args:
        w: ``(B, 2, H, p, s)`` data-dependent or ``(2, H, p, s)`` ``stack(W_e, W_r)``.
        lam: ``(H, s)``, or None when no energies are computed: then the columns ``:k`` are the QR's, spanning
            ``range(W)`` without diagonalising anything (no eigendecomposition).

    Returns:
        ``(..., 2, H, p, p)`` orthogonal, in ``w``'s dtype: columns ``:k`` span ``range(W)`` and diagonalise
        ``R diag(lam^2) R^T``; QR and eigendecomposition run in float32 at least (half has no kernels).

    A group whose ``W`` or energy matrix is not finite (NaN / Inf weights or sampled tokens) gets the identity
    instead: LAPACK's eigensolver would raise on it, while the layer's outputs for that group are NaN / Inf through
    ``M = T^T W`` whatever ``T`` is, as on the score paths. No host synchronisation (``torch.where``).
    """
    p, s = w.shape[-2:]
    k = min(p, s)
    with torch.no_grad():
        work = torch.promote_types(w.dtype, torch.float32)
        wd = w.detach().to(work)
        wd = torch.where(wd.isfinite().all((-2, -1), keepdim=True), wd, 0.0)  # (..., 2, H, p, s)
        t = torch.linalg.qr(wd, mode="complete").Q  # (..., 2, H, p, p)
        if lam is None:
            return t.to(w.dtype)
        r = t[..., :k].transpose(-1, -2) @ wd  # (..., 2, H, k, s)
        a = (r * lam.detach().to(work).square()[:, None, :]) @ r.transpose(-1, -2)  # (..., 2, H, k, k)
        eye = torch.eye(k, dtype=work, device=w.device)
        a = torch.where(a.isfinite().all((-2, -1), keepdim=True), a, eye)  # (..., 2, H, k, k)
        v = torch.linalg.eigh(a).eigenvectors  # (..., 2, H, k, k)
        return torch.cat((t[..., :k] @ v, t[..., k:]), -1).to(w.dtype)  # (..., 2, H, p, p)


def _mm(a: Tensor, b: Tensor) -> Tensor:
    """``(B, N, K) @ (K, M)`` shared or ``(B, K, M)`` per sample -> ``(B, N, M)``."""
    return a @ b if b.dim() == 2 else torch.bmm(a, b)


def _token_sum(a: Tensor, g: Tensor, shared: bool) -> Tensor:
    """``sum_t a_t^T g_t``: ``(B, N, K), (B, N, M)`` -> ``(K, M)`` over the batch too if ``shared``, else ``(B, K, M)``."""
    if shared:
        rows = a.shape[0] * a.shape[1]
        return a.reshape(rows, a.shape[-1]).T @ g.reshape(rows, g.shape[-1])  # (B*N, K)^T @ (B*N, M)
    return torch.bmm(a.transpose(1, 2), g)


class _RangeMap(torch.autograd.Function):
    """``out = y f_y + z f_z + bias`` where ``f_z`` is zero in value: computes ``y f_y + bias``, and gives ``f_z``
    its gradient.

    y ``(B, N, G k)``, z ``(B, N, G (p-k))``, f_y ``([B,] G k, C)``, f_z ``([B,] G (p-k), C)``, bias ``(C,)`` or
    None -> ``(B, N, C)``.
    """

    @staticmethod
    def forward(ctx, y: Tensor, z: Tensor, f_y: Tensor, f_z: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(y, z, f_y)
        ctx.shared, ctx.has_bias = f_y.dim() == 2, bias is not None
        if bias is None:
            return _mm(y, f_y)
        if ctx.shared:
            return F.linear(y, f_y.T, bias)
        return torch.baddbmm(bias.expand(y.shape[0], 1, -1), y, f_y)

    @staticmethod
    @once_differentiable  # the formulas use f_z = 0 and z's zero gradient: wrong if differentiated again
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, Tensor, Tensor, Tensor | None]:
        y, z, f_y = ctx.saved_tensors
        # z's gradient would be grad f_z^T = 0: z reaches the loss through the norm only
        d_bias = grad.sum((0, 1)) if ctx.has_bias else None
        d_y = _mm(grad, f_y.transpose(-1, -2).contiguous())  # a transposed view costs the GEMM ~25% on CPU
        return d_y, None, _token_sum(y, grad, ctx.shared), _token_sum(z, grad, ctx.shared), d_bias


class _FeatureMap(torch.autograd.Function):
    """The rotated feature map ``[y, z] = [q_y, q_z] / max(||[q_y, q_z]||, eps)`` per token and group, and the
    energies ``E_bg = sum_t m_t y A y^T`` with ``A = M_y diag(lam2) M_y^T`` diagonal in value and ``M_z`` zero in value.

    q_y ``(B, N, G, k)``, q_z ``(B, N, G, p-k)`` (the projections, bias included), m_y ``([B,] G, k, s)``, m_z
    ``([B,] G, p-k, s)``, lam2 ``(G, s)``, mask ``(B, N)`` (1 = counted) or None, eps2 the floor of the squared norm
    -> ``y, z, energy`` with energy ``(B, G)``, or a 0-dim zero when ``with_energy`` is False.

    One Function with the backward written out, not autograd through the normalisation plus a separate energy
    term: autograd would sum the output map's and the energy's gradients of ``y`` into a tensor that is then read
    twice (the norm's reduction and its element-wise step), a full extra pass. Written out, with
    ``s = sum_j g_j y_j`` and ``g = dy + c m A y``, ``s`` takes the energy's share from the forward's per-token
    energy and each gradient is one element-wise expression: ``dq_y = inv (g - s y)``, ``dq_z = inv (dz - s z)``
    (``s = 0`` where the norm is clamped at eps).
    """

    @staticmethod
    def forward(
        ctx,
        q_y: Tensor,
        q_z: Tensor,
        m_y: Tensor,
        m_z: Tensor,
        lam2: Tensor,
        mask: Tensor | None,
        eps2: float,
        with_energy: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ss = q_y.square().sum(-1, keepdim=True) + q_z.square().sum(-1, keepdim=True)  # (B, N, G, 1)
        inv = ss.clamp_min(eps2).rsqrt()  # (B, N, G, 1)
        free = ss >= eps2  # (B, N, G, 1): the norm is not clamped
        y, z = q_y * inv, q_z * inv
        ctx.with_energy, ctx.shared = with_energy, m_y.dim() == 3
        if not with_energy:
            ctx.save_for_backward(y, z, inv, free)
            return y, z, q_y.new_zeros(())
        a = (m_y.square() * lam2[:, None, :]).sum(-1)  # ([B,] G, k): the diagonal of A
        per_token = (y.square() * a.unsqueeze(-3)).sum(-1, keepdim=True)  # (B, N, G, 1)
        if mask is not None:
            per_token = per_token * mask[:, :, None, None]
        ctx.save_for_backward(y, z, inv, free, per_token, m_y, lam2, a, *(() if mask is None else (mask,)))
        return y, z, per_token.sum((1, 3))  # (B, G)

    @staticmethod
    @once_differentiable  # A is diagonal and M_z zero in value only: a second derivative would be wrong
    def backward(ctx, d_y: Tensor | None, d_z: Tensor | None, grad: Tensor | None) -> tuple[Tensor | None, ...]:
        y, z, inv, free, *rest = ctx.saved_tensors
        # s = sum_j g_j y_j from dy and the per-token energy, so that g, the total gradient of y, has one consumer
        # (the element-wise dq_y below); a g read by both the reduction and the element-wise step is materialised
        s = torch.zeros_like(inv) if d_y is None else (d_y * y).sum(-1, keepdim=True)  # (B, N, G, 1)
        g = d_y  # (B, N, G, k), None = zero
        d_my = d_mz = d_lam2 = None
        if ctx.with_energy and grad is not None:
            per_token, m_y, lam2, a, *mask = rest
            c = 2.0 * grad  # (B, G)
            s = s + c[:, None, :, None] * per_token  # per_token carries the mask
            ym = y if not mask else y * mask[0][:, :, None, None]  # (B, N, G, k)
            ca = (a * c[..., None]).unsqueeze(-3)  # (B, 1, G, k): the energy's gradient of y is 2 grad m A y
            g = ym * ca if g is None else torch.addcmul(g, ym, ca)
            if any(ctx.needs_input_grad[2:5]):
                G = y.shape[2]
                # the Gram sum_t m_t [y; z]^T y per group, one strided bmm each (no permuted copies of y, z)
                g_yy = torch.stack([torch.bmm(y[:, :, i].transpose(1, 2), ym[:, :, i]) for i in range(G)], 1)
                g_zy = torch.stack([torch.bmm(z[:, :, i].transpose(1, 2), ym[:, :, i]) for i in range(G)], 1)
                w = m_y * lam2[:, None, :]  # ([B,] G, k, s)
                d_my = (g_yy @ w) * c[..., None, None]  # (B, G, k, s)
                d_mz = (g_zy @ w) * c[..., None, None]  # (B, G, p-k, s)
                d_lam2 = ((m_y * (g_yy @ m_y)).sum(-2) * grad[..., None]).sum(0)  # (G, s)
                if ctx.shared:
                    d_my, d_mz = d_my.sum(0), d_mz.sum(0)
        si = torch.where(free, s, 0.0) * inv  # (B, N, G, 1); a clamped norm is a constant: no gradient through it
        d_q_y = -si * y if g is None else torch.addcmul(g * inv, y, si, value=-1.0)  # inv (g - s y)
        d_q_z = -si * z if d_z is None else torch.addcmul(d_z * inv, z, si, value=-1.0)  # inv (dz - s z)
        return d_q_y, d_q_z, d_my, d_mz, d_lam2, None, None, None


def primal_output_rotated(
    x: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    w: Tensor,
    out_weight: Tensor,
    out_bias: Tensor | None,
    lam: Tensor,
    mask: Tensor | None = None,
    eps: float = 1e-12,
    with_energy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The layer's output map of the scores and the KSVD energies, from the layer input (module docstring).

    Args:
        x: ``(B, N, C)`` layer input (prefix means of it for the causal variant).
        qk_weight: ``(2 H p, C)`` fused Q/K projection; qk_bias: ``(2 H p,)`` or None.
        w: ``(B, 2, H, p, s)`` data-dependent or ``(2, H, p, s)`` ``stack(W_e, W_r)``.
        out_weight: ``(C, H 2 s)`` the fused concat and output map, columns ``h 2s + t s + j``; out_bias ``(C,)``
            or None.
        lam: ``(H, s)``.
        mask: ``(B, N)`` bool, True = counted in the energies, or None (all count). The output is not masked.
        eps: zero-norm guard: ``phi(q) = q / max(||q||, eps)`` (``eps^2`` floored at the dtype's smallest normal).
        with_energy: compute the energies (False: the second result is None, e.g. when no KSVD term is recorded).

    Returns:
        ``(out, energy)``: out ``(B, N, C)`` equals ``scores @ out_weight^T + out_bias`` of
        :func:`~primaldual.functional.primal.primal_scores_from_input`; energy ``(B, 2H)`` is
        ``sum_t m_t ||lam_h * score_{t,g}||^2`` for group ``g = t H + h`` (t = 0 queries/e, 1 keys/r), or None.
    """
    if x.dim() != 3 or w.dim() not in (4, 5) or w.shape[-4] != 2:
        raise ValueError(
            f"x must be (B, N, C) and w (B, 2, H, p, s) or (2, H, p, s); got {tuple(x.shape)}, {tuple(w.shape)}"
        )
    B, N, C = x.shape
    H, p, s = w.shape[-3:]
    G, k = 2 * H, min(p, s)
    shared = w.dim() == 4
    expect = {
        "qk_weight": (qk_weight, (2 * H * p, C)),
        "out_weight": (out_weight, (C, H * 2 * s)),
        "lam": (lam, (H, s)),
    }
    if not shared:
        expect["w"] = (w, (B, 2, H, p, s))
    for name, (value, shape) in expect.items():
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{name} must have shape {shape} for x {tuple(x.shape)} and w {tuple(w.shape)}, got {tuple(value.shape)}"
            )
    t = rotated_basis(w, lam if with_energy else None)  # (..., 2, H, p, p); diagonalised for the energies only
    m = (t.transpose(-1, -2) @ w).flatten(-4, -3)  # (..., G, p, s): R on rows :k, zero in value below
    lead = m.shape[:-3]  # (B,) or ()
    w_rot = (qk_weight.view(2, H, p, C).transpose(-1, -2) @ t).flatten(-4, -3)  # (..., G, C, p)
    w_rot = w_rot.transpose(-3, -2)  # (..., C, G, p)
    w_y = w_rot[..., :k].reshape(*lead, C, G * k)  # (..., C, G*k)
    w_z = w_rot[..., k:].reshape(*lead, C, G * (p - k))  # (..., C, G*(p-k))
    b_y = b_z = None
    if qk_bias is not None:
        b_rot = (qk_bias.view(2, H, 1, p) @ t).reshape(*lead, G, p)  # (..., G, p)
        b_y, b_z = b_rot[..., :k].reshape(*lead, G * k), b_rot[..., k:].reshape(*lead, G * (p - k))

    def project(weight: Tensor, bias: Tensor | None) -> Tensor:  # (B, N, C) -> (B, N, width)
        # the bias is added by the element-wise consumers (the norm loop), not copied into the GEMM's output first
        q = x @ weight if shared else torch.bmm(x, weight)
        return q if bias is None else q + (bias if shared else bias[:, None, :])

    # two GEMMs, not one split afterwards: the split's backward would interleave the two gradients element-wise
    q_y = project(w_y, b_y).view(B, N, G, k)  # (B, N, G, k)
    q_z = project(w_z, b_z).view(B, N, G, p - k)  # (B, N, G, p-k)
    eps2 = max(eps * eps, torch.finfo(x.dtype).tiny)
    o = out_weight.view(C, H, 2, s).permute(2, 1, 3, 0).reshape(G, s, C)  # (C, H*2*s) -> (G, s, C)
    m_y, m_z = m[..., :k, :], m[..., k:, :]  # (..., G, k, s), (..., G, p-k, s)
    lam2 = lam.square().repeat(2, 1)  # (G, s): lam_h for both groups of head h
    mask_f = None if mask is None or not with_energy else mask.to(x.dtype)
    y, z, energy = _FeatureMap.apply(q_y, q_z, m_y, m_z, lam2, mask_f, eps2, with_energy)  # the rotated feature map
    f_y = (m_y @ o).reshape(*lead, G * k, C)  # (..., G*k, C)
    f_z = (m_z @ o).reshape(*lead, G * (p - k), C)  # (..., G*(p-k), C): zero in value
    out = _RangeMap.apply(y.view(B, N, G * k), z.view(B, N, G * (p - k)), f_y, f_z, out_bias)  # (B, N, C)
    return out, (energy if with_energy else None)
