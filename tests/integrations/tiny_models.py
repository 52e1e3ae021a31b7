"""Tiny randomly initialised Hugging Face models (no downloads) for the integration tests."""

from __future__ import annotations

import pytest
import torch


def transformers_before(release: tuple[int, int]) -> bool:
    """Whether the installed transformers is older than ``release`` (False without transformers)."""
    try:
        import transformers
    except ImportError:
        return False
    return tuple(int(x) for x in transformers.__version__.split(".")[:2]) < release


#: DINOv2 has ViT's q_proj / k_proj / v_proj / o_proj layout from transformers 5.18 (before: refused by name)
DINOV2_LAYOUT = pytest.mark.skipif(transformers_before((5, 18)), reason="DINOv2's layout before transformers 5.18")


def tiny(name: str, **overrides):
    """A tiny, randomly initialised, eval-mode model: ``gpt2``, one of :data:`BERT_LIKE`, ``distilbert``, ``vit``,
    ``deit``, ``dinov2``, ``dt``, ``opt``, or one of :data:`ROTARY` (``llama`` and the others of its layout: 4 query
    heads on 2 key / value heads, RoPE)."""
    tr = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "gpt2":
        kw = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=64, bos_token_id=0, eos_token_id=0)
        cfg = tr.GPT2Config(**{**kw, "pad_token_id": 0, **overrides})
        return tr.GPT2LMHeadModel(cfg).eval()
    if name in BERT_LIKE:
        prefix = BERT_LIKE[name]
        kw = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=50)
        kw.update(max_position_embeddings=64, pad_token_id=1, **({"embedding_size": 16} if name == "electra" else {}))
        cfg = getattr(tr, f"{prefix}Config")(**{**kw, **overrides})
        return getattr(tr, f"{prefix}Model")(cfg).eval()
    if name == "distilbert":
        kw = dict(n_layers=2, dim=32, n_heads=2, hidden_dim=64, vocab_size=50, max_position_embeddings=64)
        return tr.DistilBertModel(tr.DistilBertConfig(**{**kw, "pad_token_id": 1, **overrides})).eval()
    if name in ("vit", "deit", "dinov2"):
        prefix = {"vit": "ViT", "deit": "DeiT", "dinov2": "Dinov2"}[name]
        kw = dict(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2)
        kw.update(num_attention_heads=2, **({"mlp_ratio": 2} if name == "dinov2" else {"intermediate_size": 64}))
        cfg = getattr(tr, f"{prefix}Config")(**{**kw, **overrides})
        return getattr(tr, f"{prefix}Model")(cfg).eval()
    if name in ("clip_vision", "siglip_vision"):
        kw = dict(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2)
        prefix = {"clip_vision": "CLIPVision", "siglip_vision": "SiglipVision"}[name]
        cfg = getattr(tr, f"{prefix}Config")(**{**kw, "num_attention_heads": 2, "intermediate_size": 64, **overrides})
        return getattr(tr, f"{prefix}Model")(cfg).eval()
    if name == "clip_text":  # eos_token_id 49: the position it pools (the legacy id 2 would pool at the argmax id)
        kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=50)
        kw.update(max_position_embeddings=16, pad_token_id=1, bos_token_id=0, eos_token_id=49)
        return tr.CLIPTextModel(tr.CLIPTextConfig(**{**kw, **overrides})).eval()
    if name == "siglip_text":
        kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=50)
        kw.update(max_position_embeddings=16, pad_token_id=1, bos_token_id=0, eos_token_id=0)
        return tr.SiglipTextModel(tr.SiglipTextConfig(**{**kw, **overrides})).eval()
    if name == "dt":
        kw = dict(state_dim=3, act_dim=2, hidden_size=32, n_layer=2, n_head=2, max_ep_len=20, n_positions=64)
        cfg = tr.DecisionTransformerConfig(**{**kw, **overrides})
        return tr.DecisionTransformerModel(cfg).eval()
    if name == "gpt_neox":  # Pythia's layout: per-head fused q / k / v, partial rotary (a quarter of each head)
        kw = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=50, num_hidden_layers=2)
        kw.update(max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=0, rotary_pct=0.25)
        return tr.GPTNeoXForCausalLM(tr.GPTNeoXConfig(**{**kw, **overrides})).eval()
    if name == "opt":
        kw = dict(hidden_size=32, num_attention_heads=4, ffn_dim=64, vocab_size=50, num_hidden_layers=2)
        cfg = tr.OPTConfig(**{**kw, "max_position_embeddings": 64, "word_embed_proj_dim": 32, "pad_token_id": 1,
                              "bos_token_id": 0, "eos_token_id": 0, **overrides})  # fmt: skip
        return tr.OPTForCausalLM(cfg).eval()
    if name in ROTARY:
        prefix = ROTARY[name]
        kw = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=50)
        kw.update(num_hidden_layers=2, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=0)
        if name in ("mistral", "qwen2", "smollm3"):
            kw["sliding_window"] = None  # (Mistral's default is 4096)
        if name == "qwen2":
            kw["use_sliding_window"] = False
        if name == "smollm3":
            kw["no_rope_layers"] = [1, 0]  # layer 1 takes no rotary tables (NoPE)
        if name in ("qwen3", "qwen3_moe", "gemma3_text", "gemma2"):
            kw["head_dim"] = 8  # (defaults 128, 256)
        if name == "gemma2":
            kw["attn_logit_softcapping"] = 1.0  # (50 by default: a cap that tiny random logits never reach)
        if name in ("olmo3", "gemma3_text", "gemma2"):
            kw["layer_types"] = ["full_attention"] * 2  # (by default some layers use a sliding window)
        if name == "qwen3_moe":
            kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
        if name in ("stablelm", "phi"):
            kw["partial_rotary_factor"] = 0.5  # (StableLM's default 0.25 would rotate one pair of 8 channels)
        cfg = getattr(tr, f"{prefix}Config")(**{**kw, **overrides})
        model = getattr(tr, f"{prefix.removesuffix('Text')}ForCausalLM")(cfg).eval()
        with torch.no_grad():  # query / key gains away from their initial 1 (Gemma: 0), so that one left out shows
            for key, p in model.named_parameters():
                if key.endswith(("q_norm.weight", "k_norm.weight")):
                    p.add_(torch.rand(p.shape) - 0.5)
        return model
    raise ValueError(name)


#: the tiny encoders with BERT's attention layout, by model type: transformers' class prefix
BERT_LIKE = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "camembert": "Camembert",
    "electra": "Electra",
}

#: the tiny models with Llama's layout (grouped K / V heads, RoPE), by model type: transformers' class prefix
ROTARY = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "gemma": "Gemma",
    "granite": "Granite",
    "olmo": "Olmo",
    "smollm3": "SmolLM3",
    "phi3": "Phi3",
    # with query / key RMS norms: per head (Qwen3, Gemma 3, whose gain is 1 + w), over all heads (OLMo 2 and 3)
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3Moe",
    "olmo2": "Olmo2",
    "olmo3": "Olmo3",
    "gemma3_text": "Gemma3Text",
    # partial rotary: half of each head's channels rotate
    "stablelm": "StableLm",
    "phi": "Phi",
    # soft-capped logits
    "gemma2": "Gemma2",
}
#: the types among :data:`ROTARY` whose attention normalises queries and keys
QK_NORMED = ("qwen3", "qwen3_moe", "olmo2", "olmo3", "gemma3_text")


def token_batch(batch: int = 2, length: int = 9, pad_from: int | None = 6, vocab: int = 50):
    """``(input_ids, attention_mask)``: row 1 right-padded from ``pad_from`` (HF convention: 1 = keep)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad_from is not None:
        mask[1, pad_from:] = 0
        ids[1, pad_from:] = 1
    return ids, mask


def dt_inputs(batch: int = 2, steps: int = 5, pad_from: int | None = 3) -> dict:
    g = torch.Generator().manual_seed(2)
    mask = torch.ones(batch, steps, dtype=torch.long)
    if pad_from is not None:
        mask[1, pad_from:] = 0
    return {
        "states": torch.randn(batch, steps, 3, generator=g),
        "actions": torch.randn(batch, steps, 2, generator=g),
        "rewards": torch.randn(batch, steps, 1, generator=g),
        "returns_to_go": torch.randn(batch, steps, 1, generator=g),
        "timesteps": torch.arange(steps)[None].repeat(batch, 1),
        "attention_mask": mask,
    }


def left_padded(length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of two sequences of ``length``, the second left-padded by 3 (id 1)."""
    ids, _ = token_batch(pad_from=None, length=length)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ids[1, :3] = 1
    return ids, mask


def real_logits(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A causal LM's logits at the real tokens of ``mask``, without gradients."""
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits[mask.bool()]


def greedy(model, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding by full forwards without a cache (the reference cached ``generate`` must equal)."""
    seq = ids
    with torch.no_grad():
        for _ in range(steps):
            pos = (mask.cumsum(-1) - 1).clamp_min(0)
            nxt = model(seq, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1].argmax(-1, True)
            seq, mask = torch.cat([seq, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
    return seq
