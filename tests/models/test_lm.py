"""The decoder-only LM: incremental decoding equals the full causal forward, generate() equals greedy re-forwarding."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.models import CausalLM
from tests.conftest import rel_err

V, DIM, HEADS, DEPTH, MAXLEN = 37, 12, 3, 2, 40
CAUSAL = [i.name for i in pd.list_attentions() if i.capabilities.causal]
OPTIONS = {
    "primal": {"s": 3, "ksvd_reduction": "sample"},
    "sparse": {"window": 3},
    "hybrid": {"window": 3, "sinks": 1, "s": 2, "gate_init": 0.7},
}


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


@pytest.mark.parametrize(
    "attention", ["softmax", "primal", "linear", "sparse", "softmax_bn", "hybrid", ["softmax", "primal"]]
)
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


# ---- prefill: the prompt in one forward, the state that stepping through it would leave --------------------------
PREFILL_VARIANTS = {  # option sets beyond OPTIONS, so that every decoding path is covered
    "sparse": [{"window": 3}, {"window": 2, "num_global": 2}, {"window": 2, "stride": 3, "num_global": 1}],
    "softmax_sh": [{}, {"factors": [3, 1, 2], "pooling": "stride"}],
    "primal": [OPTIONS["primal"], {"s": 3, "padding": "reference"}],
    "hybrid": [OPTIONS["hybrid"], {"window": 2, "sinks": 0, "primal_branch": False}],
}
PREFILL_CASES = [
    pytest.param(name, opts, id=f"{name}-{opts}")
    for name in CAUSAL
    for opts in PREFILL_VARIANTS.get(name, [OPTIONS.get(name)])
]


def _mixed_prompts(B: int = 8, N: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts with 0 ... 7 pads (row b has b % 8), pads not multiples of any pooling factor."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, V, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.bool)
    for b in range(B):
        mask[b, : b % 8] = False
    return ids, mask


def _model_with(name: str, opts: dict | None) -> CausalLM:
    torch.manual_seed(0)
    model = CausalLM(
        V, MAXLEN, dim=DIM, depth=DEPTH, num_heads=HEADS, ffn_dim=24, attention=name, attention_options=opts
    )
    return model.to(torch.float64).eval()


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("name,opts", PREFILL_CASES)
def test_prefill_logits_equal_forward_and_state_continues_like_stepping(name, opts, device):
    model = _model_with(name, opts).to(device)
    ids, mask = (t.to(device) for t in _mixed_prompts())
    B, N = ids.shape
    with torch.no_grad():
        logits, state = model.prefill(ids, mask)
        assert logits.shape == (B, N, V) and rel_err(logits, model(ids, mask)) < 1e-10
        stepped = model.init_state(B)
        for t in range(N):
            last, stepped = model.step(ids[:, t], stepped, mask[:, t])
        assert rel_err(logits[:, -1], last) < 1e-10
        if all(getattr(b.attn, "padding_invariant", True) for b in model.decoder.blocks):
            right = torch.sort(mask.long(), dim=1, descending=True, stable=True).indices  # (B, N): right-padded
            last_logits, _ = model.prefill(ids.gather(1, right), mask.gather(1, right), last_only=True)
            assert rel_err(last_logits, last) < 1e-10  # each prompt's next-token logits, wherever it ends
        assert torch.equal(state.count, stepped.count)
        nxt = logits[:, -1].argmax(-1)
        for t in range(5):  # continue both states with the same tokens
            alive = torch.ones(B, dtype=torch.bool, device=device)
            alive[1] = t != 2  # a padded token while decoding
            a, state = model.step(nxt, state, alive)
            b, stepped = model.step(nxt, stepped, alive)
            assert rel_err(a, b) < 1e-10, f"step {t}"
            nxt = a.argmax(-1)


def _generate_by_stepping(model: CausalLM, ids: torch.Tensor, mask: torch.Tensor, new: int) -> torch.Tensor:
    """The greedy generation loop before prefill existed: the (left-aligned) prompt token by token through step."""
    order = torch.sort(mask.int(), dim=1, stable=True).indices
    ids, mask = ids.gather(1, order), mask.gather(1, order)
    state = model.init_state(ids.shape[0])
    for t in range(ids.shape[1]):
        logits, state = model.step(ids[:, t], state, mask[:, t])
    out = [ids]
    for _ in range(new):
        nxt = logits.argmax(-1)
        out.append(nxt[:, None])
        logits, state = model.step(nxt, state)
    return torch.cat(out, 1)


@pytest.mark.parametrize("name,opts", PREFILL_CASES)
def test_greedy_generate_is_unchanged_by_prefill(name, opts):
    model = _model_with(name, opts)
    ids, mask = _mixed_prompts()
    mask[2] = mask[2].flip(0)  # one right-padded prompt: generate left-aligns it
    with torch.no_grad():
        expected = _generate_by_stepping(model, ids, mask, 6)
    out, _ = model.generate(ids, mask, max_new_tokens=6, temperature=0.0)
    assert torch.equal(out, expected)


def test_prefill_refuses_bad_masks():
    model = _model("softmax")
    ids, mask = _prompts()
    with pytest.raises(ValueError, match="mask must be a torch.bool tensor of shape"):
        model.prefill(ids, mask.long())
    with pytest.raises(ValueError, match="mask must be a torch.bool tensor of shape"):
        model.prefill(ids, mask[:, 1:])
    bad = mask.clone()
    bad[1] = False
    with pytest.raises(ValueError, match="at least one real token"):
        model.prefill(ids, bad)
    with pytest.raises(TypeError, match="int64"):
        model.prefill(ids.float(), mask)


def test_hybrid_decoding_state_is_independent_of_the_context():
    """A hybrid LM's state after 20 and after 200 tokens has the same size (window + sinks slots and the sums)."""
    model = (
        CausalLM(
            V,
            256,
            dim=DIM,
            depth=2,
            num_heads=HEADS,
            ffn_dim=24,
            attention="hybrid",
            attention_options={"window": 4, "sinks": 2, "s": 2, "gate_init": 0.5},
        )
        .double()
        .eval()
    )

    def size(n: int) -> int:
        ids = torch.randint(0, V, (2, n), generator=torch.Generator().manual_seed(n))
        _, state = model.prefill(ids)
        for _ in range(40):  # decoding keeps it bounded too
            _, state = model.step(torch.zeros(2, dtype=torch.long), state)
        return sum(s.window.length * s.window.k_buf.shape[-1] + s.primal.sum_q.numel() for s in state.layers)

    assert size(20) == size(200)


def test_generate_refuses_non_finite_logits_and_tiny_temperatures_are_greedy():
    from primaldual.models.lm import GREEDY_BELOW

    model = _model("softmax")
    ids, mask = _prompts()
    greedy, _ = model.generate(ids, mask, max_new_tokens=4, temperature=0.0)
    for t in (1e-50, 5e-324, GREEDY_BELOW / 2):
        out, _ = model.generate(ids, mask, max_new_tokens=4, temperature=t, seed=0)
        assert torch.equal(out, greedy), t
    with torch.no_grad():
        model.decoder.blocks[0].ffn.net[0].weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="logits hold NaN or Inf"):
        model.generate(ids, mask, max_new_tokens=2, temperature=0.0)


def test_gpt2_initialisation_draws_the_scheme_and_keeps_the_primal_parameters():
    from primaldual.models import CausalLM

    torch.manual_seed(0)
    kw = dict(dim=64, depth=4, num_heads=4, ffn_dim=128, attention=["softmax"] * 3 + ["primal"])
    ref = CausalLM(100, 32, **kw)
    torch.manual_seed(0)
    m = CausalLM(100, 32, **kw, init="gpt2")
    assert abs(m.embed.weight.std().item() - 0.02) < 2e-3
    assert abs(m.decoder.blocks[0].ffn.net[0].weight.std().item() - 0.02) < 2e-3
    assert abs(m.decoder.blocks[0].attn.proj.weight.std().item() - 0.02 / 8**0.5) < 1e-3  # residual: 0.02/sqrt(2L)
    assert abs(m.decoder.blocks[0].ffn.net[3].weight.std().item() - 0.02 / 8**0.5) < 1e-3
    primal = [n for n, _ in m.named_parameters() if n.endswith(("w_e", "w_r", "lam"))]
    assert primal and all(  # the primal layer's own initialisation is kept
        p.std().item() == pytest.approx(dict(ref.named_parameters())[n].std().item(), rel=0.3)
        for n, p in m.named_parameters()
        if n in primal
    )
    with pytest.raises(ValueError, match="init"):
        CausalLM(100, 32, dim=16, depth=1, num_heads=2, ffn_dim=16, init="xavier")
