"""Primal-Attention building blocks: sampling, prefix means, scores, KSVD objective on hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from primaldual.functional.primal import (
    causal_prefix_mean,
    cosine_feature_map,
    data_dependent_weights,
    even_positions,
    ksvd_loss,
    ksvd_objective,
    primal_scores,
    sample_tokens,
)
from tests.conftest import rel_err


def test_even_positions_is_torch_linspace_per_length():
    lengths = torch.tensor([3, 1, 0, 17, 3, 1024])
    for n in (1, 2, 7, 151, 200):
        pos = even_positions(lengths, n)
        for b, length in enumerate(lengths.tolist()):
            assert torch.equal(pos[b], torch.linspace(0, max(length - 1, 0), n, dtype=torch.long))


def test_sample_tokens_exact_skips_padding_and_reference_does_not():
    x = torch.arange(2 * 8, dtype=torch.float64).view(2, 8, 1)  # token value = global index
    mask = torch.tensor([[True] * 8, [False, True, True, False, True, True, True, False]])
    exact = sample_tokens(x, 3, mask, "exact")[..., 0]
    assert exact.tolist() == [[0.0, 3.0, 7.0], [9.0, 12.0, 14.0]]  # real tokens of row 2: 9, 10, 12, 13, 14
    ref = sample_tokens(x, 3, mask, "reference")[..., 0]
    assert ref.tolist() == [[0.0, 3.0, 7.0], [8.0, 11.0, 15.0]]
    empty = sample_tokens(x, 3, torch.zeros(2, 8, dtype=torch.bool))
    assert (empty == 0).all()
    with pytest.raises(ValueError, match="padding must be one of"):
        sample_tokens(x, 3, mask, "nope")


def test_data_dependent_weights_use_contiguous_channel_chunks():
    samples = torch.randn(2, 5, 6, dtype=torch.float64)  # (B, n, C) with H=3, p=2
    w = torch.randn(3, 5, 4, dtype=torch.float64)
    out = data_dependent_weights(samples, w)
    assert out.shape == (2, 3, 2, 4)
    for h in range(3):
        assert torch.allclose(out[:, h], samples[:, :, 2 * h : 2 * h + 2].transpose(1, 2) @ w[h])
    both = data_dependent_weights(samples, torch.stack((w, 2 * w)))  # (B, 2, H, p, s)
    assert torch.allclose(both[:, 0], out) and torch.allclose(both[:, 1], 2 * out)


def test_cosine_feature_map_guards_zero():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], requires_grad=True)
    y = cosine_feature_map(x)
    assert torch.allclose(y, torch.tensor([[0.6, 0.8], [0.0, 0.0]]))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_causal_prefix_mean_over_real_tokens():
    x = torch.randn(2, 9, 3, 2, dtype=torch.float64)
    mask = torch.rand(2, 9) > 0.4
    mask[0, 0] = False
    out = causal_prefix_mean(x, mask)
    for b in range(2):
        for i in range(9):
            keep = [j for j in range(i + 1) if mask[b, j]]
            want = x[b, keep].mean(0) if keep else torch.zeros_like(x[b, 0])
            assert torch.allclose(out[b, i], want)
    plain = causal_prefix_mean(x)
    assert torch.allclose(plain[:, 4], x[:, :5].mean(1))


def test_primal_scores_layout_and_values():
    B, H, N, p, s = 2, 3, 5, 4, 6
    fq, fk = torch.randn(2, B, H, N, p, dtype=torch.float64)
    we, wr = torch.randn(2, B, H, p, s, dtype=torch.float64)
    sc = primal_scores(fq, fk, we, wr)
    assert sc.shape == (B, H, N, 2 * s) and sc.transpose(1, 2).is_contiguous()
    assert torch.allclose(sc[..., :s], fq @ we) and torch.allclose(sc[..., s:], fk @ wr)
    sc2 = primal_scores(fq, fk, we[0], wr[0])  # data-independent (H, p, s)
    assert torch.allclose(sc2[..., :s], fq @ we[0])


def _tiny():
    # B=2, H=1, N=2, s=1; sample 0 as below, sample 1 all zeros
    e = torch.tensor([[[[1.0], [2.0]]], [[[0.0], [0.0]]]], dtype=torch.float64)  # (2, 1, 2, 1)
    r = torch.tensor([[[[3.0], [0.0]]], [[[0.0], [0.0]]]], dtype=torch.float64)
    lam = torch.tensor([[2.0]], dtype=torch.float64)  # (H, s)
    w_e = torch.tensor([[[1.0], [2.0]]], dtype=torch.float64)  # (H, n=2, s)
    w_r = torch.tensor([[[3.0], [1.0]]], dtype=torch.float64)
    return e, r, w_e, w_r, lam


def test_ksvd_objective_hand_computed():
    e, r, w_e, w_r, lam = _tiny()
    # trace term: 1*3 + 2*1 = 5.  Sample 0: 1/2 mean(4, 16) + 1/2 mean(36, 0) = 5 + 9 = 14 -> J_0 = 9.
    # Sample 1: all scores zero -> J_1 = -5.  Global: 1/2 (20 / 4) + 1/2 (36 / 4) - 5 = 2.5 + 4.5 - 5 = 2.
    assert ksvd_objective(e, r, w_e, w_r, lam, reduction="sample").tolist() == [9.0, -5.0]
    assert float(ksvd_objective(e, r, w_e, w_r, lam)) == 2.0
    assert float(ksvd_loss(e, r, w_e, w_r, lam, reduction="sample")) == (81 + 25) / 2
    assert float(ksvd_loss(e, r, w_e, w_r, lam)) == 4.0
    # mask out token 1 of sample 0 and all of sample 1: J_0 = 1/2*4 + 1/2*36 - 5 = 15; sample 1 drops out
    mask = torch.tensor([[True, False], [False, False]])
    assert ksvd_objective(e, r, w_e, w_r, lam, mask, "sample")[0] == 15.0
    assert float(ksvd_loss(e, r, w_e, w_r, lam, mask, "sample")) == 225.0
    assert float(ksvd_loss(e, r, w_e, w_r, lam, mask, "global")) == 225.0
    none = torch.zeros(2, 2, dtype=torch.bool)
    assert float(ksvd_loss(e, r, w_e, w_r, lam, none, "global")) == 0.0
    with pytest.raises(ValueError, match="ksvd_reduction"):
        ksvd_objective(e, r, w_e, w_r, lam, reduction="batch")


def test_ksvd_gradients_reach_lambda_and_weights():
    e, r, w_e, w_r, lam = _tiny()
    for t in (lam, w_e, w_r):
        t.requires_grad_(True)
    ksvd_loss(e, r, w_e, w_r, lam).backward()
    # d(J^2)/d lam = 2 J * lam * (mean e^2 + mean r^2) = 2 * 2 * 2 * (5 / 4 + 9 / 4) = 28; d(J^2)/d W_e = -2 J W_r
    assert rel_err(lam.grad, torch.tensor([[28.0]], dtype=torch.float64)) < 1e-12
    assert rel_err(w_e.grad, -2 * 2.0 * w_r.detach()) < 1e-12
    assert rel_err(w_r.grad, -2 * 2.0 * w_e.detach()) < 1e-12


@pytest.mark.parametrize("data_dependent", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_scores_equal_feature_path(data_dependent, bias):
    from primaldual.functional.primal import primal_scores_from_input

    B, N, H, p, s = 2, 9, 3, 4, 5
    C = H * p
    x = torch.randn(B, N, C, dtype=torch.float64)
    x[0, 2] = 0.0
    w = torch.randn(2 * C, C, dtype=torch.float64)
    b = torch.randn(2 * C, dtype=torch.float64) if bias else None
    shape = (B, H, p, s) if data_dependent else (H, p, s)
    we, wr = torch.randn(2, *shape, dtype=torch.float64)
    scores, qk = primal_scores_from_input(x, w, b, torch.stack((we, wr), -4))
    q, k = torch.nn.functional.linear(x, w, b).view(B, N, 2, H, p).permute(2, 0, 3, 1, 4)  # (B, H, N, p) each
    want = primal_scores(cosine_feature_map(q), cosine_feature_map(k), we, wr)  # (B, H, N, 2s)
    assert rel_err(scores.reshape(B, N, H, 2 * s).transpose(1, 2), want) < 1e-12
    assert torch.equal(qk.permute(2, 0, 3, 1, 4)[0], q)
