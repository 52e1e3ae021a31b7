"""Reference Primal-Attention: the spec written out per sequence and per head, with explicit loops.

Independent of :mod:`primaldual.functional.primal`: separate Q and K weight matrices, sampling with
``torch.linspace`` over each sequence's list of real tokens, prefix means as explicit sums, the KSVD
objective as explicit sums divided by explicit counts. Slow on purpose; the tests compare the layer
against it (forward, gradients and the KSVD term) in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PrimalParams", "ksvd_term_ref", "primal_attention_ref", "primal_params_from_layer"]


@dataclass
class PrimalParams:
    """The parameters of one primal layer, as separate plain tensors.

    Attributes:
        w_q, w_k: ``(H*p, C)`` query / key projection weights; b_q, b_k: ``(H*p,)`` biases or None.
        w_e, w_r: ``(H, n, s)`` (data-dependent) or ``(H, p, s)``.
        lam: ``(H, s)``.
        w_c: ``(p, 2s)``, b_c: ``(p,)``: the concat Linear shared by all heads.
        w_o: ``(C, H*p)``, b_o: ``(C,)``: the output projection.
    """

    w_q: Tensor
    b_q: Tensor | None
    w_k: Tensor
    b_k: Tensor | None
    w_e: Tensor
    w_r: Tensor
    lam: Tensor
    w_c: Tensor
    b_c: Tensor
    w_o: Tensor
    b_o: Tensor


def primal_params_from_layer(layer) -> PrimalParams:
    """Split a :class:`~primaldual.attention.primal.PrimalAttention`'s parameters (autograd-connected views)."""
    inner = layer.inner_dim
    bias = layer.qk.bias
    return PrimalParams(
        w_q=layer.qk.weight[:inner],
        b_q=None if bias is None else bias[:inner],
        w_k=layer.qk.weight[inner:],
        b_k=None if bias is None else bias[inner:],
        w_e=layer.w_e,
        w_r=layer.w_r,
        lam=layer.lam,
        w_c=layer.concat.weight,
        b_c=layer.concat.bias,
        w_o=layer.proj.weight,
        b_o=layer.proj.bias,
    )


def _normalise(v: Tensor, eps: float) -> Tensor:
    return v / torch.sqrt((v * v).sum(-1, keepdim=True)).clamp_min(eps)


def primal_attention_ref(
    x: Tensor,
    params: PrimalParams,
    num_heads: int,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    data_dependent: bool = True,
    padding: str = "exact",
    eps: float = 1e-12,
) -> tuple[Tensor, Tensor, Tensor]:
    """Primal-Attention forward, one sequence and one head at a time.

    Args:
        x: ``(B, N, C)``. mask: ``(B, N)`` bool, True = real token.
        causal: prefix means of q and k over real tokens <= i (all tokens <= i in ``"reference"`` mode).
        data_dependent: W_{e|X} = f(X)^T W_e from n tokens sampled by ``torch.linspace``; in ``"exact"``
            mode over the list of the sequence's real tokens, in ``"reference"`` mode over all N positions.
        padding: ``"exact"`` or ``"reference"``.

    Returns:
        ``(out, e, r)``: out ``(B, N, C)`` with padded rows zero; e, r ``(B, H, N, s)`` (every token).
    """
    B, N, C = x.shape
    H = num_heads
    p = params.w_q.shape[0] // H
    outs, es, rs = [], [], []
    for b in range(B):
        real = torch.ones(N, dtype=torch.bool) if mask is None else mask[b].cpu()
        q_all = x[b] @ params.w_q.T + (0 if params.b_q is None else params.b_q)  # (N, H*p)
        k_all = x[b] @ params.w_k.T + (0 if params.b_k is None else params.b_k)
        if causal:
            q_rows, k_rows = [], []
            for i in range(N):
                use = [j for j in range(i + 1) if real[j] or padding == "reference"]
                if use:
                    q_rows.append(sum(q_all[j] for j in use) / len(use))
                    k_rows.append(sum(k_all[j] for j in use) / len(use))
                else:
                    q_rows.append(torch.zeros_like(q_all[i]))
                    k_rows.append(torch.zeros_like(k_all[i]))
            q_all, k_all = torch.stack(q_rows), torch.stack(k_rows)
        if data_dependent:
            n = params.w_e.shape[1]
            cand = list(range(N)) if padding == "reference" else [j for j in range(N) if real[j]]
            if cand:
                picks = torch.linspace(0, len(cand) - 1, n, dtype=torch.long).tolist()
                f_x = torch.stack([x[b, cand[t]] for t in picks])  # (n, C)
            else:
                f_x = torch.zeros(n, C, dtype=x.dtype)
        head_out, head_e, head_r = [], [], []
        for h in range(H):
            cols = slice(h * p, (h + 1) * p)
            phi_q = _normalise(q_all[:, cols], eps)  # (N, p)
            phi_k = _normalise(k_all[:, cols], eps)
            if data_dependent:
                w_e = f_x[:, cols].T @ params.w_e[h]  # (p, n) @ (n, s) -> (p, s)
                w_r = f_x[:, cols].T @ params.w_r[h]
            else:
                w_e, w_r = params.w_e[h], params.w_r[h]
            e = phi_q @ w_e  # (N, s)
            r = phi_k @ w_r
            head_out.append(torch.cat([e, r], 1) @ params.w_c.T + params.b_c)  # (N, p)
            head_e.append(e)
            head_r.append(r)
        y = torch.cat(head_out, 1) @ params.w_o.T + params.b_o  # (N, C)
        outs.append(y * real[:, None].to(y.dtype))
        es.append(torch.stack(head_e))
        rs.append(torch.stack(head_r))
    return torch.stack(outs), torch.stack(es), torch.stack(rs)


def ksvd_term_ref(
    e: Tensor,
    r: Tensor,
    params: PrimalParams,
    mask: Tensor | None = None,
    reduction: str = "global",
) -> tuple[Tensor, Tensor]:
    """The KSVD objective J and the layer's regulariser term, by explicit sums.

    ``J = 1/2 * (sum ||Lambda_h e||^2) / count + 1/2 * (sum ||Lambda_h r||^2) / count - sum_h tr(W_eh^T W_rh) / H``
    with the sums and counts over (head, real token) pairs of the whole batch (``"global"``) or of each
    sample (``"sample"``). Term: ``J^2`` or the mean over non-empty samples of ``J_b^2``.

    Returns:
        ``(J, term)``: J a scalar or ``(B,)``; term a scalar.
    """
    B, H, N, s = e.shape
    trace = sum(torch.trace(params.w_e[h].T @ params.w_r[h]) for h in range(H)) / H
    sums, counts = [], []
    for b in range(B):
        tot_e = tot_r = e.new_zeros(())
        cnt = 0
        for h in range(H):
            for i in range(N):
                if mask is not None and not bool(mask[b, i]):
                    continue
                tot_e = tot_e + ((params.lam[h] * e[b, h, i]) ** 2).sum()
                tot_r = tot_r + ((params.lam[h] * r[b, h, i]) ** 2).sum()
                cnt += 1
        sums.append((tot_e, tot_r))
        counts.append(cnt)
    if reduction == "global":
        total = sum(counts)
        if total == 0:
            return -trace, e.new_zeros(())
        j = 0.5 * sum(a for a, _ in sums) / total + 0.5 * sum(c for _, c in sums) / total - trace
        return j, j**2
    js = [0.5 * a / max(c, 1) + 0.5 * rr / max(c, 1) - trace for (a, rr), c in zip(sums, counts)]
    kept = [j**2 for j, c in zip(js, counts) if c > 0]
    term = sum(kept) / len(kept) if kept else e.new_zeros(())
    return torch.stack(js), term
