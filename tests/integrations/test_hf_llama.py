"""primaldual.integrations.hf.convert on Llama and the model types of its layout (Mistral, Qwen2, Gemma, Granite,
OLMo, SmolLM3, Phi-3; with query / key norms Qwen3, Qwen3-MoE, OLMo 2 and 3, Gemma 3; with partial rotary StableLM,
Phi-2), GPT-NeoX and OPT: grouped K / V heads, rotary embeddings, query / key norms, the cache, save and load, and
what is refused."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from .tiny_models import QK_NORMED, ROTARY, greedy, left_padded, real_logits, tiny, token_batch

pytest.importorskip("transformers")
hf = pytest.importorskip("primaldual.integrations.hf")


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("mech,opts", [("softmax", {}), ("sparse", {"window": 64})])
def test_softmax_path_reproduces_the_original(impl, mech, opts):
    """Every layer converted to softmax (or a covering window) gives the original's logits, left padding included:
    the grouped K / V heads are repeated in transformers' order and RoPE reaches q and k."""
    model = tiny("llama")
    model.set_attn_implementation(impl)
    ids, mask = left_padded()
    ref = real_logits(model, ids, mask)
    conv = hf.convert(copy.deepcopy(model), mech, "all", **opts)
    assert len(hf.converted_layers(conv)) == 2
    torch.testing.assert_close(real_logits(conv, ids, mask), ref, rtol=0, atol=1e-5)


def test_softmax_conversion_generates_like_the_original_with_the_cache():
    model = tiny("llama")
    conv = hf.convert(copy.deepcopy(model), "softmax", "all")
    ids, mask = left_padded()
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=1)
    assert torch.equal(conv.generate(ids, **kw), model.generate(ids, **kw))


@pytest.mark.parametrize(
    "mech,layers,opts",
    [("primal", (-1,), {"s": 4}), ("hybrid", "all", {"window": 4, "sinks": 1, "s": 4, "gate_init": 0.5})],
)
def test_primal_and_hybrid_generate_equals_greedy_full_forwards(mech, layers, opts):
    """Cached decoding (the primal state; the hybrid's recomputed prefix with its rotary tables) equals greedy
    decoding by full forwards without a cache."""
    model = tiny("llama")
    if mech == "primal":
        with pytest.warns(UserWarning, match=r"layers \[1\]: attention 'primal' takes no rotary position embeddings"):
            conv = hf.convert(copy.deepcopy(model), mech, layers, **opts)
    else:
        conv = hf.convert(copy.deepcopy(model), mech, layers, **opts)
    ids, mask = left_padded()
    got = conv.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=1)
    assert torch.equal(got, greedy(conv, ids, mask, 5))


def test_hybrid_uses_the_rotary_tables():
    """The hybrid's window branch is rotated: dropping the tables changes its output."""
    model = tiny("llama")
    conv = hf.convert(copy.deepcopy(model), "hybrid", "all", window=4, sinks=1, s=4, gate_init=0.5)
    layer = conv.model.layers[0].self_attn
    assert layer.uses_rope
    x = torch.randn(2, 7, 32)
    cos, sin = conv.model.rotary_emb(x, torch.arange(7)[None].expand(2, 7))
    with torch.no_grad():
        with_rope, _ = layer(x, position_embeddings=(cos, sin))
        without = layer.attn(x)
    assert (with_rope - without).abs().max() > 1e-4
    with pytest.raises(ValueError, match="must be called with position_embeddings"):
        layer(x)


def test_grouped_heads_that_do_not_divide_are_refused():
    from primaldual.integrations.hf.architectures import LayoutError, _repeat_heads

    w = torch.randn(3 * 8, 32)
    with pytest.raises(LayoutError, match="3 key / value heads do not divide the 4 query heads"):
        _repeat_heads((w, None), 3, 4, 8, "k_proj")
    with pytest.raises(LayoutError, match="k_proj has 24 outputs, expected 2 heads x 8"):
        _repeat_heads((w, None), 2, 4, 8, "k_proj")


def test_save_pretrained_from_pretrained_round_trip(tmp_path):
    model = tiny("llama")
    with pytest.warns(UserWarning, match="takes no rotary position embeddings"):
        conv = hf.convert(model, "primal", (-1,), s=4)
    ids, mask = left_padded()
    ref = real_logits(conv, ids, mask)
    conv.save_pretrained(tmp_path)
    import transformers

    with pytest.warns(UserWarning, match="takes no rotary position embeddings"):
        back = hf.from_pretrained(transformers.LlamaForCausalLM, tmp_path).eval()
    torch.testing.assert_close(real_logits(back, ids, mask), ref, rtol=0, atol=0)


def test_hybrid_decodes_from_a_bounded_state_in_the_cache():
    """The converted hybrid keeps its own state (window cache + primal sums) in the model's cache: it does not grow
    with the generated length."""
    model = hf.convert(tiny("llama"), "hybrid", "all", window=4, sinks=1, s=4, gate_init=0.5)
    ids, mask = left_padded()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=1,
                         return_dict_in_generate=True)  # fmt: skip
    entry = out.past_key_values.layers[0]
    assert isinstance(entry, hf.StateCacheLayer) and entry.seen == 8 + 24 - 1
    assert entry.state.window.length <= 2 * (4 + 1) + 16 + 1  # pruned: the window, the sinks and some slack
    assert entry.state.primal.sum_q.shape == (2, 4, 8)  # constant: (B, H, head width)


def test_recomputing_mechanisms_still_decode_exactly():
    """The SVR family has no incremental path: its cache entry keeps the inputs and the output is recomputed."""
    model = hf.convert(tiny("gpt2"), "softmax_bn", "all")
    ids, _ = token_batch(pad_from=None, length=5)
    mask = torch.ones_like(ids)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False),
                       greedy(model, ids, mask, 4))  # fmt: skip


@pytest.mark.parametrize("name", sorted(ROTARY))
def test_every_llama_layout_type_converts_faithfully(name):
    """Softmax in every layer gives the original's logits (grouped heads, biases (Qwen2), the fused qkv_proj
    (Phi-3), the logit scale (Granite), NoPE layers (SmolLM3), query / key norms (Qwen3, OLMo 2, Gemma 3)); so does
    softmax decoding with the cache; a primal last layer decodes with its state."""
    overrides = {"attention_multiplier": 0.7} if name == "granite" else {}  # not 1 / sqrt(head_dim)
    model = tiny(name, **overrides)
    ids, mask = left_padded()
    conv = hf.convert(copy.deepcopy(model), "softmax", "all")
    torch.testing.assert_close(real_logits(conv, ids, mask), real_logits(model, ids, mask), rtol=0, atol=1e-5)
    if name in QK_NORMED:
        kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=1)
        assert torch.equal(conv.generate(ids, **kw), model.generate(ids, **kw))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        conv = hf.convert(copy.deepcopy(model), "primal", (0,), s=4)
    said = [str(w.message) for w in seen]
    assert any("takes no rotary position embeddings" in m for m in said)
    assert any("takes no query / key norms" in m for m in said) == (name in QK_NORMED)
    got = conv.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=1)
    assert torch.equal(got, greedy(conv, ids, mask, 3))


def test_nope_layers_take_no_rotary_tables():
    conv = hf.convert(tiny("smollm3"), "softmax", "all")
    assert [layer.self_attn.uses_rope for layer in conv.model.layers] == [True, False]


@pytest.mark.parametrize(
    "name,overrides,layers,message",
    [
        ("olmo", {"clip_qkv": 8.0}, "all", r"layer 0: clamped projections \(clip_qkv=8.0\)"),
        ("gemma", {"use_bidirectional_attention": True}, "all", "layer 0: a bidirectional decoder"),
        ("phi", {"qk_layernorm": True}, "all", r"layer 0: LayerNorms on queries / keys \(qk_layernorm\)"),
    ],
)  # fmt: skip
def test_what_a_converted_layer_cannot_reproduce_is_refused(name, overrides, layers, message):
    model = tiny(name, **overrides)
    with pytest.raises(ValueError, match=rf"model type {name!r}, {message}"):
        hf.convert(model, "softmax", layers)


def test_query_key_norms_are_read_per_head_or_over_all_heads():
    """Per head (Qwen3; Gemma 3's gain is 1 + w), or over all heads with the grouped key heads' gain repeated to
    the query heads (OLMo 2); the layer's gains are the ones the model applies."""
    for name, kind in (("qwen3", "head"), ("gemma3_text", "head"), ("olmo2", "all_heads")):
        model = tiny(name)
        attn = model.model.layers[1].self_attn
        layer = hf.convert(copy.deepcopy(model), "softmax", (1,)).model.layers[1].self_attn.attn
        eps = getattr(attn.q_norm, "variance_epsilon", getattr(attn.q_norm, "eps", None))
        assert layer.qk_norm == kind and layer.q_norm.eps == eps
        offset = 1.0 if name == "gemma3_text" else 0.0
        torch.testing.assert_close(layer.q_norm.weight, attn.q_norm.weight + offset, rtol=0, atol=0)
        k = attn.k_norm.weight + offset
        if kind == "all_heads":  # (Hkv*D,) -> (H*D,): each key head's gain for the query heads it serves
            k = k.view(2, -1).repeat_interleave(2, 0).flatten()
        torch.testing.assert_close(layer.k_norm.weight, k, rtol=0, atol=0)


def test_save_pretrained_from_pretrained_round_trip_with_query_key_norms(tmp_path):
    """Gemma 3's 1 + w gain is read again from the fresh (meta-device) model transformers builds while loading,
    and the saved gains load into the converted layers."""
    model = hf.convert(tiny("gemma3_text"), "softmax", "all")
    model.save_pretrained(tmp_path)
    import transformers

    back = hf.from_pretrained(transformers.Gemma3ForCausalLM, tmp_path)
    ids, mask = left_padded()
    torch.testing.assert_close(real_logits(back, ids, mask), real_logits(model, ids, mask), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["qwen3", "olmo2", "gemma3_text"])
def test_a_converted_model_with_query_key_norms_loads_in_bf16(tmp_path, name):
    """transformers builds the model in bf16 (the default dtype while loading): the norms are still read."""
    import transformers

    model = hf.convert(tiny(name), "softmax", "all")
    model.save_pretrained(tmp_path)
    cls = getattr(transformers, f"{ROTARY[name].removesuffix('Text')}ForCausalLM")
    back = hf.from_pretrained(cls, tmp_path, dtype=torch.bfloat16)
    layer = back.model.layers[0].self_attn.attn
    assert layer.q_norm.weight.dtype == torch.bfloat16
    torch.testing.assert_close(layer.q_norm.weight, model.model.layers[0].self_attn.attn.q_norm.weight.bfloat16())


def test_identity_norms_are_no_norms_and_other_norms_are_named():
    model = tiny("qwen3")
    attn = model.model.layers[0].self_attn
    attn.q_norm, attn.k_norm = torch.nn.Identity(), torch.nn.Identity()
    assert hf.convert(copy.deepcopy(model), "softmax", (0,)).model.layers[0].self_attn.attn.qk_norm is None
    attn.q_norm, attn.k_norm = torch.nn.RMSNorm(8), torch.nn.RMSNorm(8)  # eps None: the input dtype's
    with pytest.raises(ValueError, match=r"layer 0: self_attn.q_norm has no float epsilon"):
        hf.convert(copy.deepcopy(model), "softmax", (0,))
    attn.q_norm, attn.k_norm = torch.nn.RMSNorm(8, eps=1e-6), torch.nn.RMSNorm(8, eps=1e-6)
    assert hf.convert(model, "softmax", (0,)).model.layers[0].self_attn.attn.qk_norm == "head"


def test_soft_capped_logits_convert_to_softmax_and_are_said_dropped_elsewhere():
    """Gemma 2's cap (1.0 here, so that it bites) goes into softmax, sparse and hybrid layers; linear has none and
    says so."""
    model = tiny("gemma2")
    assert hf.convert(copy.deepcopy(model), "softmax", (0,)).model.layers[0].self_attn.attn.softcap == 1.0
    assert hf.convert(copy.deepcopy(model), "sparse", (0,), window=64).model.layers[0].self_attn.attn.softcap == 1.0
    with pytest.warns(UserWarning, match=r"layers \[0\]: attention 'linear' takes no logit cap"):
        hf.convert(copy.deepcopy(model), "linear", (0,))
    with pytest.raises(TypeError, match="option 'softcap' is set from the model being converted"):
        hf.convert(model, "softmax", softcap=30.0)


def test_the_norms_are_not_user_options_of_a_conversion():
    with pytest.raises(TypeError, match=r"option 'qk_norm' is set from the model being converted \(its q_norm"):
        hf.convert(tiny("llama"), "softmax", qk_norm="head")


def test_a_norm_that_is_not_an_rms_norm_is_refused():
    model = tiny("qwen3")
    model.model.layers[1].self_attn.q_norm = torch.nn.LayerNorm(8)
    with pytest.raises(ValueError, match=r"model type 'qwen3', layer 1: self_attn.q_norm is not an RMS norm"):
        hf.convert(copy.deepcopy(model), "softmax", "all")
    hf.convert(model, "softmax", (0,))  # the other layer converts
    model = tiny("olmo2")
    model.model.layers[0].self_attn.k_norm = None
    with pytest.raises(ValueError, match="layer 0: a norm on the queries or on the keys alone"):
        hf.convert(model, "softmax", (0,))


@pytest.mark.parametrize("mech,options,message", [
    ("primal", {"scale": 0.3}, "option 'scale': attention 'primal' has no logit scale"),
    ("primal", {"attn_drop": 0.2}, "option 'attn_drop': attention 'primal' has no attention weights to drop"),
])  # fmt: skip
def test_an_option_the_mechanism_cannot_take_is_named(mech, options, message):
    with pytest.raises(TypeError, match=message):
        hf.convert(tiny("llama"), mech, (-1,), s=4, **options)


def test_the_users_scale_replaces_the_models():
    model = tiny("llama")
    conv = hf.convert(copy.deepcopy(model), "softmax", "all", scale=0.05)
    assert conv.model.layers[0].self_attn.attn.scale == 0.05
    ids, mask = left_padded()
    assert (real_logits(conv, ids, mask) - real_logits(model, ids, mask)).abs().max() > 1e-4


@pytest.mark.parametrize("name,overrides", [("gpt_neox", {}), ("gpt_neox", {"attention_bias": False}),
                                            ("gpt_neox", {"rotary_pct": 0.0, "use_parallel_residual": False}),
                                            ("phi3", {"partial_rotary_factor": 0.5})])  # fmt: skip
def test_partial_rotary_converts_faithfully(name, overrides):
    """GPT-NeoX / Pythia (per-head fused q / k / v, a quarter of each head rotated, the cache as layer_past) and
    Phi-4-mini's partial rotary: softmax gives the original's logits and greedy generation with the cache; a primal
    last layer decodes with its state."""
    model = tiny(name, **overrides)
    ids, mask = left_padded()
    conv = hf.convert(copy.deepcopy(model), "softmax", "all")
    torch.testing.assert_close(real_logits(conv, ids, mask), real_logits(model, ids, mask), rtol=0, atol=1e-5)
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=1)
    assert torch.equal(conv.generate(ids, **kw), model.generate(ids, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # primal takes no rotary tables (tested above)
        conv = hf.convert(copy.deepcopy(model), "primal", (-1,), s=4)
    assert torch.equal(conv.generate(ids, **kw), greedy(conv, ids, mask, 4))


def test_opt_converts_faithfully():
    """OPT (learned positions, biases everywhere, q scaled before the product): softmax in every layer gives its
    logits and its generation; a primal last layer decodes with its state."""
    model = tiny("opt")
    ids, mask = left_padded()
    conv = hf.convert(copy.deepcopy(model), "softmax", "all")
    torch.testing.assert_close(real_logits(conv, ids, mask), real_logits(model, ids, mask), rtol=0, atol=1e-5)
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=1)
    assert torch.equal(conv.generate(ids, **kw), model.generate(ids, **kw))
    conv = hf.convert(copy.deepcopy(model), "primal", (-1,), s=4)
    assert torch.equal(conv.generate(ids, **kw), greedy(conv, ids, mask, 5))


def test_a_refusal_names_the_layers_that_do_convert():
    """A model some of whose layers cannot be converted: the error for "all" lists the ones that can."""
    model = tiny("llama", num_hidden_layers=3)
    model.model.layers[1].self_attn.is_causal = False  # one bidirectional layer in a causal decoder
    with pytest.raises(ValueError, match=r"layer 1: a bidirectional decoder .*; the layers of this model that "
                                         r"convert: \[0, 2\]$"):  # fmt: skip
        hf.convert(model, "softmax", "all")
    assert hf.convert(model, "softmax", [0, 2]).model.layers[2].self_attn.attn.causal
