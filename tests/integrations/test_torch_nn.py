"""primaldual.integrations.torch_nn: the nn.MultiheadAttention stand-in and the mask conversions."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import primaldual as pd
from primaldual.integrations.torch_nn import (
    MultiheadSelfAttention,
    convert_transformer_decoder,
    convert_transformer_encoder,
    key_mask_from_attention_mask,
    key_mask_from_padding_mask,
)


def _encoder(batch_first: bool = True) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def _batch(batch_first: bool = True):
    x = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(3, 10, dtype=torch.bool)  # nn convention: True = padding
    pad[1, 7:] = pad[2, 3:] = True
    return (x if batch_first else x.transpose(0, 1)), pad


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("mech,opts", [("softmax", {}), ("sparse", {"window": 16})])
def test_converted_encoder_reproduces_the_original_at_real_tokens(batch_first, mech, opts):
    enc = _encoder(batch_first)
    x, pad = _batch(batch_first)
    with torch.no_grad():
        ref = enc(x, src_key_padding_mask=pad)
        out = convert_transformer_encoder(copy.deepcopy(enc), mech, "all", **opts)(x, src_key_padding_mask=pad)
    if not batch_first:
        ref, out = ref.transpose(0, 1), out.transpose(0, 1)
    real = ~pad
    assert torch.allclose(out[real], ref[real], atol=1e-5)
    mask = nn.Transformer.generate_square_subsequent_mask(10)
    with torch.no_grad():
        ref = enc(x, mask=mask, is_causal=True)
        causal = convert_transformer_encoder(copy.deepcopy(enc), mech, "all", causal=True, **opts)
        assert torch.allclose(causal(x, mask=mask, is_causal=True), ref, atol=1e-5)


def test_stand_in_inside_a_decoder_layer_and_primal_aux_loss():
    torch.manual_seed(0)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(32, 2, 64, dropout=0.0, batch_first=True), 2).eval()
    tgt, mem = torch.randn(2, 6, 32), torch.randn(2, 4, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    with torch.no_grad():
        ref = dec(tgt, mem, tgt_mask=mask, tgt_is_causal=True)
        conv = convert_transformer_decoder(copy.deepcopy(dec), "softmax", "all")
        assert torch.allclose(conv(tgt, mem, tgt_mask=mask, tgt_is_causal=True), ref, atol=1e-5)
    enc = convert_transformer_encoder(_encoder(), "primal", -1, s=4)
    x, pad = _batch()
    out = enc(x, src_key_padding_mask=pad)
    aux = pd.collect_aux_loss(enc)
    assert aux is not None
    (out[~pad].sum() + aux).backward()
    layer = enc.layers[-1].self_attn.attn
    assert layer.w_e.grad.abs().sum() > 0 and layer.lam.grad.abs().sum() > 0
    # built directly, as nn.MultiheadAttention is
    attn = MultiheadSelfAttention(32, 4, "linear", batch_first=True)
    y, w = attn(x, x, x, key_padding_mask=pad)
    assert y.shape == x.shape and w.shape == (3, 10, 10)
    assert torch.equal(y[pad], torch.zeros_like(y[pad]))
    # nn.MultiheadAttention's default need_weights=True: primal's kernel matrix is no attention weights, not formed
    y, w = MultiheadSelfAttention(32, 4, "primal", batch_first=True, s=4)(x, x, x, key_padding_mask=pad)
    assert w is None and y.shape == x.shape
    attn = MultiheadSelfAttention(32, 4, "softmax", batch_first=True, dropout=0.1)
    assert (attn.kdim, attn.vdim, attn.dropout, attn.bias_k, attn.add_zero_attn) == (32, 32, 0.1, None, False)
    assert attn.out_proj is attn.attn.proj and "out_proj.weight" not in attn.state_dict()


def test_mask_conventions_are_converted_not_guessed():
    pad = torch.tensor([[False, False, True]])
    as_float = torch.zeros(1, 3).masked_fill(pad, float("-inf"))
    assert torch.equal(key_mask_from_padding_mask(pad, 1, 3), ~pad)
    assert torch.equal(key_mask_from_padding_mask(as_float, 1, 3), ~pad)
    assert key_mask_from_padding_mask(torch.zeros(1, 3, dtype=torch.bool), 1, 3) is None
    with pytest.raises(TypeError, match="integer 0/1 masks are ambiguous"):
        key_mask_from_padding_mask(pad.long(), 1, 3)
    with pytest.raises(ValueError, match="soft attention biases"):
        key_mask_from_padding_mask(torch.tensor([[0.0, -1.0, 0.0]]), 1, 3)
    for big in (-1e9, -1e4, torch.finfo(torch.float32).min):  # the large negatives masks are written with
        assert torch.equal(key_mask_from_padding_mask(torch.zeros(1, 3).masked_fill(pad, big), 1, 3), ~pad)
    with pytest.raises(ValueError, match="soft attention biases"):
        key_mask_from_padding_mask(torch.tensor([[0.0, -9e3, 0.0]]), 1, 3)
    causal = torch.full((3, 3), -1e9).triu(1)  # a causal mask written with -1e9
    assert key_mask_from_attention_mask(causal, batch=1, q_len=3, kv_len=3, causal=True) is None
    sdpa = (~pad)[:, None, None, :]  # (B, 1, 1, N) True = attend
    assert torch.equal(key_mask_from_attention_mask(sdpa, batch=1, q_len=3, kv_len=3, causal=False), ~pad)
    window = torch.ones(3, 3, dtype=torch.bool).triu(-1).tril(1)
    with pytest.raises(ValueError, match="structure other than padding"):
        key_mask_from_attention_mask(window, batch=1, q_len=3, kv_len=3, causal=False)


def test_a_layer_without_an_equivalent_is_named():
    """kdim / vdim and add_bias_kv have no primaldual equivalent: the refusal names the layer."""
    enc = _encoder()
    enc.layers[1].self_attn = nn.MultiheadAttention(32, 4, add_bias_kv=True, batch_first=True)
    with pytest.raises(ValueError, match=r"nn.MultiheadAttention \(layer 1\) with add_bias_kv"):
        convert_transformer_encoder(enc, "softmax", "all")
    enc.layers[1].self_attn = nn.MultiheadAttention(32, 4, kdim=16, vdim=16, batch_first=True)
    with pytest.raises(ValueError, match=r"nn.MultiheadAttention \(layer 1\) with kdim / vdim"):
        convert_transformer_encoder(enc, "softmax", "all")


def test_stand_in_errors_name_the_problem():
    enc = _encoder()
    x, pad = _batch()
    with pytest.raises(IndexError, match="layer index 5 is out of range for a model with 2 layers"):
        convert_transformer_encoder(enc, "softmax", layers=5)
    with pytest.raises(ValueError, match="'linear_bn' cannot be causal"):
        convert_transformer_encoder(enc, "linear_bn", causal=True)
    convert_transformer_encoder(enc, "softmax", -1)
    with pytest.raises(ValueError, match="already converted"):
        convert_transformer_encoder(enc, "softmax", -1)
    with pytest.raises(ValueError, match="built with causal=False"):
        enc(x, mask=nn.Transformer.generate_square_subsequent_mask(10), is_causal=True)
    attn = enc.layers[-1].self_attn
    with pytest.raises(ValueError, match="self-attention"):
        attn(x, x.clone(), x)
    y = attn.eval()(x.transpose(0, 1).transpose(0, 1), x.transpose(0, 1).transpose(0, 1), x)[0]  # views of x
    torch.testing.assert_close(y, attn(x, x, x)[0])
    with pytest.raises(ValueError, match="None or causal"):
        attn(x, x, x, attn_mask=torch.ones(10, 10, dtype=torch.bool).triu(3))


@pytest.mark.parametrize("causal", [False, True])
def test_a_pairwise_mask_that_also_empties_padded_queries_is_padding(causal):
    """``keep_i & keep_j`` (hand-written code's pairwise mask) says padding only: a padded query's empty row is
    accepted, a real query's is not."""
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, 4:] = False
    pair = keep[:, None, :, None] & keep[:, None, None, :]  # (B, 1, N, N)
    if causal:
        pair = pair & torch.ones(6, 6, dtype=torch.bool).tril()
    got = key_mask_from_attention_mask(pair, batch=2, q_len=6, kv_len=6, causal=causal)
    assert torch.equal(got, keep)
    pair = pair.clone()
    pair[0, 0, 2] = False  # a real query with no key
    with pytest.raises(ValueError, match="structure other than padding"):
        key_mask_from_attention_mask(pair, batch=2, q_len=6, kv_len=6, causal=causal)
