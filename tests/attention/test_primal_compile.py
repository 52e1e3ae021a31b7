"""``PrimalAttention(compile=True)``: the compiled core against the plain reference (float64, every option family),
its first-call check and eager fallbacks, and no nested region under an outer ``torch.compile``."""

from __future__ import annotations

import warnings

import pytest
import torch

import primaldual as pd
import primaldual.attention.primal as primal_mod
from primaldual.attention.primal import PrimalAttention
from primaldual.functional.primal_rotated import DEFAULT_THRESHOLDS, RotatedThresholds
from primaldual.naive.primal import ksvd_term_ref, primal_attention_ref, primal_params_from_layer
from tests.attention.test_primal import DIM, B, H, N, _mask
from tests.attention.test_primal import _layer as _eager_layer
from tests.conftest import rel_err


def _layer(**opts) -> PrimalAttention:
    return _eager_layer(compile=True, **opts)  # the same seeded float64 layer with random biases and Lambda


# Each option family once (a compilation costs seconds): non-causal / causal, exact / reference padding, global /
# sample reduction, masked / unmasked, data-dependent / -independent, with / without Q/K bias, n = 1.
CASES = {
    "noncausal-exact-masked-global": ({}, True),
    "causal-exact-masked-sample": ({"causal": True, "ksvd_reduction": "sample"}, True),
    "noncausal-reference-masked-sample": ({"padding": "reference", "ksvd_reduction": "sample"}, True),
    "causal-reference-unmasked-global": ({"causal": True, "padding": "reference"}, False),
    "independent-nobias-masked": ({"data_dependent": False, "qkv_bias": False}, True),
    "n1-unmasked": ({"n": 1}, False),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_core_matches_reference_float64(case):
    opts, masked = CASES[case]
    _check_compiled(_layer(s=4, rank_multi=2, **opts), _mask() if masked else None)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_compiled_rotated_core_matches_reference_float64(causal):
    # the rotated evaluation (chosen for long sequences) compiled, with a complement (s = 2 < head width 4) and,
    # non-causal, rank-1 and rank-0 data-dependent weights (one real token, none)
    mask = _mask()
    mask[0, 1:] = False
    mask[1] = False
    _check_compiled(_layer(s=2, rank_multi=3, causal=causal, path="rotated"), mask)


@pytest.mark.slow
def test_compiled_paths_agree_and_each_keeps_its_own_graph():
    # both forced paths through the one shared compiled core (Dynamo guards on the layer's path), and "auto" with
    # custom thresholds compiled too; outputs, KSVD term and input gradient agree in float64
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    g = torch.randn(B, N, DIM, dtype=torch.float64)
    results = {}
    for path, thresholds in (("rotated", None), ("scores", None), ("auto", RotatedThresholds(min_tokens_compiled=N))):
        layer = _layer(s=3, rank_multi=2, path=path, thresholds=thresholds)
        xi = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            out = layer(xi, _mask())
        assert layer._compile_state == "ok"
        assert layer._rotated(xi, layer._params(xi.dtype), compiled=True) == (path != "scores"), path
        aux = pd.collect_aux_loss(layer)
        results[path] = [out, aux, *torch.autograd.grad((out * g).sum() + aux, [xi])]
    for name, a, b, c in zip(["out", "aux", "x"], results["rotated"], results["scores"], results["auto"], strict=True):
        assert rel_err(a, b) < 1e-10 and rel_err(c, b) < 1e-10, name


def _check_compiled(layer: PrimalAttention, mask: torch.Tensor | None) -> None:
    x = torch.randn(B, N, DIM, dtype=torch.float64, requires_grad=True)
    g = torch.randn(B, N, DIM, dtype=torch.float64)
    params = list(layer.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager would make this test vacuous
        out = layer(x, mask)
    assert layer._compile_state == "ok"
    term = layer.pop_aux_losses()[0]
    fast = torch.autograd.grad((out * g).sum() + term, [x, *params])

    ref_params = primal_params_from_layer(layer)
    out_r, e_r, r_r = primal_attention_ref(
        x, ref_params, H, mask, causal=layer.causal, data_dependent=layer.data_dependent, padding=layer.padding
    )
    _, term_r = ksvd_term_ref(e_r, r_r, ref_params, mask if layer.padding == "exact" else None, layer.ksvd_reduction)
    ref = torch.autograd.grad((out_r * g).sum() + term_r, [x, *params])

    assert rel_err(out, out_r) < 1e-10
    assert rel_err(term, term_r) < 1e-10
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    for name, a, b in zip(names, fast, ref):
        assert rel_err(a, b) < 1e-10, name
    # later calls run the compiled region without re-checking, and still agree
    out2 = layer(x, mask)
    layer.pop_aux_losses()
    assert rel_err(out2, out_r) < 1e-10


def _eager_twin(layer: PrimalAttention) -> PrimalAttention:
    twin = pd.build_attention("primal", DIM, H, dtype=torch.float64, s=4, rank_multi=2)
    twin.load_state_dict(layer.state_dict())
    return twin


def test_compile_failure_falls_back_to_eager_with_the_cause(monkeypatch):
    def broken():
        def run(*args, **kwargs):
            raise RuntimeError("no C++ compiler found\nmore detail")

        return run

    monkeypatch.setattr(primal_mod, "_compiled_core", broken)
    layer = _layer(s=4, rank_multi=2)
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match=r"compilation failed \(RuntimeError: no C\+\+ compiler found\)"):
        out = layer(x, _mask())
    assert layer._compile_state == "eager"
    assert torch.equal(out, _eager_twin(layer)(x, _mask()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per layer, not per call
        layer(x)


def test_disagreeing_compiled_result_falls_back(monkeypatch):
    def wrong():
        def run(self, x, mask, p, ksvd, **kw):
            out, term = PrimalAttention._core(self, x, mask, p, ksvd, **kw)
            return out + 1.0, term

        return run

    monkeypatch.setattr(primal_mod, "_compiled_core", wrong)
    layer = _layer(s=4, rank_multi=2)
    x = torch.randn(B, N, DIM, dtype=torch.float64, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="disagrees with eager"):
        out = layer(x)
    assert layer._compile_state == "eager"
    assert torch.equal(out, _eager_twin(layer)(x))
    assert len(layer.pop_aux_losses()) == 1  # the fallback's term is the one recorded


def test_no_nested_region_inside_an_outer_compile():
    layer = _layer(s=4, rank_multi=2)
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    outer = torch.compile(layer, backend="eager")  # traces the layer; its own region must not be entered
    with torch.no_grad():
        out = outer(x)
    assert layer._compile_state == "unchecked"
    assert rel_err(out, _eager_twin(layer)(x)) < 1e-12


def test_compile_option_is_validated():
    with pytest.raises(TypeError, match="compile"):
        pd.build_attention("primal", DIM, H, compile="true")
    assert "compile=True" in repr(pd.build_attention("primal", DIM, H, compile=True))


def test_the_first_call_check_compares_the_path_the_compiled_graph_takes(monkeypatch):
    # From 2,560 tokens per sample a compiled graph with a backward to follow takes the rotated evaluation, and code
    # without gradients (the check runs under no_grad) the folded one: the check must compare like with like, or
    # low-precision rounding of two evaluations would turn a correct compilation into a fallback
    seen = []
    core = PrimalAttention._core

    def spy(self, x, mask, p, ksvd, rotated=None, kernel=None):
        seen.append(rotated)
        return core(self, x, mask, p, ksvd, rotated, kernel)

    monkeypatch.setattr(PrimalAttention, "_core", spy)
    # a stand-in for the compiled region that evaluates as a compiled graph would
    monkeypatch.setattr(
        primal_mod,
        "_compiled_core",
        lambda: lambda self, x, m, p, k, kernel: core(self, x, m, p, k, self._rotated(x, p, True), kernel),
    )
    layer = pd.build_attention("primal", 16, 2, s=4, compile=True)
    x = torch.randn(1, 2600, 16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        layer(x)
    assert layer._compile_state == "ok"
    assert seen == [True]  # the eager check ran once, on the rotated evaluation (without gradients it would fold)
    t = DEFAULT_THRESHOLDS
    assert primal_mod.use_rotated(1, 2600, True, compiled=True, thresholds=t)
    assert not primal_mod.use_rotated(1, 2600, True, compiled=True, backward=False, thresholds=t)
    assert not primal_mod.use_rotated(1, 2600, True, compiled=False, backward=False, thresholds=t)


def test_path_and_thresholds_reach_the_compiled_layer():
    layer = _layer(path="auto", thresholds={"min_tokens_compiled": 4096})
    assert layer.compile_core and layer.path == "auto"
    assert layer.thresholds == RotatedThresholds(min_tokens_compiled=4096)
    assert "min_tokens_compiled=4096" in repr(layer)
    layer = _layer(path="rotated")
    assert layer.compile_core and "path='rotated'" in repr(layer)
