"""Hugging Face GPT-2 as a peer of our CausalLM in task ``lm`` (``model.kind: hf_gpt2``): it builds at our sizes
with GPT-2's parameter count, takes our mask convention, refuses options it has no use for, and trains end to end
through ``primaldual fit`` (a tiny corpus in tmp_path, a few updates)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from primaldual.train.config import ConfigError, load_config

from ..train.helpers import fit_cmd, history_rows, run
from ..train.test_lm import _lm_config, english_dir  # noqa: F401  (english_dir: a fixture)

pytest.importorskip("transformers")
peers = pytest.importorskip("primaldual.integrations.hf.peers")

SIZES = {"dim": 16, "depth": 2, "num_heads": 2, "ffn_dim": 40, "dropout": 0.1}


def _n(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("tie", [True, False])
def test_gpt2_peer_builds_at_our_sizes_with_gpt2s_parameter_count(tie):
    from primaldual.models import CausalLM

    m = peers.HFGPT2LM(300, 24, **SIZES, tie_embeddings=tie)
    c = m.model.config
    assert (c.n_embd, c.n_layer, c.n_head, c.n_inner, c.n_positions, c.vocab_size) == (16, 2, 2, 40, 24, 300)
    assert (c.resid_pdrop, c.embd_pdrop, c.attn_pdrop, c.tie_word_embeddings) == (0.1, 0.1, 0.1, tie)
    assert _n(m) == peers.gpt2_parameter_count(300, 24, 16, 2, 40, tie=tie)
    # our CausalLM with learned positions has exactly GPT-2's parameters (the same tensors, laid out differently)
    assert _n(CausalLM(300, 24, **SIZES, positions="learned", tie_embeddings=tie)) == _n(m)


def test_gpt2_peer_forward_masks_padding_and_numbers_positions_like_ours():
    torch.manual_seed(0)
    m = peers.HFGPT2LM(50, 12, **SIZES).eval()
    ids = torch.randint(0, 50, (2, 7))
    logits = m(ids)
    assert logits.shape == (2, 7, 50)
    # left padding: positions are the rank among real tokens, so the real tokens' logits do not move
    pad = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(2, 3, dtype=torch.bool), torch.ones(2, 7, dtype=torch.bool)], 1)
    torch.testing.assert_close(m(pad, mask)[:, 3:], logits, atol=1e-5, rtol=1e-5)
    # right padding (the LM task's last chunk): the real tokens' logits do not move either
    right = torch.cat([ids, torch.full((2, 2), 7)], 1)
    rmask = torch.cat([torch.ones(2, 7, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.bool)], 1)
    torch.testing.assert_close(m(right, rmask)[:, :7], logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="mask must be a torch.bool"):
        m(ids, torch.ones(2, 7))  # Hugging Face's 0 / 1 mask is refused, not guessed
    with pytest.raises(ValueError, match="max_len=12"):
        m(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids in \[0, 50\)"):
        m(torch.full((1, 3), 50))


def test_hf_gpt2_configs_sit_beside_each_transformer_config():
    for corpus in ("english", "wikitext103"):
        for budget in ("", "reduced/"):
            ours = load_config(f"lm/{corpus}/{budget}transformer")
            peer = load_config(f"lm/{corpus}/{budget}hf_gpt2")
            assert peer.model.kind == "hf_gpt2" and peer.model.positions == "learned"
            assert peer.name == ours.name.replace("transformer", "hf_gpt2")
            # everything but the model kind and its positions is the transformer's
            a, b = ours.to_dict(), peer.to_dict()
            for d in (a, b):
                d.pop("name")
                d["model"].pop("kind")
                d["model"].pop("positions")
            assert a == b


@pytest.mark.parametrize(
    "override, match",
    [
        (["--model.attention", "primal"], "model.attention: model.kind 'hf_gpt2' is Hugging Face's GPT2LMHeadModel"),
        (["--model.attention", "[softmax, softmax, softmax, primal]"], "own softmax attention"),
        (["--model.attention_options", "{backend: eager}"], "attention_options null"),
        (["--model.positions", "sinusoidal"], "model.positions: model.kind 'hf_gpt2'"),
        (["--model.norm_first", "false"], "model.norm_first"),
        (["--model.num_heads", "3"], "heads do not divide"),
    ],
)
def test_hf_gpt2_refuses_options_it_does_not_use(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config("lm/english/reduced/hf_gpt2", override)


def test_hf_gpt2_fits_end_to_end_and_reports_test_perplexity(tmp_path, english_dir):  # noqa: F811
    cfg = _lm_config(
        tmp_path,
        english_dir,
        **{
            "model.kind": "hf_gpt2",
            "model.attention": "softmax",
            "model.attention_options": None,
            "trainer.max_steps": 4,
            "trainer.val_check_interval": 2,
        },
    )
    run_dir = tmp_path / "run"
    out = run(fit_cmd(cfg, run_dir, "--threads", "1")).stdout
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["task"] == "lm" and s["steps"] == 4 and s["evaluations"] == 2
    assert [int(r["step"]) for r in history_rows(run_dir)] == [2, 4]
    assert math.isfinite(s["test_ppl"]) and s["test_ppl"] == pytest.approx(math.exp(s["test_loss"]), rel=1e-12)
    assert f"test perplexity {s['test_ppl']:.2f}" in out
    state = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    assert any(k.startswith("model.model.transformer.h.0.attn.c_attn") for k in state)
    # generation decodes our CausalLM only: one clear error, not a wrong model
    from primaldual.tasks.lm.training import generate_text

    with pytest.raises(ValueError, match="model.kind 'hf_gpt2'"):
        generate_text(run_dir, "the kernel")
