"""primaldual.integrations.hf.convert: module swaps in GPT-2, the BERT-like encoders (BERT, RoBERTa, XLM-RoBERTa,
CamemBERT, ELECTRA, DistilBERT), the ViT-like ones (ViT, DeiT, DINOv2), CLIP's and SigLIP's vision towers and the
Decision Transformer."""

from __future__ import annotations

import copy

import pytest
import torch

import primaldual as pd

from .tiny_models import DINOV2_LAYOUT, dt_inputs, tiny, token_batch

pytest.importorskip("transformers")
hf = pytest.importorskip("primaldual.integrations.hf")

EXACT = [("softmax", {}), ("sparse", {"window": 64})]  # a window covering the sequence is softmax


def _outputs(name: str, model, padded: bool = True) -> torch.Tensor:
    """The model's main output at real positions, for a fixed batch."""
    with torch.no_grad():
        if name in ("vit", "deit", "dinov2", "clip_vision", "siglip_vision"):
            return model(torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))).last_hidden_state
        if name == "dt":
            inp = dt_inputs(pad_from=3 if padded else None)
            out = model(**inp)
            keep = inp["attention_mask"].bool()
            return torch.cat([out.action_preds[keep], out.state_preds[keep]], -1)
        ids, mask = token_batch(pad_from=6 if padded else None)
        out = model(ids, attention_mask=mask)
        y = out.logits if hasattr(out, "logits") else out.last_hidden_state
        return y[mask.bool()]


@pytest.mark.parametrize(
    "name,impl",  # eager passes additive float masks, sdpa bool masks (or None)
    [
        ("gpt2", "sdpa"),
        ("gpt2", "eager"),
        ("bert", "sdpa"),
        ("bert", "eager"),
        ("roberta", "sdpa"),
        ("xlm-roberta", "sdpa"),
        ("camembert", "eager"),
        ("electra", "sdpa"),
        ("distilbert", "sdpa"),
        ("distilbert", "eager"),
        ("vit", "sdpa"),
        ("deit", "sdpa"),
        pytest.param("dinov2", "eager", marks=DINOV2_LAYOUT),
        ("clip_vision", "sdpa"),
        ("siglip_vision", "eager"),
        ("dt", "eager"),
    ],
)
def test_every_layer_to_softmax_or_covering_sparse_reproduces_the_model(name, impl):
    model = tiny(name)
    model.set_attn_implementation(impl)
    ref = _outputs(name, model)
    for mech, opts in EXACT:
        conv = hf.convert(copy.deepcopy(model), mech, "all", **opts)
        assert len(hf.converted_layers(conv)) == 2
        assert torch.allclose(_outputs(name, conv), ref, atol=1e-5, rtol=0), (name, impl, mech)


def test_output_attentions_returns_the_converted_layers_weights():
    model = tiny("bert")
    model.set_attn_implementation("eager")
    ids, mask = token_batch()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, output_attentions=True).attentions
        conv = hf.convert(copy.deepcopy(model), "softmax", -1)
        got = conv(ids, attention_mask=mask, output_attentions=True).attentions
    assert len(got) == len(ref) == 2
    keep = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]  # rows and columns of real tokens
    assert torch.allclose(got[1] * keep, ref[1] * keep, atol=1e-6)
    gpt = hf.convert(tiny("gpt2"), "primal", -1, s=4)
    with torch.no_grad():
        att = gpt(ids, output_attentions=True).attentions
    assert att[-1].shape == (2, 2, 9, 9)  # the implicit kernel of the primal layer


# ------------------------------------------------------------------------------------------ GPT-2 with primal
@pytest.fixture
def primal_gpt2():
    return hf.convert(tiny("gpt2"), "primal", -1, s=4)


def test_primal_gpt2_has_no_causal_leakage(primal_gpt2):
    ids, _ = token_batch(pad_from=None)
    later = ids.clone()
    later[:, 5:] = torch.randint(2, 50, later[:, 5:].shape, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        a, b = primal_gpt2(ids).logits, primal_gpt2(later).logits
    assert torch.equal(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_primal_gpt2_ksvd_term_reaches_we_wr_and_lambda(primal_gpt2):
    primal_gpt2.train()
    ids, mask = token_batch()
    primal_gpt2(ids, attention_mask=mask)
    aux = pd.collect_aux_loss(primal_gpt2)
    assert aux is not None and aux.ndim == 0 and torch.isfinite(aux)
    aux.backward()
    layer = primal_gpt2.transformer.h[-1].attn.attn
    for p in (layer.w_e, layer.w_r, layer.lam):
        assert p.grad is not None and p.grad.abs().sum() > 0
    with torch.no_grad():  # nothing is recorded without gradients
        primal_gpt2(ids)
    assert pd.collect_aux_loss(primal_gpt2) is None


def _greedy(model, ids, steps, mask=None):
    seq = ids
    with torch.no_grad():
        for _ in range(steps):
            kw = {} if mask is None else {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp_min(0)}
            nxt = model(seq, use_cache=False, **kw).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(nxt)], 1)
    return seq


def test_primal_gpt2_generate_equals_greedy_full_forwards(primal_gpt2):
    ids, _ = token_batch(pad_from=None, length=6)
    out = primal_gpt2.generate(ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, _greedy(primal_gpt2, ids, 6))
    entry = out.past_key_values.layers[1]
    assert isinstance(entry, hf.PrimalCacheLayer) and entry.seen == 11
    assert entry.state.sum_q.shape == (2, 2, 16)  # constant size: (B, H, p)
    # left padding: the padded prompt's state skips its pads
    ids[1, :2], mask = 0, torch.ones_like(ids)
    mask[1, :2] = 0
    got = primal_gpt2.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, _greedy(primal_gpt2, ids, 4, mask))


def test_the_cache_is_read_under_the_keyword_resolved_from_the_signature(primal_gpt2):
    # transformers 5.24 renamed the attention's ``past_key_values`` argument to ``cache``: convert() reads the name
    import inspect

    from transformers.cache_utils import DynamicCache
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    params = inspect.signature(GPT2Attention.forward).parameters
    keyword = "cache" if "cache" in params else "past_key_values"
    layer = primal_gpt2.transformer.h[1].attn
    assert layer.cache_keyword == keyword
    x = torch.randn(2, 6, primal_gpt2.config.n_embd)  # (B, N, C)
    with torch.no_grad():
        full, _ = layer(x)
        cache = DynamicCache()
        head, _ = layer(x[:, :5], **{keyword: cache})
        last, _ = layer(x[:, 5:], **{keyword: cache})
    entry = cache.layers[1]
    assert isinstance(entry, hf.PrimalCacheLayer) and entry.seen == 6
    torch.testing.assert_close(torch.cat([head, last], 1), full, rtol=1e-5, atol=1e-6)
    other = next(k for k in hf.CACHE_KEYWORDS if k != keyword)
    with pytest.raises(TypeError, match=f"converted with cache keyword '{keyword}'.*'{other}'"):
        layer(x, **{other: DynamicCache()})  # another known keyword is an error, not ignored


def test_every_layer_primal_generates_and_softmax_conversion_generates_like_the_original():
    model = tiny("gpt2")
    ids, _ = token_batch(pad_from=None, length=5)
    every = hf.convert(copy.deepcopy(model), "primal", "all", s=4)
    assert torch.equal(every.generate(ids, max_new_tokens=4, do_sample=False), _greedy(every, ids, 4))
    soft = hf.convert(copy.deepcopy(model), "softmax", "all")
    assert torch.equal(
        soft.generate(ids, max_new_tokens=4, do_sample=False), model.generate(ids, max_new_tokens=4, do_sample=False)
    )


# ------------------------------------------------------------------------------------------ padding
@pytest.mark.parametrize("mech,opts", [("primal", {"s": 4}), ("softmax_bn", {}), ("softmax_sh", {})])
def test_bert_outputs_at_real_tokens_ignore_appended_padding(mech, opts):
    model = hf.convert(tiny("bert"), mech, "all", **opts)
    ids, mask = token_batch(pad_from=6)
    more_ids = torch.cat([ids, torch.ones(2, 5, dtype=ids.dtype)], 1)
    more_mask = torch.cat([mask, torch.zeros(2, 5, dtype=mask.dtype)], 1)
    with torch.no_grad():
        a = model(ids, attention_mask=mask).last_hidden_state
        b = model(more_ids, attention_mask=more_mask).last_hidden_state
    keep = mask.bool()
    assert torch.allclose(a[keep], b[:, :9][keep], atol=1e-5), mech


# ------------------------------------------------------------------------------------------ save / load
def test_state_dict_round_trip():
    a = hf.convert(tiny("gpt2"), "primal", -1, s=4)
    b = hf.convert(tiny("gpt2"), "primal", -1, s=4)
    with torch.no_grad():
        for p in b.parameters():
            p.normal_()
    b.load_state_dict(a.state_dict())
    ids, _ = token_batch()
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


def test_an_attention_frozen_whole_stays_frozen_where_its_weights_are_copied():
    model = tiny("gpt2")
    model.transformer.h[0].attn.requires_grad_(False)
    hf.convert(model, "primal", "all", s=4)
    frozen, trained = (model.transformer.h[i].attn.attn for i in (0, 1))
    assert not any(p.requires_grad for p in (*frozen.qk.parameters(), *frozen.proj.parameters()))
    assert frozen.w_e.requires_grad and trained.qk.weight.requires_grad


@pytest.mark.parametrize(
    "name,mech,opts",  # ViT's checkpoints use other key names than its modules: transformers renames them
    [
        ("gpt2", "primal", {"s": 4}),
        ("bert", "softmax_sh", {"factors": [1, 2]}),
        ("vit", "primal", {"s": 4}),
        ("distilbert", "primal", {"s": 4}),
        pytest.param("dinov2", "softmax_bn", {}, marks=DINOV2_LAYOUT),
        ("siglip_vision", "primal", {"s": 4}),
    ],
)
def test_save_pretrained_from_pretrained_round_trip(tmp_path, name, mech, opts):
    model = hf.convert(tiny(name), mech, -1, **opts)
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(type(model), tmp_path).eval()
    assert list(hf.converted_layers(loaded)) == list(hf.converted_layers(model))
    assert loaded.config.primaldual_conversions == model.config.primaldual_conversions
    assert torch.equal(_outputs(name, loaded), _outputs(name, model))


# ------------------------------------------------------------------------------------------ bad input
def test_bad_input_gives_one_clear_error():
    tr = pytest.importorskip("transformers")
    bloom = tr.BloomForCausalLM(tr.BloomConfig(hidden_size=16, n_layer=1, n_head=2, vocab_size=10))
    with pytest.raises(ValueError, match="unsupported architecture: model type 'bloom' .*: ALiBi position biases"):
        hf.convert(bloom, "primal")
    with pytest.raises(TypeError, match="PreTrainedModel"):
        hf.convert(torch.nn.Linear(2, 2), "primal")
    gpt = tiny("gpt2")
    with pytest.raises(IndexError, match="layer index 2 is out of range for a model with 2 layers"):
        hf.convert(gpt, "primal", layers=(2,))
    with pytest.raises(ValueError, match="'linear_bn' cannot be causal.*gpt2"):
        hf.convert(gpt, "linear_bn")
    with pytest.raises(KeyError, match="unknown attention"):
        hf.convert(gpt, "nope")
    assert not hf.converted_layers(gpt)  # nothing was touched by the failed calls
    hf.convert(gpt, "primal", -1, s=4)
    with pytest.raises(ValueError, match="already converted"):
        hf.convert(gpt, "softmax", -1)
    ids, mask = token_batch()
    bert = hf.convert(tiny("bert"), "softmax", -1)
    packed = torch.zeros(2, 1, 9, 9, dtype=torch.bool)  # two packed sequences: tokens 0-3 and 4-8
    packed[..., :4, :4] = packed[..., 4:, 4:] = True
    with pytest.raises(ValueError, match="structure other than padding"):
        bert(ids, attention_mask=packed)
    with pytest.raises(ValueError, match="is causal, but the primaldual layer .* non-causal"):
        bert(ids, attention_mask=torch.ones(2, 1, 9, 9, dtype=torch.bool).tril())


# ------------------------------------------------------------------------------------------ Trainer
def test_trainer_loss_includes_the_aux_loss(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import TrainingArguments

    model = hf.convert(tiny("gpt2"), "primal", -1, s=4)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no")
    trainer = hf.PrimalDualTrainer(model=model, args=args)
    ids, _ = token_batch(pad_from=None)
    batch = {"input_ids": ids, "labels": ids}
    task = model(**batch).loss
    aux = pd.collect_aux_loss(model)
    assert aux is not None
    assert torch.allclose(trainer.compute_loss(model, batch), task + aux, atol=1e-6)
    # a loss normalised over 2 accumulated micro-batches (token counts): the aux term is split the same way
    trainer.current_gradient_accumulation_steps = 2
    n = torch.tensor(ids[:, 1:].numel())
    loss = trainer.compute_loss(model, batch, num_items_in_batch=n)
    assert torch.allclose(loss, task + aux / 2, atol=1e-6)


def test_convert_records_on_the_models_own_config(tmp_path):
    """Two models built from one config object: converting one leaves the other (and its saved copy) unconverted."""
    tr = pytest.importorskip("transformers")
    cfg = tiny("gpt2").config
    a, b = tr.GPT2LMHeadModel(cfg).eval(), tr.GPT2LMHeadModel(cfg).eval()
    hf.convert(a, "softmax", layers=(-1,))
    assert a.config is not cfg and a.transformer.config is a.config  # every module of a points at a's copy
    assert getattr(b.config, "primaldual_conversions", None) is None and b.config is cfg
    b.save_pretrained(tmp_path / "b")
    again = hf.from_pretrained(tr.GPT2LMHeadModel, tmp_path / "b")
    assert not hf.converted_layers(again)


def test_an_older_dinov2_layout_is_refused_by_name():
    model = tiny("dinov2")
    for block in model.encoder.layer:  # the layout before transformers 5.18 (what an older release builds) has none
        if hasattr(block.attention, "q_proj"):
            del block.attention.q_proj
    with pytest.raises(ValueError, match=r"model type 'dinov2', layer 0: .*transformers>=5.18"):
        hf.convert(model, "softmax", (0,))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_clip_text_tower_converts_causal_and_pools_like_the_original(impl, tmp_path):
    """CLIP's text tower is causal through the mask it builds and never cached: softmax reproduces its hidden states
    and its pooled end-of-text embedding, padded or not; a primal last layer is causal; save and reload."""
    model = tiny("clip_text")
    model.set_attn_implementation(impl)
    ids, mask = token_batch(length=10, pad_from=7)
    ids[:, -1], ids[1, 6] = 49, 49  # the end-of-text token of each row (row 1 is padded after it)
    conv = hf.convert(copy.deepcopy(model), "softmax", "all")
    assert all(m.attn.causal for m in hf.converted_layers(conv).values())
    with torch.no_grad():
        for m in (None, mask):
            a, b = model(ids, attention_mask=m), conv(ids, attention_mask=m)
            keep = torch.ones_like(ids, dtype=torch.bool) if m is None else m.bool()
            torch.testing.assert_close(b.last_hidden_state[keep], a.last_hidden_state[keep], rtol=0, atol=1e-5)
            torch.testing.assert_close(b.pooler_output, a.pooler_output, rtol=0, atol=1e-5)
    primal = hf.convert(copy.deepcopy(model), "primal", (-1,), s=4)
    primal.save_pretrained(tmp_path)
    back = hf.from_pretrained(type(model), tmp_path).eval()  # (its unconverted layer: the default implementation)
    with torch.no_grad():
        a, b = back(ids, attention_mask=mask).pooler_output, primal(ids, attention_mask=mask).pooler_output
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_a_siglip_text_tower_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="'siglip_text_model' .*: it pools its last position"):
        hf.convert(tiny("siglip_text"), "softmax", "all")
