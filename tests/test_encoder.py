"""The shared backbone's feed-forward options: the activation and the dropout on its hidden units, threaded from
:class:`~primaldual.Encoder` to every block, and refused when malformed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import primaldual as pd
from primaldual.encoder import FeedForward


def test_feed_forward_activation_and_hidden_dropout():
    ff = FeedForward(8, 16, 0.2)
    assert isinstance(ff.net[1], nn.GELU) and ff.net[2].p == 0.2 and ff.net[4].p == 0.2  # timm's Mlp
    ff = FeedForward(8, 16, 0.2, activation="relu", ffn_drop=0.0)
    assert isinstance(ff.net[1], nn.ReLU) and ff.net[2].p == 0.0 and ff.net[4].p == 0.2  # GPT-2's MLP
    x = torch.randn(3, 8)
    lin1, lin2 = ff.net[0], ff.net[3]
    torch.testing.assert_close(ff.eval()(x), lin2(torch.relu(lin1(x))))


def test_encoder_threads_the_options_to_every_block():
    enc = pd.Encoder(8, 3, 2, ["softmax", "softmax", "primal"], ffn_dim=16, dropout=0.1, activation="relu", ffn_drop=0)
    for block in enc.blocks:
        assert isinstance(block.ffn.net[1], nn.ReLU) and block.ffn.net[2].p == 0.0 and block.ffn.net[4].p == 0.1
    assert all(isinstance(b.ffn.net[1], nn.GELU) for b in pd.Encoder(8, 2, 2, "softmax").blocks)


def test_feed_forward_options_are_validated():
    with pytest.raises(ValueError, match="activation must be one of 'gelu', 'relu'; got 'tanh'"):
        pd.Encoder(8, 1, 2, "softmax", activation="tanh")
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(8, 16, activation="ReLU")
    with pytest.raises(TypeError, match="ffn_drop"):
        FeedForward(8, 16, ffn_drop="0")
    with pytest.raises(ValueError, match="ffn_drop"):
        FeedForward(8, 16, ffn_drop=-0.1)


def test_encoder_options_are_checked_never_coerced():
    with pytest.raises(TypeError, match="norm_first must be a bool"):
        pd.Encoder(16, 2, 2, norm_first="false")
    with pytest.raises(TypeError, match="final_norm must be a bool"):
        pd.Encoder(16, 2, 2, final_norm="false")
    with pytest.raises(TypeError, match="dropout must be a number in \\[0, 1\\)"):
        pd.Encoder(16, 2, 2, dropout="0.1")
    with pytest.raises(TypeError, match="drop_path must be a number"):
        pd.Encoder(16, 2, 2, drop_path="0.1")
    with pytest.raises(ValueError, match="ffn_dim must be an int >= 1, got 0"):
        pd.Encoder(16, 2, 2, ffn_dim=0)
    with pytest.raises(TypeError, match="depth must be an int >= 1, got True"):
        pd.Encoder(16, True, 2)
