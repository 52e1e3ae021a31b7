"""Rotary position embeddings: the tables and the rotation against an independent complex-number reference and
against transformers' Llama implementation, and the validation of ``rope=`` tables."""

from __future__ import annotations

import pytest
import torch

from primaldual.functional.rotary import apply_rope, check_rope, rope_tables
from tests.conftest import rel_err


def _complex_reference(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Channel j and j + D/2 as the real and imaginary part of one number, turned by position * theta^(-2j/D)."""
    D = x.shape[-1]
    z = torch.complex(x[..., : D // 2], x[..., D // 2 :])  # (..., N, D/2)
    freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    turn = torch.polar(torch.ones_like(freq), positions.double()[:, None] * freq)  # (N, D/2)
    out = z * turn
    return torch.cat((out.real, out.imag), -1)


def test_rotation_equals_the_complex_reference():
    torch.manual_seed(0)
    q, k = torch.randn(1, 3, 7, 8, dtype=torch.float64), torch.randn(1, 3, 7, 8, dtype=torch.float64)
    pos = torch.arange(5, 12)
    cos, sin = rope_tables(pos, 8, dtype=torch.float64)
    qr, kr = apply_rope(q, k, cos[None, None], sin[None, None])
    assert rel_err(qr, _complex_reference(q, pos)) < 1e-12
    assert rel_err(kr, _complex_reference(k, pos)) < 1e-12
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1))  # a rotation keeps every pair's length


def test_scores_depend_on_relative_positions_only():
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(i: int, j: int) -> float:
        cq, sq = rope_tables(torch.tensor([i]), 16, dtype=torch.float64)
        ck, sk = rope_tables(torch.tensor([j]), 16, dtype=torch.float64)
        qr, _ = apply_rope(q, q, cq, sq)
        kr, _ = apply_rope(k, k, ck, sk)
        return float((qr * kr).sum())

    assert abs(score(7, 3) - score(104, 100)) < 1e-9


def test_matches_transformers_llama_rotary():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=10000.0, max_position_embeddings=64)
    rot = llama.LlamaRotaryEmbedding(cfg)
    x = torch.randn(2, 9, 64)
    pos = torch.arange(9)[None].expand(2, 9)
    cos_hf, sin_hf = rot(x, pos)  # (B, N, D)
    cos, sin = rope_tables(pos, 16)
    assert rel_err(cos_hf, cos) < 1e-6 and rel_err(sin_hf, sin) < 1e-6
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16)
    ref_q, ref_k = llama.apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    ours_q, ours_k = apply_rope(q, k, *check_rope((cos_hf, sin_hf), 2, 9, 16, q.device))
    assert rel_err(ours_q, ref_q) < 1e-6 and rel_err(ours_k, ref_k) < 1e-6


@pytest.mark.parametrize(
    "rope,match",
    [
        ("tables", "a \\(cos, sin\\) pair of tensors"),
        ((torch.ones(4, 8),), "a \\(cos, sin\\) pair"),
        ((torch.ones(4, 8), torch.ones(4, 6)), "cos and sin must have the same shape"),
        (
            (torch.ones(5, 8), torch.ones(5, 8)),
            "cos and sin must have shape \\(4, R\\) or \\(2, 4, R\\), R even, 8 .* got \\(5, 8\\)",
        ),
        ((torch.ones(3, 4, 8), torch.ones(3, 4, 8)), "cos and sin must have shape \\(4, R\\) or \\(2, 4, R\\)"),
        ((torch.ones(4, 10), torch.ones(4, 10)), "cos and sin .* R even, 8 \\(the head width\\) or below it"),
        (
            (torch.ones(4, 5), torch.ones(4, 5)),
            "cos and sin .* or below it \\(partial rotary\\), got \\(4, 5\\)",
        ),
        ((torch.ones(4, 8, dtype=torch.long), torch.ones(4, 8, dtype=torch.long)), "cos must be floating point"),
    ],
)
def test_bad_tables_are_named(rope, match):
    with pytest.raises(ValueError, match=f"rope: {match}" if not match.startswith("a ") else match):
        check_rope(rope, 2, 4, 8, torch.device("cpu"))


def test_odd_head_width_and_bad_positions_are_refused():
    with pytest.raises(ValueError, match="R even"):
        check_rope((torch.ones(4, 7), torch.ones(4, 7)), 2, 4, 7, torch.device("cpu"))
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        rope_tables(torch.arange(4.0), 8)
    with pytest.raises(ValueError, match="head_dim must be an even integer"):
        rope_tables(torch.arange(4), 7)


def test_partial_tables_rotate_the_first_channels_and_pass_the_rest():
    """Tables of width R < D (GPT-NeoX, Phi-4-mini): the first R channels turn as a head of width R would, the
    others are unchanged; equal to transformers' GPT-NeoX rotation."""
    torch.manual_seed(2)
    q, k = torch.randn(2, 3, 5, 8, dtype=torch.float64), torch.randn(2, 3, 5, 8, dtype=torch.float64)
    cos, sin = rope_tables(torch.arange(5), 4, dtype=torch.float64)
    qr, kr = apply_rope(q, k, *check_rope((cos, sin), 2, 5, 8, q.device))
    fq, fk = apply_rope(q[..., :4], k[..., :4], cos[None, None], sin[None, None])
    assert torch.equal(qr[..., 4:], q[..., 4:]) and torch.equal(kr[..., 4:], k[..., 4:])
    assert rel_err(qr[..., :4], fq) < 1e-15 and rel_err(kr[..., :4], fk) < 1e-15
    neox = pytest.importorskip("transformers.models.gpt_neox.modeling_gpt_neox")
    ref_q, ref_k = neox.apply_rotary_pos_emb(q, k, cos[None], sin[None])
    assert rel_err(qr, ref_q) < 1e-15 and rel_err(kr, ref_k) < 1e-15
