"""Readable spectra for long sequences and low rank: first-k curves, absolute k90 / k99, log-axis plots, and a
vision model (CLS + 49 patches = 50 tokens, no mask) through ``analyze_model``."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

import primaldual as pd
from primaldual.analysis.report import _SpectrumAcc, analyze_model, compare_spectra, plot_spectra
from primaldual.analysis.spectrum import first_k, layer_spectra

PNG = b"\x89PNG\r\n\x1a\n"
OLD_KEYS = {"curve", "curve_mean", "effective_rank", "rank90", "rank99"}
NEW_KEYS = {"curve_k", "curve_k_mean", "k90", "k99", "tokens"}


def _low_rank_stochastic(n: int, r: int, seed: int = 0) -> torch.Tensor:
    """``(n, n)`` row-stochastic matrix of rank ``r``: rows are convex mixtures of r random distributions."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.rand(n, r, generator=g, dtype=torch.float64).softmax(-1)  # (n, r)
    dists = torch.rand(r, n, generator=g, dtype=torch.float64).softmax(-1)  # (r, n)
    return mix @ dists


@pytest.mark.parametrize("r", [1, 3])
def test_rank_r_stochastic_matrix_saturates_at_k_equal_r(r):
    n = 300
    w = _low_rank_stochastic(n, r)[None, None]  # (B=1, H=1, n, n)
    assert torch.allclose(w.sum(-1), torch.ones(1, 1, n, dtype=torch.float64))
    stats = layer_spectra(w, points=50, k_max=64)
    curve_k = stats["curve_k"][0]  # (64,)
    assert curve_k.shape == (64,)
    assert torch.allclose(curve_k[r - 1 :], torch.ones(64 - r + 1, dtype=torch.float64), atol=1e-9)
    if r > 1:
        assert curve_k[r - 2] < 1 - 1e-3, "not saturated one component before the rank"
    assert int(stats["k99"]) <= r and int(stats["k90"]) <= r
    if r == 1:
        assert float(stats["k90"]) == 1.0 and float(stats["k99"]) == 1.0
        assert float(stats["rank90"]) == pytest.approx(1 / n)
    assert float(stats["tokens"]) == n
    # on the k / N grid the whole curve is saturated from the first grid point (1/50 > r/300): the old view
    assert torch.allclose(stats["curve"], torch.ones(1, 50, dtype=torch.float64), atol=1e-9)


@pytest.mark.parametrize("n", [300, 301, 50])
def test_identity_needs_ceil_of_the_fraction(n):
    stats = layer_spectra(torch.eye(n).expand(2, 3, n, n), k_max=64)
    assert stats["k90"].tolist() == [math.ceil(0.9 * n)] * 3
    assert stats["k99"].tolist() == [math.ceil(0.99 * n)] * 3
    assert torch.allclose(stats["rank90"], torch.full((3,), math.ceil(0.9 * n) / n, dtype=torch.float64))
    K = min(64, n)  # all components when the sequence is shorter than k_max
    k = torch.arange(1, K + 1, dtype=torch.float64)
    assert torch.allclose(stats["curve_k"], (k / n).expand(3, K))


def test_short_samples_are_padded_with_their_saturated_value():
    # one sample with 3 real tokens, one with 300 (identity spectra): beyond k = 3 the short one counts as 1
    w = torch.zeros(2, 1, 300, 300)
    w[0, 0, :3, :3] = torch.eye(3)
    w[1, 0] = torch.eye(300)
    mask = torch.zeros(2, 300, dtype=torch.bool)
    mask[0, :3] = True
    mask[1] = True
    stats = layer_spectra(w, mask, k_max=64)
    k = torch.arange(1, 65, dtype=torch.float64)
    short = torch.clamp(k / 3, max=1.0)
    assert torch.allclose(stats["curve_k"][0], (short + k / 300) / 2)
    assert stats["k90"].tolist() == [(3 + 270) / 2]
    assert float(stats["tokens"]) == (3 + 300) / 2
    assert torch.equal(first_k(torch.tensor([0.5, 1.0]), 4), torch.tensor([0.5, 1.0, 1.0, 1.0]))
    assert torch.equal(first_k(torch.arange(6.0), 4), torch.arange(4.0))


def test_accumulator_over_calls_of_different_lengths_is_exact():
    # calls with N = 3 and N = 10 tokens: the running curve_k grows from 3 to 10 columns without bias
    acc = _SpectrumAcc("softmax", "", 1)
    acc.add(torch.eye(3).expand(2, 1, 3, 3), None, points=10, power=1, k_max=64)
    acc.add(torch.eye(10).expand(1, 1, 10, 10), None, points=10, power=1, k_max=64)
    out = acc.result()
    k = torch.arange(1, 11, dtype=torch.float64)
    want = (2 * torch.clamp(k / 3, max=1.0) + k / 10) / 3
    assert torch.allclose(torch.tensor(out["curve_k"][0], dtype=torch.float64), want)
    assert out["k90"] == pytest.approx([(2 * 3 + 9) / 3])
    assert out["tokens"] == pytest.approx((2 * 3 + 10) / 3)


def _long_sequence_results() -> dict[str, dict]:
    """Two 2-layer softmax models on N = 300 tokens; in one the last layer is uniform (rank 1)."""
    torch.manual_seed(0)
    x = torch.randn(2, 300, 16)
    batches = [(x, None, torch.zeros(2))]
    plain = pd.Encoder(dim=16, depth=2, num_heads=2, attention="softmax")
    low = pd.Encoder(dim=16, depth=2, num_heads=2, attention="softmax")
    with torch.no_grad():  # constant scores -> uniform attention -> rank one
        low.blocks[1].attn.qkv.weight[:32].zero_()
        low.blocks[1].attn.qkv.bias[:32].zero_()
    return {"plain": analyze_model(plain, batches), "rank one": analyze_model(low, batches)}


def test_plots_for_long_sequences_and_old_results(tmp_path):
    pytest.importorskip("matplotlib")
    results = _long_sequence_results()
    last = results["rank one"]["layers"][1]["spectrum"]
    assert set(last) == OLD_KEYS | NEW_KEYS
    assert len(last["curve"][0]) == 50 and len(last["curve_k"][0]) == 64  # k / N grid kept; first 64 components
    assert last["k90"] == [1.0, 1.0] and last["curve_k_mean"][0] == pytest.approx(1.0)
    assert results["rank one"]["k_max"] == 64
    for name, res in results.items():
        p = plot_spectra(res, tmp_path / f"{name}.png")
        assert p.read_bytes().startswith(PNG) and p.stat().st_size > 5000
    for axis in ("k", "fraction"):
        c = compare_spectra(results, tmp_path / f"compare_{axis}.png", axis=axis)
        assert c.read_bytes().startswith(PNG) and c.stat().st_size > 5000
    assert compare_spectra(results, tmp_path / "last.png", layer=-1).stat().st_size > 1000
    # an analysis.json written before the first-k keys existed still plots (k / N fallback)
    old = json.loads(json.dumps(results["plain"]))
    for layer in old["layers"]:
        layer["spectrum"] = {k: v for k, v in layer["spectrum"].items() if k in OLD_KEYS}
    assert plot_spectra(old, tmp_path / "old.png").stat().st_size > 1000
    assert compare_spectra({"old": old}, tmp_path / "old_cmp.png", axis="fraction").stat().st_size > 1000
    with pytest.raises(ValueError, match="axis='fraction'"):
        compare_spectra({"old": old}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="axis"):
        compare_spectra(results, tmp_path / "x.png", axis="log")


def test_vision_classifier_called_on_images(tmp_path):
    """``model(images)`` with ``(images, y)`` batches: N = 1 + 7 * 7 = 50 tokens (not a power of two), no mask."""
    from primaldual.models.vit import VisionClassifier

    torch.manual_seed(0)
    model = VisionClassifier(28, 4, 10, in_channels=1, dim=32, depth=2, num_heads=2, attention=["softmax", "primal"])
    images = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    batches = [(images[:3].float() / 255, torch.zeros(3)), (images[3:].float() / 255, torch.zeros(2))]
    result = analyze_model(model, batches, max_samples=4)
    assert result["samples"] == 4
    assert [layer["mechanism"] for layer in result["layers"]] == ["softmax", "primal"]
    assert [layer["name"] for layer in result["layers"]] == ["encoder.blocks.0.attn", "encoder.blocks.1.attn"]
    for layer in result["layers"]:
        spec = layer["spectrum"]
        assert set(spec) == OLD_KEYS | NEW_KEYS and spec["tokens"] == 50.0
        curve_k = torch.tensor(spec["curve_k"], dtype=torch.float64)
        assert curve_k.shape == (2, 50), "all 50 components when N < k_max"
        assert torch.allclose(curve_k[:, -1], torch.ones(2, dtype=torch.float64), atol=1e-9)
        assert all(1 <= a <= b <= 50 for a, b in zip(spec["k90"], spec["k99"]))
        assert spec["rank90"] == pytest.approx([k / 50 for k in spec["k90"]])  # n is the same for every sample
        assert isinstance(layer["redundancy"]["maps"], float)
    if importlib.util.find_spec("matplotlib") is not None:  # the analysis itself needs no matplotlib
        assert plot_spectra(result, tmp_path / "vit.png").stat().st_size > 1000
