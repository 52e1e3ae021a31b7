"""The decoder-only LM: incremental decoding equals the full causal forward, generate() equals greedy re-forwarding."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.models import CausalLM
from tests.conftest import rel_err

V, DIM, HEADS, DEPTH, MAXLEN = 37, 12, 3, 2, 40
CAUSAL = [i.name for i in pd.list_attentions() if i.capabilities.causal]
OPTIONS = {"primal": {"s": 3, "ksvd_reduction": "sample"}, "sparse": {"window": 3}}


def _model(attention, dtype=torch.float64) -> CausalLM:
    torch.manual_seed(0)
    names = attention if isinstance(attention, list) else [attention] * DEPTH
    opts = [OPTIONS.get(n) for n in names]
    model = CausalLM(
        V, MAXLEN, dim=DIM, depth=len(names), num_heads=HEADS, ffn_dim=24, attention=names, attention_options=opts
    )
    return model.to(dtype).eval()


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, :4] = False  # left-padded prompts of different lengths
    mask[2, :7] = False
    return ids, mask


@pytest.mark.parametrize("attention", [*CAUSAL, ["softmax", "primal"]])
def test_incremental_logits_equal_full_forward(attention):
    model = _model(attention)
    ids, mask = _prompts()
    full = model(ids, mask)  # (B, N, V)
    state = model.init_state(ids.shape[0])
    for t in range(ids.shape[1]):
        logits, state = model.step(ids[:, t], state, mask[:, t])
        assert rel_err(logits, full[:, t]) < 1e-10, f"position {t}"


def test_left_padding_does_not_change_a_prompt_for_padding_exact_attention():
    model = _model(["softmax", "primal"])
    ids, mask = _prompts()
    alone = model(ids[2:, 7:])  # the 2-token prompt without padding
    assert rel_err(model(ids, mask)[2, 7:], alone[0]) < 1e-10


@pytest.mark.parametrize("attention", ["softmax", "primal", "linear", "sparse", "softmax_bn", ["softmax", "primal"]])
def test_greedy_generate_equals_repeated_full_forwards(attention):
    model = _model(attention)
    ids, mask = _prompts()
    out, out_mask = model.generate(ids, mask, max_new_tokens=6, temperature=0.0)
    assert out.shape == (3, 15) and out_mask[:, 9:].all()
    seq, m = ids, mask
    for _ in range(6):
        nxt = model(seq, m)[:, -1].argmax(-1)
        seq, m = torch.cat([seq, nxt[:, None]], 1), torch.cat([m, torch.ones(3, 1, dtype=torch.bool)], 1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("attention", CAUSAL)
def test_generate_of_a_mixed_batch_equals_each_prompt_alone(attention):
    """Left-aligning prompts of different lengths (2, 5, 9 tokens: pads that are not multiples of the SH pooling
    factors) must not change any sequence's greedy continuation."""
    model = _model(attention)
    ids, mask = _prompts()
    out, out_mask = model.generate(ids, mask, max_new_tokens=6, temperature=0.0)
    logits = model(out, out_mask)  # (B, 15, V): greedy tokens can hide a logit difference, so compare these too
    for b in range(ids.shape[0]):
        alone, _ = model.generate(ids[b][mask[b]][None], max_new_tokens=6, temperature=0.0)  # (1, len + 6)
        assert torch.equal(out[b, 9:], alone[0, -6:]), f"prompt {b}"
        assert rel_err(logits[b, out_mask[b]], model(alone)[0]) < 1e-10, f"prompt {b}"


def test_right_padded_prompts_are_left_aligned_and_sampling_is_seeded():
    model = _model("softmax")
    ids, mask = _prompts()
    # the same prompts, right-padded
    right_ids = torch.stack([torch.cat([r[m], r[~m]]) for r, m in zip(ids, mask)])
    right_mask = torch.stack([torch.cat([m[m], m[~m]]) for m in mask])
    a = model.generate(ids, mask, 5, temperature=0.0)[0]
    b = model.generate(right_ids, right_mask, 5, temperature=0.0)[0]
    assert torch.equal(a[:, 9:], b[:, 9:])
    s1 = model.generate(ids, mask, 5, temperature=1.0, top_k=5, seed=3)[0]
    s2 = model.generate(ids, mask, 5, temperature=1.0, top_k=5, seed=3)[0]
    assert torch.equal(s1, s2)


def test_eos_stops_a_sequence():
    model = _model("softmax")
    ids, mask = _prompts()
    first = model.generate(ids, mask, 1, temperature=0.0)[0][:, -1]
    out, out_mask = model.generate(ids, mask, 4, temperature=0.0, eos_id=int(first[0]))
    assert out_mask[0, 9] and not out_mask[0, 10:].any() and (out[0, 10:] == first[0]).all()


def test_primal_last_layer_ksvd_term_reaches_its_parameters():
    model = _model(["softmax", "primal"], dtype=torch.float32).train()
    ids, mask = _prompts()
    logits = model(ids, mask)
    aux = pd.collect_aux_loss(model)
    (torch.nn.functional.cross_entropy(logits.reshape(-1, V), ids.reshape(-1)) + aux).backward()
    attn = model.decoder.blocks[-1].attn
    for p in (attn.w_e, attn.w_r, attn.lam):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_bad_input_is_refused_clearly():
    model = _model("softmax")
    ids, mask = _prompts()
    with pytest.raises(ValueError, match="max_len"):
        model.generate(ids, mask, MAXLEN)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(ids, mask, -1)
    with pytest.raises(ValueError, match="ids must hold ids"):
        model(ids + V)
    with pytest.raises(ValueError, match="at least one real token"):
        model.generate(ids, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="causal"):
        CausalLM(V, MAXLEN, dim=DIM, depth=1, num_heads=HEADS, attention="linear_bn")


def test_docs_snippet_runs():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "language_modelling.md").read_text()
    code = re.findall(r"```python\n(.*?)```", doc, re.S)[0]  # the model section's snippet
    scope: dict = {}
    exec(compile(code, "docs/language_modelling.md", "exec"), scope)
    assert scope["out_ids"].shape == (2, 80) and torch.isfinite(scope["ksvd"])
