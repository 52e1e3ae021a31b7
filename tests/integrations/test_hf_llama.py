"""primaldual.integrations.hf.convert on Llama: grouped K / V heads, rotary embeddings, the cache, save and load."""

from __future__ import annotations

import copy

import pytest
import torch

from .tiny_models import tiny, token_batch

pytest.importorskip("transformers")
hf = pytest.importorskip("primaldual.integrations.hf")


def _left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    ids, _ = token_batch(pad_from=None, length=8)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ids[1, :3] = 1
    return ids, mask


def _logits(model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits[mask.bool()]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("mech,opts", [("softmax", {}), ("sparse", {"window": 64})])
def test_softmax_path_reproduces_the_original(impl, mech, opts):
    """Every layer converted to softmax (or a covering window) gives the original's logits, left padding included:
    the grouped K / V heads are repeated in transformers' order and RoPE reaches q and k."""
    model = tiny("llama")
    model.set_attn_implementation(impl)
    ids, mask = _left_padded()
    ref = _logits(model, ids, mask)
    conv = hf.convert(copy.deepcopy(model), mech, "all", **opts)
    assert len(hf.converted_layers(conv)) == 2
    torch.testing.assert_close(_logits(conv, ids, mask), ref, rtol=0, atol=1e-5)


def test_softmax_conversion_generates_like_the_original_with_the_cache():
    model = tiny("llama")
    conv = hf.convert(copy.deepcopy(model), "softmax", "all")
    ids, mask = _left_padded()
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=1)
    assert torch.equal(conv.generate(ids, **kw), model.generate(ids, **kw))


def _greedy(model, ids, mask, steps):
    seq = ids
    with torch.no_grad():
        for _ in range(steps):
            pos = (mask.cumsum(-1) - 1).clamp_min(0)
            nxt = model(seq, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1].argmax(-1, True)
            seq, mask = torch.cat([seq, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
    return seq


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
    ids, mask = _left_padded()
    got = conv.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=1)
    assert torch.equal(got, _greedy(conv, ids, mask, 5))


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
    ids, mask = _left_padded()
    ref = _logits(conv, ids, mask)
    conv.save_pretrained(tmp_path)
    import transformers

    with pytest.warns(UserWarning, match="takes no rotary position embeddings"):
        back = hf.from_pretrained(transformers.LlamaForCausalLM, tmp_path).eval()
    torch.testing.assert_close(_logits(back, ids, mask), ref, rtol=0, atol=0)


def test_hybrid_decodes_from_a_bounded_state_in_the_cache():
    """The converted hybrid keeps its own state (window cache + primal sums) in the model's cache: it does not grow
    with the generated length."""
    model = hf.convert(tiny("llama"), "hybrid", "all", window=4, sinks=1, s=4, gate_init=0.5)
    ids, mask = _left_padded()
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
                       _greedy(model, ids, mask, 4))  # fmt: skip
