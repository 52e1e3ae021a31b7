"""Converting bidirectional softmax models (classifiers: time series, vision): non-causal primal students, the KSVD
initialisation of fixed and data-dependent weights, the key masks each layer saw, and what is refused."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.attention.primal import PrimalAttention
from primaldual.convert import (
    convert,
    find_blocks,
    initialise_students,
    ksvd_init,
    layer_losses,
    student_plan,
    swap_attention,
    teacher_attention_io,
)
from primaldual.convert.init import branch_features, branch_scores, ksvd_objective_global
from primaldual.models.sequence import SequenceClassifier
from primaldual.models.timeseries import TimeSeriesClassifier
from primaldual.models.vit import VisionClassifier
from primaldual.theory.ksvd import primal_stationary_point


def _series(seed: int = 0) -> TimeSeriesClassifier:
    torch.manual_seed(seed)
    return TimeSeriesClassifier(3, 4, 20, dim=32, depth=2, num_heads=4, ffn_dim=64, dropout=0.0).double().eval()


def _batch(seed: int, B: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, 20, dtype=torch.bool)
    mask[: B // 2, 14:] = False  # padded series
    return torch.randn(B, 20, 3, generator=g, dtype=torch.float64), mask


def _batches(n: int, seed: int = 1):
    for i in range(n):
        yield _batch(seed + i)


def test_a_bidirectional_teacher_gets_the_papers_non_causal_primal_student():
    teacher = _series()
    model, layers = swap_attention(teacher, "primal", [-1], s=4, n=10)
    layer = find_blocks(model)[1].attn
    assert isinstance(layer, PrimalAttention) and not layer.causal and layer.data_dependent
    assert layer.w_e.shape == (4, 10, 4)  # coefficients over n sampled tokens: the data-dependent weights
    assert layers == [1] and find_blocks(model)[0].attn is not find_blocks(teacher)[0].attn
    torch.testing.assert_close(layer.qk.weight, find_blocks(teacher)[1].attn.qkv.weight[:64])
    fixed = find_blocks(swap_attention(teacher, "primal", [-1], s=4, data_dependent=False)[0])[1].attn
    assert not fixed.data_dependent and fixed.w_e.shape == (4, 8, 4)
    names, opts = student_plan(2, "primal", [1], causal=False, s=4)
    assert names == ["softmax", "primal"] and opts == [None, {"s": 4}]


def test_fixed_weights_leave_a_bidirectional_layer_without_token_mixing():
    """Why data-dependent weights are the bidirectional student's default: with fixed W_e, W_r each token's output
    depends on that token alone, so a stack of such layers never brings the patches into a class token."""
    teacher = _series()
    x, mask = _batch(0, 2)
    for data_dependent, mixes in ((False, False), (True, True)):
        opts = {"data_dependent": True, "n": 12} if data_dependent else {"data_dependent": False}
        model, _ = swap_attention(teacher, "primal", [1], s=4, **opts)
        layer = find_blocks(model)[1].attn.eval()
        h = torch.randn(2, 20, 32, dtype=torch.float64)
        other = h.clone()
        other[:, 1:] = torch.randn(2, 19, 32, dtype=torch.float64)  # every token but the first changes
        moved = (layer(h)[:, 0] - layer(other)[:, 0]).abs().max()
        assert (moved > 1e-6) == mixes, (data_dependent, float(moved))


@pytest.mark.parametrize("student", ["hybrid", "window"])
def test_window_students_are_refused_for_a_bidirectional_teacher(student):
    with pytest.raises(ValueError, match=f"student '{student}' is causal only"):
        swap_attention(_series(), student, [-1])
    with pytest.raises(ValueError, match="causal only"):
        student_plan(2, student, [1], causal=False)


@pytest.mark.parametrize("data_dependent", [False, True])
def test_ksvd_initialisation_of_a_bidirectional_student_sets_j_to_zero(data_dependent):
    teacher = _series()
    opts = {"data_dependent": True, "n": 12} if data_dependent else {"data_dependent": False}
    model, _ = swap_attention(teacher, "primal", [1], s=4, **opts)
    layer = find_blocks(model)[1].attn
    x = torch.randn(6, 20, 32, dtype=torch.float64)
    mask = _batch(0, 6)[1]
    info = ksvd_init(layer, x, mask)
    with torch.no_grad():
        j = ksvd_objective_global(layer, branch_scores(layer, x, mask), mask)
    assert abs(float(j)) < 1e-9 and abs(info["J"]) < 1e-9
    phi = branch_features(layer, x, mask)[mask]  # (T, 2, H, p): no prefix means for a bidirectional layer
    qk = torch.nn.functional.linear(x, layer.qk.weight, layer.qk.bias).view(6, 20, 2, 4, 8)[mask]
    torch.testing.assert_close(phi, torch.nn.functional.normalize(qk, dim=-1))
    if not data_dependent:  # the stationary point itself, scaled to trace 1 per head
        w_e, w_r, _, _ = primal_stationary_point(phi[:, 0, 0], phi[:, 1, 0], 4)
        c = (layer.w_e[0] * layer.w_r[0]).sum() / (w_e * w_r).sum()
        torch.testing.assert_close(layer.w_e[0] @ layer.w_r[0].T, c * w_e @ w_r.T)
        assert "weights_residual" not in info
    else:  # fitted to it: the calibration tokens' scores are those of the stationary point, as well as n allows
        assert 0 <= info["weights_residual"] < 1
    # the layer's own KSVD loss agrees (global reduction: J^2 = 0)
    layer.ksvd_reduction = "global"
    layer.train()
    layer(x, mask)
    assert float(pd.collect_aux_loss(layer).detach()) < 1e-15


def test_data_dependent_coefficients_reproduce_a_reachable_target_exactly():
    """Where fixed weights W* are reachable (n = p sampled tokens spanning the head's channels), the fit finds
    coefficients whose per-sequence weights f(X_b)^T W equal W*, so the residual is 0."""
    teacher = _series()
    model, _ = swap_attention(teacher, "primal", [1], s=4, data_dependent=True, n=8)
    layer = find_blocks(model)[1].attn
    # one sequence repeated: f(X)^T W = W* is solvable for W, so the scores match those of W* exactly
    x = torch.randn(1, 20, 32, dtype=torch.float64).expand(4, -1, -1).contiguous()
    info = ksvd_init(layer, x, None, ridge=0.0)
    assert info["weights_residual"] < 1e-12


@pytest.mark.parametrize("data_dependent", [True, False])
def test_teacher_initialisation_lowers_the_held_out_error_of_a_bidirectional_student(data_dependent):
    teacher = _series()
    calib = _batch(1, B=32)
    held = _batch(2, B=16)
    io = teacher_attention_io(teacher, *held, [0, 1], masks=True)
    opts = {"s": 6, "data_dependent": data_dependent, **({"max_len": 20} if data_dependent else {})}
    random_init, layers = swap_attention(teacher, "primal", "all", **opts)
    fitted, _ = swap_attention(teacher, "primal", "all", **opts)
    info = initialise_students(teacher, fitted, layers, *calib)
    assert all(abs(info[i]["J"]) < 1e-9 for i in layers)
    with torch.no_grad():
        rand = layer_losses([find_blocks(random_init)[i].attn for i in layers], io, None)
        fit = layer_losses([find_blocks(fitted)[i].attn for i in layers], io, None)
    assert (fit < rand).all() and (fit < 1).all(), (fit, rand)


def test_stage_1_trains_a_classifiers_students_on_the_masks_its_layers_saw():
    teacher = _series()
    stream = iter([_batch(0, B=32), *_batches(30)])  # a calibration batch of 32 series, then stage 1's
    model, report = convert(teacher, "primal", "all", batches=stream, steps=25, s=6, max_len=20)
    first, last = report["history"][0], report["history"][-1]
    assert last["loss"] < first["loss"] < 1
    # the outputs at padded steps are zero, as the teacher's recorded ones; real steps follow the teacher
    x, mask = _batch(50)
    for i in (0, 1):
        y = find_blocks(model)[i].attn.eval()(teacher_attention_io(teacher, x, mask, [i])[0][0], mask)
        assert y[~mask].abs().max() == 0


def test_teacher_io_records_the_mask_each_layer_was_given():
    torch.manual_seed(0)
    seq = SequenceClassifier(30, 3, 16, dim=16, depth=2, num_heads=2, ffn_dim=32, pooling="cls").eval()
    ids = torch.randint(1, 30, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[0, 10:] = False
    ((x, y, rope, m),) = teacher_attention_io(seq, ids, mask, [1], masks=True)
    assert rope is None and x.shape[1] == m.shape[1] == 17  # the class token: one more position than the input
    assert m[:, 0].all() and torch.equal(m[:, 1:], mask)
    # an image model is called without a mask, and its layers see none
    vit = VisionClassifier(16, 4, 3, in_channels=1, dim=16, depth=2, num_heads=2, ffn_dim=32).eval()
    ((x, _, _, m),) = teacher_attention_io(vit, torch.rand(2, 1, 16, 16), None, [0], masks=True)
    assert m is None and x.shape == (2, 17, 16)
    assert len(teacher_attention_io(vit, torch.rand(2, 1, 16, 16), None, [0])[0]) == 2  # (x, y) by default


def test_a_vision_transformer_converts_every_layer_with_data_dependent_students():
    torch.manual_seed(0)
    vit = VisionClassifier(16, 4, 3, in_channels=1, dim=16, depth=2, num_heads=2, ffn_dim=32).eval()
    images = [(torch.rand(24 if i == 0 else 8, 1, 16, 16), None) for i in range(12)]  # calibration: 8 n / p = 17
    model, report = convert(vit, "primal", "all", batches=iter(images), steps=10, s=4, data_dependent=True, n=17)
    assert set(report["init"]) == {0, 1} and all(abs(f["J"]) < 1e-5 for f in report["init"].values())
    assert model.eval()(images[1][0]).shape == (8, 3)


def test_a_tower_run_twice_per_forward_is_refused():
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _series()

        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            return self.inner(x, mask) + self.inner(x, mask)

    with pytest.raises(ValueError, match="ran twice in one forward"):
        teacher_attention_io(Twice(), *_batch(0), [0])


def test_find_blocks_names_a_model_without_one_stack():
    with pytest.raises(TypeError, match="Linear has no stack"):
        find_blocks(torch.nn.Linear(2, 2))


def test_the_docs_classifier_example_runs():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "conversion.md").read_text()
    code = next(c for c in re.findall(r"```python\n(.*?)```", doc, re.S) if "VisionClassifier" in c)
    scope: dict = {}
    exec(compile(code, "docs/conversion.md", "exec"), scope)
    assert abs(scope["report"]["init"][3]["J"]) < 1e-5 and len(scope["report"]["history"]) == 3
