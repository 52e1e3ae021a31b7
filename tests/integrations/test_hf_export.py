"""primaldual.integrations.hf.export: a primaldual CausalLM as a transformers model (Auto classes, save /
from_pretrained, generate through the model's own decoding state). The ``primaldual export`` command on a trained
run is tested in tests/train/test_lm.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
hf = pytest.importorskip("primaldual.integrations.hf")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from primaldual.attention.primal import PrimalState  # noqa: E402
from primaldual.models import CausalLM  # noqa: E402

MODELS = {
    "softmax": {"attention": "softmax"},
    "primal": {"attention": ["softmax", "primal"], "attention_options": [None, {"s": 4}]},
    "primalformer_sinusoidal": {"attention": "primal", "attention_options": {"s": 3}, "positions": "sinusoidal"},
}


def _model(name: str) -> hf.PrimalDualForCausalLM:
    torch.manual_seed(0)
    cfg = hf.PrimalDualLMConfig(vocab_size=50, max_len=32, dim=16, depth=2, num_heads=2, ffn_dim=32, **MODELS[name])
    return hf.PrimalDualForCausalLM(cfg).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0  # left padding, as HF tokenizers pad for generation
    return ids, mask


@pytest.mark.parametrize("name", sorted(MODELS))
def test_save_and_auto_load_give_the_same_logits_and_greedy_generate_equals_ours(tmp_path, name):
    model = _model(name)
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "primaldual_lm"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is hf.PrimalDualForCausalLM
    ids, mask = _batch()
    with torch.no_grad():
        ref = model.model(ids, mask.bool())
        got = loaded(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    ours, ours_mask = model.model.generate(ids, mask.bool(), max_new_tokens=6, temperature=0)
    theirs = loaded.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(theirs[:, 7:], ours[:, 7:])  # (ours left-aligns the prompts: compare the continuations)


def test_generate_decodes_through_the_constant_size_state(monkeypatch):
    """After the prompt's one forward (prefill), every new token is one CausalLM.step on the cached state."""
    model = _model("primal")
    calls = {"prefill": 0, "step": 0}
    seen_states = []
    prefill, step = CausalLM.prefill, CausalLM.step

    def count_prefill(self, *a, **k):
        calls["prefill"] += 1
        return prefill(self, *a, **k)

    def count_step(self, ids_t, state, *a, **k):
        calls["step"] += 1
        seen_states.append(state.layers[1])
        return step(self, ids_t, state, *a, **k)

    monkeypatch.setattr(CausalLM, "prefill", count_prefill)
    monkeypatch.setattr(CausalLM, "step", count_step)
    ids, mask = _batch()
    model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert calls == {"prefill": 1, "step": 4}  # the 5th token needs no forward after it
    assert all(isinstance(s, PrimalState) for s in seen_states)
    sizes = {tuple(t.shape) for s in seen_states for t in s if isinstance(t, torch.Tensor)}
    assert len(sizes) == len({tuple(t.shape) for t in seen_states[0] if isinstance(t, torch.Tensor)})  # no growth


def test_labels_give_the_next_token_loss_and_bad_arguments_are_named():
    model = _model("softmax")
    ids, mask = _batch()
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    logits = model.model(ids, mask.bool())
    target = ids[:, 1:].masked_fill(~mask[:, 1:].bool(), -100)
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.loss, ref)
    with pytest.raises(TypeError, match="unexpected arguments \\['inputs_embeds'\\]"):
        model(input_ids=ids, inputs_embeds=torch.zeros(2, 7, 16))
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=ids, output_attentions=True)


def test_beam_search_and_sampling_run_on_the_state():
    model = _model("primal")
    ids, mask = _batch()
    beams = model.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=3, do_sample=False, pad_token_id=0)
    sampled = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True, top_k=5, pad_token_id=0)
    assert beams.shape == sampled.shape == (2, 11)


@pytest.mark.parametrize("order", ["primaldual first", "transformers first"])
def test_import_primaldual_registers_the_auto_classes_in_either_order(tmp_path, order):
    _model("softmax").save_pretrained(tmp_path)
    imports = ["import primaldual", "import transformers"]
    if order == "transformers first":
        imports.reverse()
    code = "; ".join(
        [
            *imports,
            f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})",
            "print(type(m).__name__)",
        ]
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("PrimalDualForCausalLM")
