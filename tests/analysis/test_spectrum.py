"""Spectrum statistics on matrices with known singular values, and weight capture from a model."""

from __future__ import annotations

import torch

import primaldual as pd
from primaldual.analysis.capture import capture_attention
from primaldual.analysis.spectrum import cumulative_spectrum, effective_rank, layer_spectra, rank_at, resample


def test_known_spectra():
    eye = torch.eye(8)
    c = cumulative_spectrum(eye)
    assert torch.allclose(c, torch.arange(1, 9, dtype=torch.float64) / 8)
    assert abs(float(effective_rank(eye)) - 8) < 1e-9
    one = torch.ones(8, 8) / 8  # rank one, row-stochastic
    assert torch.allclose(cumulative_spectrum(one), torch.ones(8, dtype=torch.float64))
    assert abs(float(effective_rank(one)) - 1) < 1e-6
    assert int(rank_at(c, 0.5)) == 4
    assert torch.allclose(resample(c, 8), c)


def test_layer_spectra_cuts_padding():
    w = torch.eye(6).expand(2, 3, 6, 6).clone()
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 3:] = False
    w[1, :, 3:, :] = 0
    w[1, :, :, 3:] = 0
    stats = layer_spectra(w, mask, points=10)
    assert stats["curve"].shape == (3, 10)
    assert torch.allclose(stats["effective_rank"], torch.full((3,), 4.5, dtype=torch.float64))


def test_capture_from_encoder_leaves_outputs_unchanged():
    enc = pd.Encoder(dim=12, depth=2, num_heads=3, attention=["softmax", "linear"]).eval()
    x = torch.randn(2, 9, 12)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 6:] = False
    ref = enc(x, mask)
    with capture_attention(enc) as rec:
        out = enc(x, mask)
    assert torch.allclose(out, ref, atol=1e-6)  # weights force the eager path: equal up to rounding
    assert [r.mechanism for r in rec] == ["softmax", "linear"]
    assert rec[0].weights.shape == (2, 3, 9, 9) and torch.equal(rec[0].mask, mask)
    assert enc(x, mask).shape == x.shape  # hooks removed
