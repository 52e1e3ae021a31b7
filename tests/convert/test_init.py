"""The teacher initialisation: KSVD on the student's own kernel (J = 0), least squares for the output map."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.convert import find_blocks, initialise_students, ksvd_init, least_squares_map, swap_attention
from primaldual.convert.init import branch_scores, ksvd_objective_global, rebuild_error, teacher_heads
from primaldual.models import CausalLM
from primaldual.theory.ksvd import primal_stationary_point, stationary_point


def _teacher(seed: int = 0, dim: int = 32, depth: int = 2) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(60, 64, dim=dim, depth=depth, num_heads=2, ffn_dim=64, dropout=0.0, positions="learned").double()


def _ids(seed: int, B: int = 6, N: int = 24) -> torch.Tensor:
    return torch.randint(0, 60, (B, N), generator=torch.Generator().manual_seed(seed))


def test_primal_stationary_point_equals_the_dual_solution_without_the_kernel():
    g = torch.Generator().manual_seed(0)
    pq, pk = torch.randn(40, 6, generator=g, dtype=torch.float64), torch.randn(40, 6, generator=g, dtype=torch.float64)
    ref = stationary_point(pq, pk, 4)
    w_e, w_r, sigma, lam = primal_stationary_point(pq, pk, 4)
    torch.testing.assert_close(sigma, ref.sigma)
    torch.testing.assert_close(lam, ref.lam_code)
    # each singular pair is defined up to a common sign, which W_e and W_r share
    torch.testing.assert_close(w_e @ w_r.T, ref.w_e @ ref.w_r.T)
    torch.testing.assert_close(w_e.abs(), ref.w_e.abs())


def test_primal_stationary_point_refuses_bad_shapes():
    with pytest.raises(ValueError, match="N >= p"):
        primal_stationary_point(torch.randn(3, 6), torch.randn(3, 6), 2)
    with pytest.raises(ValueError, match="s must be"):
        primal_stationary_point(torch.randn(10, 6), torch.randn(10, 6), 7)


@pytest.mark.parametrize("student", ["primal", "hybrid"])
def test_ksvd_initialisation_gives_j_zero_on_the_calibration_batch(student):
    teacher = _teacher()
    model, layers = swap_attention(teacher, student, "all", s=6, **({"window": 8} if student == "hybrid" else {}))
    ids = _ids(1)
    x = teacher.embed(ids) * teacher.dim**0.5 + teacher.pos[: ids.shape[1]]
    layer = find_blocks(model)[0].attn
    mask = torch.ones(ids.shape, dtype=torch.bool)
    mask[2, :5] = False  # left padding is left out of the kernel
    with torch.no_grad():
        before = float(ksvd_objective_global(layer, branch_scores(layer, x, mask), mask))
    info = ksvd_init(layer, x, mask)
    assert info["tokens"] == int(mask.sum())
    j = ksvd_objective_global(layer, branch_scores(layer, x, mask), mask)
    assert abs(float(j)) < 1e-9 and abs(info["J"]) < 1e-9, (before, float(j))
    # the trace term is scaled to 1 per head
    torch.testing.assert_close((layer.w_e * layer.w_r).sum((1, 2)), torch.ones(2, dtype=torch.float64))
    # the layer's own KSVD loss (global reduction) agrees: J^2 = 0
    layer.ksvd_reduction = "global"
    layer.train()
    with torch.enable_grad():
        layer(x, mask)
    assert float(pd.collect_aux_loss(layer)) < 1e-15


def test_least_squares_map_reproduces_a_planted_linear_target():
    teacher = _teacher()
    model, _ = swap_attention(teacher, "primal", [0], s=5)
    layer = find_blocks(model)[0].attn
    x = torch.randn(3, 20, 32, dtype=torch.float64)
    scores = branch_scores(layer, x, None)  # (B, N, H, 2, s)
    w = torch.randn(16, 10, dtype=torch.float64)  # planted (p, 2s) map and bias
    b = torch.randn(16, dtype=torch.float64)
    target = (scores.flatten(3) @ w.T + b).transpose(1, 2)  # (B, N, H, p) -> (B, H, N, p)
    residual = least_squares_map(layer, scores, target, None, ridge=0.0)
    assert residual < 1e-20
    torch.testing.assert_close(layer.concat.weight, w)
    torch.testing.assert_close(layer.concat.bias, b)


def test_teacher_initialisation_fits_better_than_the_random_one_at_step_0():
    from primaldual.convert import layer_losses, teacher_attention_io

    teacher = _teacher()
    calib, held = _ids(1, B=16), _ids(2)
    io = teacher_attention_io(teacher, held, None, [0, 1])
    random_init, layers = swap_attention(teacher, "primal", "all", s=8)
    fitted, _ = swap_attention(teacher, "primal", "all", s=8)
    initialise_students(teacher, fitted, layers, calib)
    with torch.no_grad():
        rand = layer_losses([find_blocks(random_init)[i].attn for i in layers], io, None)
        fit = layer_losses([find_blocks(fitted)[i].attn for i in layers], io, None)
    assert (fit < rand).all(), (fit, rand)
    assert (fit < 1).all()  # better than predicting zeros, on held-out batches


def test_hybrid_initialisation_targets_the_residual_of_the_window():
    teacher = _teacher()
    model, layers = swap_attention(teacher, "hybrid", "all", s=4, window=64)  # the window covers 24 tokens
    info = initialise_students(teacher, model, layers, _ids(1))
    ids = _ids(3)
    for i in layers:
        layer = find_blocks(model)[i].attn
        assert torch.equal(layer.gate, torch.ones_like(layer.gate))
        assert layer.concat.weight.abs().max() < 1e-6, info[i]  # nothing left to fit: the branch is off
    teacher.eval(), model.eval()
    torch.testing.assert_close(model(ids), teacher(ids))


def test_teacher_heads_are_what_the_output_projection_maps():
    teacher = _teacher()
    attn = find_blocks(teacher)[0].attn
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    heads = teacher_heads(attn, x, None)  # (B, H, N, p)
    torch.testing.assert_close(attn.proj(heads.transpose(1, 2).reshape(2, 10, 32)), attn(x))


def test_rebuild_error_is_relative_over_real_tokens_only():
    torch.manual_seed(0)
    layer = pd.build_attention("softmax", 16, 2, causal=True).double().eval()
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, 5:] = False
    with torch.no_grad():
        y = layer(x, mask)
    wrong = y.clone()
    wrong[0, 5:] = 1e6  # padded tokens: never compared
    assert rebuild_error(layer, x, wrong, mask) == 0.0
    wrong[1] *= 1.1
    expected = (0.1 * y[1]).norm() / wrong[mask].norm()  # relative to the recorded output
    assert rebuild_error(layer, x, wrong, mask) == pytest.approx(float(expected), rel=1e-9)
