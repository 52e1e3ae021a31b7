"""Linear (kernelised) attention on ``(B, H, N, D)`` tensors (Katharopoulos et al., 2020).

    out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),   S = sum_j phi(k_j) v_j^T,   z = sum_j phi(k_j)

with phi = elu + 1 by default. Padded keys (``key_mask`` False) are removed from **both** S and the
normaliser z, the bug many linear-attention codes have. Causal attention uses a chunked scan: exact
masked products inside a chunk of C tokens, a running (D x Dv) state across chunks, so time is
O(N C D + N D Dv) and memory O(N D Dv / C) instead of materialising a prefix sum per token.
Half-precision inputs are accumulated in float32 so long sums cannot overflow.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_qkv
from ..options import check_bool, check_int, check_number

__all__ = ["elu_feature_map", "linear_attention", "linear_attention_weights"]


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1, positive everywhere."""
    return F.elu(x) + 1.0


def _features(
    q: Tensor, k: Tensor, key_mask: Tensor | None, feature_map: Callable[[Tensor], Tensor] | None
) -> tuple[Tensor, Tensor]:
    if feature_map is not None:
        q, k = feature_map(q), feature_map(k)
    if key_mask is not None:
        k = k * key_mask[:, None, :, None].to(k.dtype)  # padded keys contribute nothing
    return q, k


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_mask: Tensor | None = None,
    causal: bool = False,
    feature_map: Callable[[Tensor], Tensor] | None = elu_feature_map,
    eps: float = 1e-6,
    need_weights: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor | None]:
    """Linear attention.

    Args:
        q: ``(B, H, Nq, D)``; k: ``(B, H, Nk, D)``; v: ``(B, H, Nk, Dv)``. Causal needs Nq == Nk.
        key_mask: ``(B, Nk)`` bool, True = real key.
        causal: prefix sums (query i sees keys j <= i).
        feature_map: phi applied to q and k; None if q and k are already non-negative features.
        eps: added to the normaliser (a query with no admissible key outputs 0).
        need_weights: also return the equivalent ``(B, H, Nq, Nk)`` weight matrix (materialised).
        chunk_size: chunk length C of the causal scan.

    Returns:
        ``(out (B, H, Nq, Dv), weights or None)``.
    """
    key_mask = check_qkv(q, k, v, key_mask)
    check_bool("causal", causal)
    check_bool("need_weights", need_weights)
    check_number("eps", eps, low=0.0)  # 0: the exact normaliser (the SVR identities); the layers keep eps > 0
    check_int("chunk_size", chunk_size, low=1)
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal linear attention needs equal lengths, got q {q.shape[2]} and k {k.shape[2]}")
    out_dtype = v.dtype
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    fq, fk = _features(q, k, key_mask, feature_map)
    if causal:
        out = _causal_chunked(fq, fk, v, eps, chunk_size)
    else:
        kv = torch.einsum("bhnd,bhne->bhde", fk, v)  # (B, H, D, Dv)
        z = fk.sum(2)  # (B, H, D)
        num = torch.einsum("bhnd,bhde->bhne", fq, kv)  # (B, H, Nq, Dv)
        den = torch.einsum("bhnd,bhd->bhn", fq, z)[..., None]  # (B, H, Nq, 1)
        out = num / (den + eps)
    weights = linear_attention_weights(fq, fk, causal, eps) if need_weights else None
    return out.to(out_dtype), weights


def linear_attention_weights(fq: Tensor, fk: Tensor, causal: bool, eps: float) -> Tensor:
    """The ``(B, H, Nq, Nk)`` matrix A with ``out = A v``, from features (padded keys already zero)."""
    a = torch.matmul(fq, fk.transpose(-2, -1))  # (B, H, Nq, Nk)
    if causal:
        a = a.tril()
    return a / (a.sum(-1, keepdim=True) + eps)


def _causal_chunked(fq: Tensor, fk: Tensor, v: Tensor, eps: float, chunk: int) -> Tensor:
    B, H, N, D = fq.shape
    E = v.shape[-1]
    if N == 0:  # an empty sequence: an empty output (still joined to the graph of the inputs)
        return fq.new_zeros(B, H, 0, E) + (fq.sum() + fk.sum() + v.sum()) * 0
    C = min(chunk, N)
    pad = (-N) % C
    if pad:
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    M = (N + pad) // C
    qc = fq.reshape(B, H, M, C, D)  # (B, H, M, C, D)
    kc = fk.reshape(B, H, M, C, D)
    vc = v.reshape(B, H, M, C, E)
    # ones column carries the normaliser through the same products as the values
    vz = torch.cat([vc, torch.ones_like(vc[..., :1])], -1)  # (B, H, M, C, E+1)
    intra = torch.matmul(qc, kc.transpose(-2, -1)).tril()  # (B, H, M, C, C)
    out = torch.matmul(intra, vz)  # (B, H, M, C, E+1)
    state = torch.matmul(kc.transpose(-2, -1), vz)  # (B, H, M, D, E+1) per chunk
    state = state.cumsum(2) - state  # exclusive prefix over chunks
    out = out + torch.matmul(qc, state)
    out = out.reshape(B, H, M * C, E + 1)[:, :, :N]  # (B, H, N, E+1)
    return out[..., :E] / (out[..., E:] + eps)
