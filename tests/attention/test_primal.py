"""The primal layer against the plain reference (forward, gradients, KSVD term), padding, causal decoding."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
import primaldual.attention.primal as primal_layer_module
import primaldual.functional.primal as primal_functional
from primaldual.attention.primal import PrimalAttention
from primaldual.naive.primal import ksvd_term_ref, primal_attention_ref, primal_params_from_layer
from tests.conftest import rel_err

B, N, DIM, H = 3, 23, 12, 3


def _layer(**opts) -> PrimalAttention:
    torch.manual_seed(1)
    layer = pd.build_attention("primal", DIM, H, dtype=torch.float64, **opts)
    # random (not default) biases and Lambda so every term is exercised
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() == 1:
                p.normal_()
    return layer


def _mask() -> torch.Tensor:
    m = torch.ones(B, N, dtype=torch.bool)
    m[1, 15:] = False  # right padding
    m[2, :4] = False  # left padding
    m[2, 10] = False  # a hole
    return m


def _compare(layer: PrimalAttention, mask: torch.Tensor | None) -> None:
    x = torch.randn(B, N, DIM, dtype=torch.float64, requires_grad=True)
    g = torch.randn(B, N, DIM, dtype=torch.float64)
    params = list(layer.parameters())

    out = layer(x, mask)
    term = layer.pop_aux_losses()[0]
    fast = torch.autograd.grad((out * g).sum() + term, [x, *params])

    ref_params = primal_params_from_layer(layer)
    out_r, e_r, r_r = primal_attention_ref(
        x,
        ref_params,
        H,
        mask,
        causal=layer.causal,
        data_dependent=layer.data_dependent,
        padding=layer.padding,
    )
    loss_mask = mask if layer.padding == "exact" else None
    _, term_r = ksvd_term_ref(e_r, r_r, ref_params, loss_mask, layer.ksvd_reduction)
    ref = torch.autograd.grad((out_r * g).sum() + term_r, [x, *params])

    assert rel_err(out, out_r) < 1e-10
    assert rel_err(term, term_r) < 1e-10
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    for name, a, b in zip(names, fast, ref):
        assert rel_err(a, b) < 1e-10, name


@pytest.fixture(params=["folded", "per_head", "rotated"])
def scores_path(request, monkeypatch):
    """The three evaluations (``use_rotated`` and ``fold_scores`` pick by cost): every comparison runs with each."""
    monkeypatch.setattr(primal_functional, "fold_scores", lambda *a: request.param == "folded")
    monkeypatch.setattr(primal_layer_module, "use_rotated", lambda *a, **k: request.param == "rotated")
    return request.param


@pytest.mark.parametrize("reduction", ["global", "sample"])
@pytest.mark.parametrize("padding", ["exact", "reference"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(causal, masked, padding, reduction, scores_path):
    layer = _layer(causal=causal, padding=padding, ksvd_reduction=reduction, s=4, rank_multi=2)
    _compare(layer, _mask() if masked else None)


@pytest.mark.parametrize("opts", [{"n": 40}, {"n": 1}, {"data_dependent": False}, {"qkv_bias": False, "s": 7}])
def test_matches_reference_options(opts, scores_path):
    _compare(_layer(**opts), _mask())


@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("padding", ["exact", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_rotated_matches_reference_below_head_width(causal, padding, s, monkeypatch):
    # s < head width: the rotated basis has a complement (k = s < p = 4) whose zero-valued rows carry gradient.
    # Sample 0 has one real token and sample 1 none, so their data-dependent W_e, W_r are rank 1 and 0.
    monkeypatch.setattr(primal_layer_module, "use_rotated", lambda *a, **k: True)
    mask = _mask()
    mask[0, 1:] = False
    mask[1] = False
    for reduction in ("global", "sample"):
        _compare(_layer(causal=causal, padding=padding, ksvd_reduction=reduction, s=s, rank_multi=3), mask)
    _compare(_layer(causal=causal, padding=padding, s=s, qkv_bias=False), None)


def test_rotated_choice_by_length():
    from primaldual.functional.primal_rotated import use_rotated

    assert use_rotated(4, 4096, data_dependent=True)  # the LRA shapes
    assert not use_rotated(4, 1024, data_dependent=True, compiled=True)  # Image / Pathfinder: the folded scores
    assert not use_rotated(16, 29, data_dependent=True, compiled=True)  # JapaneseVowels: decompositions cost more
    assert use_rotated(4, 4096, data_dependent=False)  # one decomposition per group for the whole batch


def test_rotated_only_when_a_backward_follows(monkeypatch):
    # the rotated evaluation saves gradient GEMMs; inference (no_grad) at the LRA shape keeps the folded scores
    import primaldual.functional.primal_rotated as rotated_module

    calls = []
    real = rotated_module.primal_output_rotated

    def spy(*args, **kwargs):
        calls.append(kwargs.get("with_energy"))
        return real(*args, **kwargs)

    monkeypatch.setattr(primal_layer_module, "primal_output_rotated", spy)
    layer = pd.build_attention("primal", 16, 2, s=4)
    x = torch.randn(1, 2048, 16)
    with torch.no_grad():
        ref = layer(x)
    assert calls == []
    out = layer(x)  # parameters require gradients: the rotated evaluation, with the energies for the KSVD term
    assert calls == [True]
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-5)
    layer.pop_aux_losses()


def test_fold_choice_by_cost():
    # two heads and long sequences (the LRA models) fold; many heads or short sequences multiply per head
    assert primal_functional.fold_scores(4, 4096, 64, 2, 20)
    assert not primal_functional.fold_scores(16, 29, 512, 8, 40)  # JapaneseVowels
    assert not primal_functional.fold_scores(128, 50, 64, 4, 24)  # the patch-4 ViT


def test_n_resolution():
    assert _layer(s=3, rank_multi=4).n == 12
    assert _layer(s=3, rank_multi=4, max_len=9).n == 9  # time-series rule: min(N_max, s * rank_multi)
    assert _layer(s=3, rank_multi=4, max_len=90).n == 12
    assert _layer(s=3, n=7, max_len=5).n == 7
    layer = _layer(s=3, rank_multi=4)
    assert layer.w_e.shape == layer.w_r.shape == (H, 12, 3) and layer.lam.shape == (H, 3)
    assert _layer(data_dependent=False, s=3).w_e.shape == (H, DIM // H, 3)


def test_initialisation_as_reference():
    layer = _layer(s=5, rank_multi=2)
    layer.reset_primal_parameters()
    flat = layer.w_e.reshape(H, -1)  # (H, n*s): orthogonal init over the whole tensor -> orthonormal rows
    assert torch.allclose(flat @ flat.T, torch.eye(H, dtype=flat.dtype), atol=1e-10)
    assert (layer.lam >= 0).all() and (layer.lam < 1).all()


def test_modes_agree_without_padding():
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    full = torch.ones(B, N, dtype=torch.bool)
    for causal in (False, True):
        a, b = _layer(causal=causal), _layer(causal=causal, padding="reference")
        ya, yb = a(x, full), b(x)
        assert rel_err(ya, yb) < 1e-14
        assert rel_err(a.pop_aux_losses()[0], b.pop_aux_losses()[0]) < 1e-14
        assert rel_err(b(x, full), ya) < 1e-14


def test_reference_mode_samples_padding_exact_does_not():
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, 12:] = False
    x2 = x.clone()
    x2[1, 12:] += 10.0  # change only padded content
    exact, ref = _layer(), _layer(padding="reference")
    assert torch.equal(exact(x, mask), exact(x2, mask))
    assert not torch.allclose(ref(x, mask)[1], ref(x2, mask)[1])
    assert torch.equal(ref(x, mask)[0], ref(x2, mask)[0])


def test_exact_mode_equals_unpadded_sequence():
    """A padded sequence gives, at its real tokens, what the same tokens give alone."""
    layer = _layer(ksvd_reduction="sample")
    x = torch.randn(1, N, DIM, dtype=torch.float64)
    mask = torch.zeros(1, N, dtype=torch.bool)
    mask[0, 3:17] = True
    alone = layer(x[:, 3:17])
    term_alone = layer.pop_aux_losses()[0]
    padded = layer(x, mask)
    assert rel_err(padded[:, 3:17], alone) < 1e-12
    assert rel_err(layer.pop_aux_losses()[0], term_alone) < 1e-12


@pytest.mark.parametrize("padding", ["exact", "reference"])
def test_step_decoding_equals_causal_forward(padding):
    layer = _layer(causal=True, padding=padding, s=5)
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    mask = _mask() if padding == "exact" else None
    full = layer(x, mask)
    state = layer.init_state(B)
    for t in range(N):
        y, state = layer.step(x[:, t], state, None if mask is None else mask[:, t])
        assert rel_err(y, full[:, t]) < 1e-12, f"position {t}"
        assert state.sum_q.shape == (B, H, DIM // H)  # constant-size state


def test_step_needs_causal_layer():
    with pytest.raises(RuntimeError, match="causal"):
        _layer().init_state(2)


def test_weights_are_the_kernel_matrix():
    layer = _layer(s=4)
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    mask = _mask()
    _, w = layer(x, mask, need_weights=True)
    q, k = layer.qk(x).chunk(2, -1)
    fq = torch.nn.functional.normalize(q.view(B, N, H, -1), dim=-1).transpose(1, 2)  # (B, H, N, p)
    fk = torch.nn.functional.normalize(k.view(B, N, H, -1), dim=-1).transpose(1, 2)
    kern = fq @ fk.transpose(-1, -2) * (mask[:, None, :, None] & mask[:, None, None, :])
    assert rel_err(w, kern) < 1e-12
    assert not torch.allclose(w, w.transpose(-1, -2))  # asymmetric
    _, wc = _layer(causal=True)(x, need_weights=True)
    assert (wc.triu(1) == 0).all()


def test_aux_loss_collected_with_eta_and_layer_mean():
    enc = pd.Encoder(DIM, 3, H, ["primal", "softmax", "primal"], [{"eta": 0.3}, None, {"eta": 0.3}])
    x = torch.randn(2, N, DIM)
    enc(x)
    terms = [b.attn.peek_aux_losses()[0] for b in enc.blocks if b.attention_name == "primal"]
    total = pd.collect_aux_loss(enc)
    assert torch.allclose(total, 0.3 * (terms[0] + terms[1]) / 2)
    assert pd.collect_aux_loss(enc) is None  # cleared


def test_lambda_and_projection_weights_get_gradients():
    for opts in ({}, {"causal": True}):
        layer = _layer(**opts)
        layer(torch.randn(B, N, DIM, dtype=torch.float64), _mask())
        pd.collect_aux_loss(layer).backward()  # the KSVD term alone reaches Lambda, W_e, W_r
        for name in ("lam", "w_e", "w_r"):
            assert getattr(layer, name).grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    "opts,err",
    [
        ({"s": 0}, "s must be an int >= 1"),
        ({"rank_multi": 1.5}, "rank_multi must be an int >= 1"),
        ({"n": 0}, "n must be"),
        ({"padding": "pad"}, "padding must be one of"),
        ({"ksvd_reduction": "mean"}, "ksvd_reduction must be one of"),
        ({"eta": -1.0}, "eta must be"),
        ({"causal": True, "data_dependent": True}, "data_dependent=True is not causal"),
        ({"head_dim": 5}, "num_heads \\* head_dim must equal dim"),
        ({"attn_drop": 0.1}, "attn_drop must be 0"),
    ],
)
def test_option_errors(opts, err):
    with pytest.raises((TypeError, ValueError), match=err):
        pd.build_attention("primal", DIM, H, **opts)


def test_head_dim_free_when_data_independent():
    layer = pd.build_attention("primal", DIM, H, head_dim=5, data_dependent=False)
    assert layer(torch.randn(2, 7, DIM)).shape == (2, 7, DIM)


def test_observed_head_outputs_use_the_unfused_path_with_equal_output():
    layer = _layer(s=4)
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    fused = layer(x, _mask())
    seen = []
    handle = layer.head_outputs.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    unfused = layer(x, _mask())
    handle.remove()
    assert rel_err(unfused, fused) < 1e-12
    assert seen[0].shape == (B, N, DIM)  # (B, N, H * p) concatenated head outputs


@pytest.mark.parametrize("padding", ["exact", "reference"])
def test_prefill_state_equals_stepping(padding):
    layer = _layer(causal=True, padding=padding, s=5)
    x = torch.randn(3, N, DIM, dtype=torch.float64)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, :4] = False
    state = layer.init_state(3)
    for t in range(N):
        _, state = layer.step(x[:, t], state, mask[:, t])
    pre = layer.prefill_state(x, mask)
    for a, b in zip(pre, state):
        assert rel_err(a, b) < 1e-12
