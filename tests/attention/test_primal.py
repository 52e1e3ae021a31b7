"""The primal layer against the plain reference (forward, gradients, KSVD term), padding, causal decoding."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode

import primaldual as pd
import primaldual.functional.primal as primal_functional
from primaldual.attention.primal import PrimalAttention
from primaldual.functional.primal_rotated import DEFAULT_THRESHOLDS, RotatedThresholds
from primaldual.naive.primal import ksvd_term_ref, primal_attention_ref, primal_params_from_layer
from tests.conftest import rel_err

B, N, DIM, H = 3, 23, 12, 3


def _layer(num_heads: int = H, **opts) -> PrimalAttention:
    torch.manual_seed(1)
    layer = pd.build_attention("primal", DIM, num_heads, dtype=torch.float64, **opts)
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
        layer.num_heads,
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


class LinalgCalls(TorchFunctionMode):
    """Records which of ``torch.linalg.qr`` / ``torch.linalg.eigh`` run inside it: the rotated basis's QR (and, with
    the KSVD energies, its eigendecomposition) is how a test sees which evaluation a layer took."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.linalg.qr or func is torch.linalg.eigh:
            self.seen.append("qr" if func is torch.linalg.qr else "eigh")
        return func(*args, **(kwargs or {}))


# the layer option and head count of each evaluation: with 12 channels and 23 tokens, fold_scores folds for 2 heads
# and multiplies per head for 3 (it weighs C + N H against 3 N; B and s cancel)
EVALUATIONS = {"folded": ("scores", 2), "per_head": ("scores", 3), "rotated": ("rotated", 3)}


@pytest.fixture(params=list(EVALUATIONS))
def scores_path(request) -> dict:
    """The three evaluations as layer options (``path``, and the head count that makes ``fold_scores`` fold or not):
    every comparison runs with each."""
    path, heads = EVALUATIONS[request.param]
    if path == "scores":
        assert primal_functional.fold_scores(B, N, DIM, heads, 4) == (request.param == "folded")
    return {"path": path, "num_heads": heads}


@pytest.mark.parametrize("reduction", ["global", "sample"])
@pytest.mark.parametrize("padding", ["exact", "reference"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(causal, masked, padding, reduction, scores_path):
    layer = _layer(causal=causal, padding=padding, ksvd_reduction=reduction, s=4, rank_multi=2, **scores_path)
    _compare(layer, _mask() if masked else None)


@pytest.mark.parametrize("opts", [{"n": 40}, {"n": 1}, {"data_dependent": False}, {"qkv_bias": False, "s": 7}])
def test_matches_reference_options(opts, scores_path):
    _compare(_layer(**opts, **scores_path), _mask())


@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("padding", ["exact", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_rotated_matches_reference_below_head_width(causal, padding, s):
    # s < head width: the rotated basis has a complement (k = s < p = 4) whose zero-valued rows carry gradient.
    # Sample 0 has one real token and sample 1 none, so their data-dependent W_e, W_r are rank 1 and 0.
    mask = _mask()
    mask[0, 1:] = False
    mask[1] = False
    for reduction in ("global", "sample"):
        layer = _layer(causal=causal, padding=padding, ksvd_reduction=reduction, s=s, rank_multi=3, path="rotated")
        _compare(layer, mask)
    _compare(_layer(causal=causal, padding=padding, s=s, qkv_bias=False, path="rotated"), None)


def test_rotated_choice_by_length():
    from primaldual.functional.primal_rotated import use_rotated

    t = DEFAULT_THRESHOLDS
    assert use_rotated(4, 4096, data_dependent=True, thresholds=t)  # the LRA shapes
    assert not use_rotated(4, 1024, data_dependent=True, compiled=True, thresholds=t)  # Image / Pathfinder: folded
    assert not use_rotated(16, 29, data_dependent=True, compiled=True, thresholds=t)  # JapaneseVowels
    assert use_rotated(4, 4096, data_dependent=False, thresholds=t)  # one decomposition per group for the batch


def test_rotated_only_when_a_backward_follows():
    # the rotated evaluation saves gradient GEMMs; inference (no_grad) at the LRA shape keeps the folded scores
    layer = pd.build_attention("primal", 16, 2, s=4)
    x = torch.randn(1, 2048, 16)
    with torch.no_grad(), LinalgCalls() as calls:
        ref = layer(x)
    assert calls.seen == []
    with LinalgCalls() as calls:
        out = layer(x)  # parameters require gradients: the rotated evaluation, with the energies for the KSVD term
    assert calls.seen == ["qr", "eigh"]
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-5)
    layer.pop_aux_losses()


@pytest.mark.parametrize("path,grad,taken", [("rotated", False, ["qr"]), ("scores", True, []), ("auto", True, [])])
def test_path_option_forces_the_evaluation(path, grad, taken):
    # "rotated" also without a backward (the QR only: no KSVD term, so no energies), "scores" also where "auto" would
    # rotate; "auto" with thresholds past the length keeps the score paths
    thresholds = RotatedThresholds(min_tokens_eager=4096) if path == "auto" else None
    layer = pd.build_attention("primal", 16, 2, s=4, path=path, thresholds=thresholds)
    x = torch.randn(1, 2048 if grad else 16, 16)
    with torch.set_grad_enabled(grad), LinalgCalls() as calls:
        layer(x)
    assert calls.seen == taken
    layer.pop_aux_losses()


def test_a_second_derivative_through_the_rotated_evaluation_is_refused_and_the_score_path_gives_it():
    torch.manual_seed(0)
    x = torch.randn(1, 24, 16, dtype=torch.float64, requires_grad=True)
    grads = {}
    for path in ("rotated", "scores"):
        layer = pd.build_attention("primal", 16, 2, s=4, path=path).double()
        (g,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
        if path == "rotated":  # its backward uses quantities zero in value only: no silent wrong Hessian
            with pytest.raises(RuntimeError, match="once_differentiable"):
                g.square().sum().backward()
        else:
            (grads[path],) = torch.autograd.grad(g.square().sum(), layer.w_e)
        layer.pop_aux_losses()
    assert torch.isfinite(grads["scores"]).all()


def test_custom_thresholds_move_the_crossover():
    layer = pd.build_attention("primal", 16, 2, s=4, thresholds={"min_tokens_eager": 32})
    assert layer.thresholds == RotatedThresholds(min_tokens_eager=32)
    for n, taken in ((31, []), (32, ["qr", "eigh"])):
        with LinalgCalls() as calls:
            layer(torch.randn(2, n, 16))
        assert calls.seen == taken, n
    layer.pop_aux_losses()


def _pass(layer: PrimalAttention, x: torch.Tensor, mask: torch.Tensor | None, g: torch.Tensor) -> list[torch.Tensor]:
    """Output, KSVD term (through ``collect_aux_loss``) and the gradients of the input and every parameter."""
    x = x.clone().requires_grad_()
    out = layer(x, mask)
    aux = pd.collect_aux_loss(layer)
    grads = torch.autograd.grad((out * g).sum() + aux, [x, *layer.parameters()])
    return [out, aux, *grads]


@pytest.mark.parametrize("reduction", ["global", "sample"])
@pytest.mark.parametrize("padding", ["exact", "reference"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("weights", ["data_dependent", "shared", "causal"])
def test_rotated_and_scores_paths_agree(weights, masked, padding, reduction):
    # the same layer forced onto each path: outputs, the collected KSVD term and every gradient, float64
    opts = {"causal": True} if weights == "causal" else {"data_dependent": weights == "data_dependent"}
    opts |= {"padding": padding, "ksvd_reduction": reduction, "s": 3, "rank_multi": 3, "eta": 0.7}
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    g = torch.randn(B, N, DIM, dtype=torch.float64)
    mask = _mask() if masked else None
    got = {path: _pass(_layer(path=path, **opts), x, mask, g) for path in ("rotated", "scores")}
    names = ["out", "aux", "x"] + [n for n, _ in _layer(**opts).named_parameters()]
    for name, a, b in zip(names, got["rotated"], got["scores"], strict=True):
        assert rel_err(a, b) < 1e-10, name
    if masked and padding == "exact":
        assert (got["rotated"][0][~mask] == 0).all()


def test_rotated_path_with_weights_decoding_and_hooks():
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    for causal in (False, True):
        rotated, scores = _layer(causal=causal, path="rotated"), _layer(causal=causal, path="scores")
        out, w = rotated(x, _mask(), need_weights=True)  # the kernel matrix beside the rotated core
        out_s, w_s = scores(x, _mask(), need_weights=True)
        assert rel_err(out, out_s) < 1e-10 and rel_err(w, w_s) < 1e-12
    # step() decodes from its state whatever the path, and equals the forward on the rotated path
    layer = _layer(causal=True, path="rotated", s=5)
    full = layer(x)
    state = layer.init_state(B)
    for t in range(N):
        y, state = layer.step(x[:, t], state)
        assert rel_err(y, full[:, t]) < 1e-10, t
    # the rotated basis never forms per-head outputs: observing them is an error naming the option
    handle = layer.head_outputs.register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match="path='rotated'.*head_outputs"):
        layer(x)
    handle.remove()


def test_thresholds_are_frozen_and_checked():
    t = RotatedThresholds(min_tokens_compiled=4096)
    assert t.min_tokens_eager == DEFAULT_THRESHOLDS.min_tokens_eager
    with pytest.raises(AttributeError):
        t.min_tokens_compiled = 1  # frozen: a changed crossover is a new object, passed as an option
    with pytest.raises(ValueError, match=r"thresholds.min_rows_shared_eager must be an int >= 1, got 0"):
        RotatedThresholds(min_rows_shared_eager=0)
    with pytest.raises(TypeError, match=r"thresholds.min_tokens_eager must be an int >= 1, got 2048.0 \(float\)"):
        RotatedThresholds(min_tokens_eager=2048.0)


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


@pytest.mark.parametrize(
    "opts,unused",
    [
        ({"causal": True, "n": 5}, "n set"),
        ({"causal": True, "max_len": 7, "rank_multi": 3}, "rank_multi, max_len set"),
        ({"data_dependent": False, "rank_multi": 3}, r"rank_multi set.*\(causal=False, data_dependent=False\)"),
    ],
)
def test_sampling_options_a_layer_ignores_are_named(opts, unused):
    from primaldual.options import UnusedOptionWarning

    with pytest.warns(UnusedOptionWarning, match=rf"primal attention: {unused}"):
        pd.build_attention("primal", DIM, H, **opts)
    mode = {k: v for k, v in opts.items() if k in ("causal", "data_dependent")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at their defaults: nothing to say
        pd.build_attention("primal", DIM, H, **mode, n=None, rank_multi=10, max_len=None)


def test_thresholds_outside_path_auto_are_an_error():
    with pytest.raises(ValueError, match=r"thresholds: only path='auto' reads it; this layer \(path='scores'\)"):
        pd.build_attention("primal", DIM, H, path="scores", thresholds={"min_tokens_eager": 8})


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
        ({"path": 1}, "path must be one of 'auto', 'rotated', 'scores'; got 1"),
        ({"path": "Rotated"}, "path must be one of 'auto', 'rotated', 'scores'; got 'Rotated'"),
        ({"path": None}, "path must be one of"),
        ({"thresholds": 4096}, "thresholds must be a RotatedThresholds, a mapping of its fields or None, got 4096"),
        ({"thresholds": {"min_tokens": 4096}}, "thresholds: unknown field.*'min_tokens'.*min_tokens_compiled"),
        ({"thresholds": {"min_tokens_eager": -1}}, "thresholds.min_tokens_eager must be an int >= 1, got -1"),
        ({"thresholds": {"min_tokens_eager": "4096"}}, "thresholds.min_tokens_eager must be an int >= 1, got '4096'"),
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
