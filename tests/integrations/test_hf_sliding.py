"""Sliding-window layers of Hugging Face models (Mistral, Qwen2, Phi-3, Gemma 2 and 3, OLMo 3): converted, with the
masks transformers builds for them checked, their window kept exactly where the mechanism can keep it, and their
cache entries replaced so that generation stays right for the layers left unconverted."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from .tiny_models import greedy, left_padded, real_logits, tiny, token_batch

pytest.importorskip("transformers")
hf = pytest.importorskip("primaldual.integrations.hf")

W = 4  # the tiny models' window: shorter than the test sequences, so that it bites

#: sliding-window variants of the tiny models: (model type, config overrides, the sliding layers)
SLIDING = {
    "mistral": ({"sliding_window": W}, [0, 1]),
    "phi3": ({"sliding_window": W}, [0, 1]),
    "qwen2": ({"use_sliding_window": True, "sliding_window": W, "max_window_layers": 1}, [1]),
    "gemma2": ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": W}, [0]),
    "gemma3_text": ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": W}, [0]),
    "olmo3": ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": W}, [0]),
}


def _generate(model, ids, mask, steps=8):
    return model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, pad_token_id=1)


@pytest.mark.parametrize("name", sorted(SLIDING))
def test_the_window_is_read_per_layer(name):
    overrides, sliding = SLIDING[name]
    from primaldual.integrations.hf.architectures import find_blocks, read_site

    model = tiny(name, **overrides)
    _, blocks = find_blocks(model)
    for i, block in enumerate(blocks):
        assert read_site(model, block, i).window == (W if i in sliding else None)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(SLIDING))
def test_a_window_kept_exactly_gives_the_original(name, impl):
    """Sparse softmax with the model's window in its sliding layers (and softmax in its full ones) gives the original's
    logits on a left-padded batch longer than the window, with each layer's mask checked (Gemma 2: capped logits)."""
    overrides, sliding = SLIDING[name]
    model = tiny(name, **overrides)
    if name == "gemma2" and impl == "sdpa":
        pytest.skip("transformers runs Gemma 2 in eager attention only")
    model.set_attn_implementation(impl)
    ids, mask = left_padded(10)
    ref = real_logits(model, ids, mask)
    conv = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf.convert(conv, "sparse", sliding, window=W - 1)
    full = [i for i in range(2) if i not in sliding]
    if full:
        hf.convert(conv, "softmax", full)
    torch.testing.assert_close(real_logits(conv, ids, mask), ref, rtol=0, atol=2e-5)


def test_a_window_not_kept_is_said():
    model = tiny("mistral", sliding_window=W)
    with pytest.warns(UserWarning, match=r"layers \[0, 1\]: the model's sliding window \(4 keys\) is not kept: "
                                         "attention 'softmax' also sees keys before it"):  # fmt: skip
        hf.convert(copy.deepcopy(model), "softmax", "all")
    for mech, opts in (("sparse", {"window": W}), ("hybrid", {"window": W, "sinks": 0}),
                       ("hybrid", {"window": W, "sinks": 1, "primal_branch": False})):  # fmt: skip
        with pytest.warns(UserWarning, match="is not kept"):
            hf.convert(copy.deepcopy(model), mech, "all", **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf.convert(copy.deepcopy(model), "hybrid", "all", window=W - 1, sinks=0, primal_branch=False)


def test_a_sliding_layer_refuses_a_mask_without_its_window():
    """The converted layer checks that the model's mask is padding, causality and its window, nothing else."""
    model = hf.convert(tiny("mistral", sliding_window=W), "sparse", (0,), window=W - 1)
    layer = model.model.layers[0].self_attn
    x = torch.randn(2, 8, 32)
    cos, sin = model.model.rotary_emb(x, torch.arange(8)[None].expand(2, 8))
    causal = torch.ones(8, 8, dtype=torch.bool).tril()[None, None].expand(2, 1, 8, 8)
    with pytest.raises(ValueError, match="structure other than padding and causality in a sliding window of 4 keys"):
        layer(x, attention_mask=causal, position_embeddings=(cos, sin))
    band = causal & ~torch.ones(8, 8, dtype=torch.bool).tril(-W)
    layer(x, attention_mask=band, position_embeddings=(cos, sin))


def test_window_masks_full_and_cut():
    """A sliding layer's 4-D mask covers every key, or, cut as a sliding cache reports its sizes, the last
    ``window - 1 + Nq``; the last ``Nq`` keys are this call's either way."""
    from primaldual.integrations.hf.masks import key_mask_from_hf

    seen, n = 7, 2
    total = seen + n
    pad = torch.ones(1, total, dtype=torch.bool)
    pad[0, 0] = False
    q = torch.arange(seen, total)[:, None]
    k = torch.arange(total)[None, :]
    full = (pad[:, None, :] & (k <= q) & (k > q - W))[:, None]  # (1, 1, Nq, Nk)
    got = key_mask_from_hf(full, batch=1, q_len=n, kv_len=total, causal=True, window=W)
    assert got is None or bool(got[:, -n:].all())
    cut = full[..., -(W - 1 + n) :]
    assert key_mask_from_hf(cut, batch=1, q_len=n, kv_len=total, causal=True, window=W) is None
    with pytest.raises(ValueError, match="structure other than"):
        key_mask_from_hf(full, batch=1, q_len=n, kv_len=total, causal=True, window=W + 1)
    with pytest.raises(ValueError, match="window must be None or a positive int for a causal mask"):
        key_mask_from_hf(full, batch=1, q_len=n, kv_len=total, causal=False, window=W)


@pytest.mark.parametrize("layers", [(0,), (1,), (0, 1)])
def test_generation_with_some_sliding_layers_converted_equals_the_original(layers):
    """A window kept exactly decodes like the original with transformers' sliding cache: the converted entries
    report the sizes of the sliding entries they replace, so the layers left unconverted get the right masks."""
    model = tiny("gemma3_text", num_hidden_layers=3, layer_types=["sliding_attention"] * 2 + ["full_attention"],
                 sliding_window=W)  # fmt: skip
    conv = hf.convert(copy.deepcopy(model), "hybrid", layers, window=W, sinks=0, primal_branch=False)
    ids, mask = left_padded(6)
    got = conv.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=1,
                        return_dict_in_generate=True)  # fmt: skip
    assert torch.equal(got.sequences, _generate(model, ids, mask))
    entries = got.past_key_values.layers
    for i in layers:
        assert isinstance(entries[i], hf.SlidingStateCacheLayer) and entries[i].is_sliding
        assert entries[i].get_mask_sizes(1) == entries[1 - i if len(layers) == 1 else 0].get_mask_sizes(1)


@pytest.mark.parametrize(
    "mech,opts",
    [("primal", {"s": 4}), ("hybrid", {"window": 3, "sinks": 1, "s": 4, "gate_init": 0.5}), ("softmax_bn", {})],
)
def test_converted_sliding_layers_generate_like_greedy_full_forwards(mech, opts):
    """Mechanisms that see past the window (primal, hybrid with sinks and a branch) and one that recomputes over
    its inputs (the SVR family: its entry keeps every input and its padding, not the last window - 1) decode
    exactly as full forwards do."""
    model = tiny("mistral", sliding_window=W)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what the mechanism does without (RoPE, the window) is said; tested above
        conv = hf.convert(copy.deepcopy(model), mech, (0,), **opts)
    ids, mask = left_padded(6)
    out = conv.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=1,
                        return_dict_in_generate=True)  # fmt: skip
    assert torch.equal(out.sequences, greedy(conv, ids, mask, 8))
    entry = out.past_key_values.layers[0]
    kind = hf.SlidingInputsCacheLayer if mech == "softmax_bn" else hf.SlidingStateCacheLayer
    assert isinstance(entry, kind) and entry.get_seq_length() == 6 + 8 - 1


def test_save_pretrained_from_pretrained_keeps_the_window(tmp_path):
    import transformers

    model = hf.convert(tiny("gemma3_text", **SLIDING["gemma3_text"][0]), "sparse", (0,), window=W - 1)
    ids, mask = left_padded(10)
    ref = real_logits(model, ids, mask)
    model.save_pretrained(tmp_path)
    back = hf.from_pretrained(transformers.Gemma3ForCausalLM, tmp_path).eval()
    assert back.model.layers[0].self_attn.window == W
    torch.testing.assert_close(real_logits(back, ids, mask), ref, rtol=0, atol=0)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_padding_between_real_tokens_is_refused_for_a_sliding_layer(impl):
    """Transformers' window counts padding positions, a converted one real tokens: they agree for left and right
    padding (converted above), and padding inside a sequence is refused rather than computed differently."""
    model = tiny("mistral", sliding_window=W)
    model.set_attn_implementation(impl)
    conv = hf.convert(copy.deepcopy(model), "sparse", "all", window=W - 1)
    ids, _ = token_batch(pad_from=None, length=10)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # right padding: fine
    torch.testing.assert_close(real_logits(conv, ids, mask), real_logits(model, ids, mask), rtol=0, atol=2e-5)
    mask[1, 4:6] = 0  # two padded tokens inside the second sequence
    with pytest.raises(ValueError, match=r"padding between real tokens \(row 1\) for a sliding-window layer"):
        real_logits(conv, ids, mask)
