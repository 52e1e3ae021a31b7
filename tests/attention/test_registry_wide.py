"""Registry-wide checks: every registered attention goes through the same tests.

A mechanism gets extra option sets to test through ``VARIANTS`` (name -> list of option dicts);
by default its registered defaults are tested.
"""

from __future__ import annotations

import copy

import pytest
import torch

import primaldual as pd
from primaldual.attention.base import KVCache
from primaldual.aux_loss import collect_aux_loss
from tests.conftest import rel_err

DIM, HEADS, N = 12, 3, 13

VARIANTS: dict[str, list[dict]] = {
    # qk_norm (every mechanism with a fused qkv projection takes it): each layout on some of them
    "softmax": [{}, {"qk_norm": "head"}, {"softcap": 2.0, "scale": 1.5}],
    "linear": [{}, {"qk_norm": "all_heads", "qk_norm_eps": 1e-5}],
    "sparse": [
        {"window": 2},
        {"window": 2, "stride": 3, "num_global": 2},
        {"window": 2, "qk_norm": "all_heads"},
        {"window": 2, "stride": 3, "num_global": 1, "softcap": 1.5},
    ],
    # a non-zero gate: at the default 0 the branch starts outside the output (window only) and gets no gradient
    "hybrid": [
        {"window": 4, "sinks": 2, "s": 3, "gate_init": 0.5},
        {"window": 3, "sinks": 0, "primal_branch": False},
        {"window": 64, "s": 2, "gate_init": -1.0, "ksvd_reduction": "sample"},
        {"window": 4, "sinks": 1, "s": 3, "gate_init": 0.5, "qk_norm": "head"},
        {"window": 4, "sinks": 1, "s": 3, "gate_init": 0.5, "softcap": 1.5},
    ],
    "softmax_bn": [{}, {"stats_over": "batch", "beta": 0.5}, {"divide_std": False}],
    "linear_bn": [{}, {"stats_over": "batch"}],
    "softmax_sh": [{}, {"pooling": "stride"}, {"factors": [3, 1, 2]}],
    "linear_sh": [{}, {"pooling": "stride", "factors": 2}],
    "softmax_bn_sh": [
        {},
        {"stats_from": "full", "factors": [2, 3, 1]},
        {"stats_over": "batch", "pooling": "stride", "qk_norm": "head"},
    ],
    "linear_bn_sh": [{}, {"stats_from": "full", "pooling": "stride"}],
    "primal": [
        {},
        {"padding": "reference"},
        {"ksvd_reduction": "sample", "s": 3, "rank_multi": 2},
        {"n": 5},
        {"data_dependent": False},
        {"path": "rotated", "s": 3},
    ],
}


def _cases():
    for info in pd.list_attentions():
        for opts in VARIANTS.get(info.name, [{}]):
            for causal in (False, True):
                if (causal and info.capabilities.causal) or (not causal and info.capabilities.non_causal):
                    yield pytest.param(
                        info.name, opts, causal, id=f"{info.name}-{opts}-{'causal' if causal else 'full'}"
                    )


CASES = list(_cases())


def _build(name, opts, causal, dtype=torch.float64):
    torch.manual_seed(0)
    layer = pd.build_attention(name, DIM, HEADS, causal=causal, dtype=dtype, **opts)
    return layer.eval()


def _loss(layer, x, mask):
    out = layer(x, mask)
    aux = collect_aux_loss(layer)
    return out.pow(2).sum() + (aux if aux is not None else 0.0), out


def _mask(b: int, n: int) -> torch.Tensor:
    m = torch.ones(b, n, dtype=torch.bool)
    m[1, n - 4 :] = False
    return m


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_shapes_and_weights(name, opts, causal):
    layer = _build(name, opts, causal)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    out = layer(x, _mask(2, N))
    assert out.shape == x.shape
    if layer.capabilities.weights:
        out2, w = layer(x, _mask(2, N), need_weights=True)
        assert torch.allclose(out, out2)
        assert w.shape == (2, HEADS, N, N)
    else:
        with pytest.raises(ValueError):
            layer(x, need_weights=True)


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_padding_invariance_and_zero_grad(name, opts, causal):
    layer = _build(name, opts, causal)
    if not getattr(layer, "padding_invariant", True):
        pytest.skip(f"{name} with {opts} reproduces a reference that is not padding invariant by design")
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    mask = _mask(2, N)
    _, out = _loss(layer, x, mask)
    # append 5 padded tokens with arbitrary content: real positions must not change
    xp = torch.cat([x, 100 * torch.randn(2, 5, DIM, dtype=torch.float64)], 1).requires_grad_(True)
    mp = torch.cat([mask, torch.zeros(2, 5, dtype=torch.bool)], 1)
    loss, outp = _loss(layer, xp, mp)
    assert rel_err(outp[:, :N][mask], out[mask]) < 1e-10
    assert (outp[~mp] == 0).all(), "outputs at padded positions must be zero"
    loss.backward()
    assert (xp.grad[~mp] == 0).all(), "padded inputs must get zero gradient"
    assert xp.grad[mp].abs().sum() > 0


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_left_and_right_padding_do_not_change_real_outputs(name, opts, causal):
    """0 to 7 pads on the left and 0 to 7 on the right (odd and even, so not multiples of any pooling factor),
    the same for every sample of the batch, with arbitrary pad content: outputs at real tokens are unchanged
    (sparse global tokens, windows and strides count real tokens, so pads never move them)."""
    layer = _build(name, opts, causal)
    if not getattr(layer, "padding_invariant", True):
        pytest.skip(f"{name} with {opts} reproduces a reference that is not padding invariant by design")
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    mask = _mask(2, N)  # sample 1 ends in 4 pads, so its right pads below follow pads
    ref = layer(x, mask)
    for left in range(8):
        for right in range(8):
            pads = [100 * torch.randn(2, p, DIM, dtype=torch.float64) for p in (left, right)]
            xp = torch.cat([pads[0], x, pads[1]], 1)  # (2, left + N + right, DIM)
            mp = torch.cat([torch.zeros(2, left, dtype=torch.bool), mask, torch.zeros(2, right, dtype=torch.bool)], 1)
            out = layer(xp, mp)
            assert rel_err(out[:, left : left + N][mask], ref[mask]) < 1e-10, f"{left} left, {right} right pads"
            assert (out[~mp] == 0).all()


@pytest.mark.parametrize("name,opts,causal", [c for c in CASES if c.values[2]])
def test_causal_no_leak(name, opts, causal):
    layer = _build(name, opts, causal)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    out = layer(x)
    for t in (0, 5, N - 2):
        y = x.clone()
        y[:, t + 1 :] += torch.randn_like(y[:, t + 1 :])
        assert torch.allclose(layer(y)[:, : t + 1], out[:, : t + 1], atol=1e-12, rtol=0), f"leak at t={t}"


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_no_nan_fully_padded_and_zero_inputs(name, opts, causal):
    layer = _build(name, opts, causal).train()
    x = torch.randn(3, N, DIM, dtype=torch.float64)
    x[2] = 0.0  # zero vectors everywhere in one sample
    x.requires_grad_(True)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[0] = False  # one fully padded sample
    loss, out = _loss(layer, x, mask)
    assert torch.isfinite(out).all() and (out[0] == 0).all()
    loss.backward()
    assert torch.isfinite(x.grad).all()
    for p in layer.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_determinism_and_gradient_flow(name, opts, causal):
    layer = _build(name, opts, causal)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    assert torch.equal(layer(x, _mask(2, N)), layer(x, _mask(2, N)))
    loss, _ = _loss(layer, x, _mask(2, N))
    loss.backward()
    for pname, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {pname}"


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_float32_matches_float64(name, opts, causal):
    layer64 = _build(name, opts, causal)
    layer32 = copy.deepcopy(layer64).float()
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    a = layer64(x, _mask(2, N))
    b = layer32(x.float(), _mask(2, N))
    assert rel_err(b, a) < 1e-4


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_bad_inputs_raise_clear_errors(name, opts, causal):
    layer = _build(name, opts, causal, dtype=torch.float32)
    x = torch.randn(2, N, DIM)
    with pytest.raises(ValueError, match=r"\(B, N, 12\)"):
        layer(x[0])
    with pytest.raises(ValueError, match="last dimension 12"):
        layer(torch.randn(2, N, DIM + 1))
    with pytest.raises(TypeError, match="torch.bool"):
        layer(x, torch.ones(2, N))
    with pytest.raises(ValueError, match="mask must have shape"):
        layer(x, torch.ones(2, N + 1, dtype=torch.bool))
    with pytest.raises(TypeError, match="floating"):
        layer(torch.ones(2, N, DIM, dtype=torch.long))


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_non_finite_input_rejected_once_at_model_entry(name, opts, causal):
    """Values are checked at Encoder entry (one host sync per forward), never inside a layer's hot path."""
    torch.manual_seed(0)
    enc = pd.Encoder(DIM, 2, HEADS, attention=name, attention_options=opts, causal=causal)
    y = torch.randn(2, N, DIM)
    y[0, 3, 1] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN or Inf"):
        enc(y)
    y[0, 3, 1] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        enc(y)
    if opts.get("path") == "rotated":
        pytest.skip(
            "path='rotated': torch.linalg.eigh reads LAPACK's error codes back (a host sync per call), which is why "
            "path='auto' takes the rotated basis on CPU only"
        )
    layer = enc.blocks[0].attn
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        layer(torch.randn(2, N, DIM), _mask(2, N))
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::isfinite", "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"}, ops


@pytest.mark.parametrize("name", [i.name for i in pd.list_attentions()])
def test_constructor_errors(name):
    with pytest.raises(ValueError, match="divisible"):
        pd.build_attention(name, 10, 3)
    with pytest.raises(TypeError, match="valid options"):
        pd.build_attention(name, 12, 3, not_an_option=1)
    for bad in ("3", 3.0, True):  # the wrong type is a TypeError, the wrong value a ValueError
        with pytest.raises(TypeError, match=r"num_heads must be a positive int, got"):
            pd.build_attention(name, 12, bad)
    with pytest.raises(ValueError, match="num_heads must be a positive int, got 0"):
        pd.build_attention(name, 12, 0)


def test_unknown_name_lists_registered():
    with pytest.raises(KeyError, match="softmax"):
        pd.build_attention("nope", 12, 3)


def test_registry_listing_has_capabilities():
    table = pd.attention_table()
    for info in pd.list_attentions():
        assert info.name in table
        d = info.as_dict()
        assert {"causal", "non_causal", "weights", "aux_loss", "time", "memory"} <= set(d)
    assert {"softmax", "linear", "sparse"} <= {i.name for i in pd.list_attentions()}


def _first_per_mechanism(cases: list) -> list:
    """One option set per mechanism: compilation is per code path, the option variants are checked eagerly."""
    seen: set[str] = set()
    return [c for c in cases if not (c.values[0] in seen or seen.add(c.values[0]))]


@pytest.mark.slow
@pytest.mark.parametrize("name,opts,causal", _first_per_mechanism([c for c in CASES if not c.values[2]]))
def test_torch_compile_agrees(name, opts, causal):
    layer = _build(name, opts, causal, dtype=torch.float32)
    x = torch.randn(2, N, DIM)
    mask = _mask(2, N)
    eager = layer(x, mask)
    compiled = torch.compile(layer, dynamic=False)
    assert rel_err(compiled(x, mask), eager) < 1e-5


@pytest.mark.parametrize("name", [i.name for i in pd.list_attentions()])
def test_capability_flags_are_enforced(name):
    """Every Capabilities field means what it says: refused modes raise, aux_loss matches what is recorded."""
    caps = next(i.capabilities for i in pd.list_attentions() if i.name == name)
    for causal, supported in ((True, caps.causal), (False, caps.non_causal)):
        if not supported:
            with pytest.raises(ValueError, match="causal"):
                pd.build_attention(name, DIM, HEADS, causal=causal)
            continue
        layer = pd.build_attention(name, DIM, HEADS, causal=causal)
        x = torch.randn(2, N, DIM)
        if caps.weights:
            mask = _mask(2, N)
            out, w = layer(x, mask, need_weights=True)
            assert w.shape == (2, HEADS, N, N)
            if caps.stochastic_weights:  # a distribution over the real keys of every real query
                real = w.transpose(1, 2)[mask]  # (B, H, N, N) -> (B, N, H, N) -> the real queries' (T, H, N)
                sums = real.sum(-1)  # 1, or 0 for a query with no key yet (a causal pooled head's first tokens)
                assert (real >= 0).all()
                torch.testing.assert_close(sums, (sums > 0.5).to(sums.dtype))
        else:
            with pytest.raises(ValueError, match="weights"):
                layer(x, need_weights=True)
        collect_aux_loss(layer)
        layer(x, _mask(2, N))
        aux = collect_aux_loss(layer)
        assert (aux is not None) == caps.aux_loss
        assert isinstance(caps.time, str) and isinstance(caps.memory, str) and caps.weights_meaning


@pytest.mark.parametrize("name,opts,causal", [c for c in CASES if c.values[2]])
def test_incremental_decoding_equals_causal_forward(name, opts, causal):
    """step() token by token gives the causal forward's output at every position, for left-padded prompts."""
    layer = _build(name, opts, causal)
    B, T = 3, N + 4
    x = torch.randn(B, T, DIM, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :3] = False  # prompts of different lengths, left-padded
    mask[2, :7] = False
    full = layer(x, mask)
    state = layer.init_state(B)
    for t in range(T):
        y_t, state = layer.step(x[:, t], state, mask[:, t])
        assert rel_err(y_t, full[:, t]) < 1e-10, f"position {t}"
    assert layer.capabilities.decoding in ("kv_cache", "window_cache", "constant", "recompute")
    if layer.capabilities.decoding == "constant":
        assert all(s.shape[0] == B and T not in s.shape for s in state if isinstance(s, torch.Tensor))
    if layer.capabilities.decoding == "window_cache" and layer.stride == 0:
        cache = getattr(state, "window", state)  # a hybrid layer's state holds a window cache beside its sums
        assert cache.length <= 2 * (layer.window + layer.num_global) + 17  # the cache does not grow with T


def _mixed_left_padding(B: int, T: int) -> torch.Tensor:
    """``(B, T)`` mask of left-padded prompts with 0 ... 7 pads (row b has ``b % 8`` pads, so that some are not
    multiples of any pooling factor)."""
    mask = torch.ones(B, T, dtype=torch.bool)
    for b in range(B):
        mask[b, : b % 8] = False
    return mask


def _states_equal(a, b) -> bool:
    """Equal decoding states (up to rounding in the projections), compared field by field."""
    if type(a) is not type(b):
        return False
    if isinstance(a, KVCache):  # the slots in use (the buffers' spare capacity differs)
        a, b = ((c.k, c.v, c.mask, c.rank, c.length, c.t, c.count) for c in (a, b))
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.is_floating_point() and not rel_err(x, y) < 1e-10:
                return False
            if not x.is_floating_point() and not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("name,opts,causal", [c for c in CASES if c.values[2]])
def test_prefill_equals_forward_and_continues_like_stepping(name, opts, causal):
    """prefill() gives the causal forward's output and the state of token-by-token stepping, so step() continues
    the sequence exactly: left-padded prompts with 0 to 7 pads, then 6 more tokens (some padded)."""
    layer = _build(name, opts, causal)
    B, T, extra = 8, N + 7, 6
    x = torch.randn(B, T + extra, DIM, dtype=torch.float64)
    mask = torch.cat([_mixed_left_padding(B, T), torch.ones(B, extra, dtype=torch.bool)], 1)
    mask[3, T + 2] = False  # a padded token while decoding
    full = layer(x, mask)
    out, pre = layer.prefill(x[:, :T], mask[:, :T])
    assert rel_err(out, full[:, :T]) < 1e-10
    assert (out[~mask[:, :T]] == 0).all()
    stepped = layer.init_state(B)
    for t in range(T):
        _, stepped = layer.step(x[:, t], stepped, mask[:, t])
    if not (layer.capabilities.decoding == "window_cache" and layer.stride == 0):  # a window cache prunes on its
        assert _states_equal(pre, stepped)  # own schedule: only what it keeps must agree, which the steps check
    for t in range(T, T + extra):
        y_pre, pre = layer.step(x[:, t], pre, mask[:, t])
        y_step, stepped = layer.step(x[:, t], stepped, mask[:, t])
        assert rel_err(y_pre, y_step) < 1e-10 and rel_err(y_pre, full[:, t]) < 1e-10, f"position {t}"


def test_prefill_refuses_bad_input():
    layer = _build("softmax", {}, True)
    x = torch.randn(2, 5, DIM, dtype=torch.float64)
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        layer.prefill(x, torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"mask must have shape \(B, N\) = \(2, 5\)"):
        layer.prefill(x, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="x"):
        layer.prefill(x[..., :-1])
    with pytest.raises(RuntimeError, match="causal"):
        _build("softmax", {}, False).prefill(x)


@pytest.mark.parametrize("name", [i.name for i in pd.list_attentions() if not i.capabilities.causal])
def test_non_causal_mechanisms_say_they_cannot_decode(name):
    assert next(i for i in pd.list_attentions() if i.name == name).capabilities.decoding == "none"


@pytest.mark.parametrize("opts", [{"window": 2}, {"window": 3, "num_global": 2}])
def test_sparse_window_cache_stays_bounded_and_exact_over_long_decoding(opts):
    layer = _build("sparse", opts, True)
    x = torch.randn(2, 70, DIM, dtype=torch.float64)
    mask = torch.ones(2, 70, dtype=torch.bool)
    mask[1, :5] = False
    full = layer(x, mask)
    state = layer.init_state(2)
    lengths = []
    for t in range(70):
        y_t, state = layer.step(x[:, t], state, mask[:, t])
        assert rel_err(y_t, full[:, t]) < 1e-10, f"position {t}"
        lengths.append(state.length)
    assert max(lengths) <= 2 * (layer.window + layer.num_global) + 17 and min(lengths[40:]) < max(lengths)


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_encoder_positions_equal_the_full_output_at_those_positions(name, opts, causal):
    """Encoder(positions=...) returns forward()[:, positions] with the same gradients and regulariser: only the last
    block's FFN and the final norm skip the other tokens (the Decision Transformer reads one token in three)."""
    torch.manual_seed(0)
    enc = pd.Encoder(DIM, 2, HEADS, name, opts, causal=causal, dtype=torch.float64).eval()
    x = torch.randn(2, N, DIM, dtype=torch.float64, requires_grad=True)
    mask = _mask(2, N)
    sel = slice(1, None, 3)
    full = enc(x, mask)
    aux_full = collect_aux_loss(enc)
    (g_full,) = torch.autograd.grad(full[:, sel].pow(2).sum() + (aux_full if aux_full is not None else 0.0), x)
    part = enc(x, mask, positions=sel)
    aux_part = collect_aux_loss(enc)
    (g_part,) = torch.autograd.grad(part.pow(2).sum() + (aux_part if aux_part is not None else 0.0), x)
    assert part.shape == (2, len(range(N)[sel]), DIM)
    assert rel_err(part, full[:, sel]) < 1e-12 and rel_err(g_part, g_full) < 1e-10
    assert (aux_full is None) == (aux_part is None)
    if aux_full is not None:
        assert rel_err(aux_part, aux_full) < 1e-12
    with pytest.raises(TypeError, match="positions must be a slice"):
        enc(x, mask, positions=[1, 4])


def _rope(B: int, T: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence positions (sequence b starts at offset + 3b), as a left-padded batch's position ids would."""
    from primaldual.functional.rotary import rope_tables

    pos = torch.arange(T)[None] + offset + 3 * torch.arange(B)[:, None]  # (B, T)
    return rope_tables(pos, DIM // HEADS, dtype=torch.float64)


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_rope_is_honoured_or_refused(name, opts, causal):
    """capabilities.rope: identity tables change nothing, real tables change the output and decoding with them
    (prefill, then step) equals the forward with them; without the capability every entry point refuses rope."""
    layer = _build(name, opts, causal)
    B, T = 3, N
    x = torch.randn(B, T, DIM, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :3] = False
    cos, sin = _rope(B, T)
    if not layer.capabilities.rope:
        with pytest.raises(ValueError, match="rope: attention .* takes no rotary position embeddings"):
            layer(x, mask, rope=(cos, sin))
        if causal:
            with pytest.raises(ValueError, match="rope: attention"):
                layer.prefill(x, mask, rope=(cos, sin))
            with pytest.raises(ValueError, match="rope: attention"):
                layer.step(x[:, 0], layer.init_state(B), rope=(cos[:, 0], sin[:, 0]))
        return
    plain = layer(x, mask)
    assert rel_err(layer(x, mask, rope=(torch.ones_like(cos), torch.zeros_like(sin))), plain) < 1e-12
    full = layer(x, mask, rope=(cos, sin))
    assert rel_err(full, plain) > 1e-3
    if not causal:
        return
    P = 5
    out, state = layer.prefill(x[:, :P], mask[:, :P], rope=(cos[:, :P], sin[:, :P]))
    assert rel_err(out, full[:, :P]) < 1e-10
    for t in range(P, T):
        y_t, state = layer.step(x[:, t], state, mask[:, t], rope=(cos[:, t], sin[:, t]))
        assert rel_err(y_t, full[:, t]) < 1e-10, f"position {t}"
