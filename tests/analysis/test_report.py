"""The analysis report: structure, aggregation, sample budget, padding, known spectra, plots and errors."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import primaldual as pd
from primaldual.analysis.report import analyze_model, compare_spectra, plot_spectra, write_json
from primaldual.analysis.spectrum import layer_spectra

DIM, HEADS, N, POINTS = 16, 2, 10, 12


class Classifier(nn.Module):
    """Encoder + mean pooling + linear head; forward takes ``(x, mask)`` like the task models."""

    def __init__(self, attention, depth: int = 2) -> None:
        super().__init__()
        self.enc = pd.Encoder(dim=DIM, depth=depth, num_heads=HEADS, attention=attention)
        self.head = nn.Linear(DIM, 3)

    def forward(self, x, mask=None):
        return self.head(self.enc(x, mask).mean(1))


class TwoTower(nn.Module):
    """One shared encoder called on both inputs (as in a retrieval model)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = pd.Encoder(dim=DIM, depth=2, num_heads=HEADS, attention="softmax")

    def forward(self, a, b):
        return (self.enc(a) * self.enc(b)).sum(-1)


def _batches(count: int = 2, size: int = 3, pad: bool = True):
    out = []
    for _ in range(count):
        x = torch.randn(size, N, DIM)
        mask = torch.ones(size, N, dtype=torch.bool)
        if pad:
            mask[1, N - 4 :] = False  # some padding
            mask[2, 2:] = False  # only 2 real tokens
        out.append((x, mask, torch.randint(0, 3, (size,))))
    return out


def _check_result(result, names, points=POINTS):
    assert set(result) == {"layers", "samples", "points", "power", "k_max"} and result["points"] == points
    assert [layer["mechanism"] for layer in result["layers"]] == names
    for layer in result["layers"]:
        assert set(layer) == {"name", "mechanism", "weights_meaning", "num_heads", "spectrum", "redundancy"}
        H = layer["num_heads"]
        assert H == HEADS and isinstance(layer["weights_meaning"], str) and layer["weights_meaning"]
        spec = layer["spectrum"]
        curve = torch.tensor(spec["curve"], dtype=torch.float64)
        assert curve.shape == (H, points) and torch.isfinite(curve).all()
        assert curve.min() >= 0 and curve.max() <= 1 + 1e-9
        assert (curve.diff(dim=-1) >= -1e-9).all(), "cumulative curves must be non-decreasing"
        assert torch.allclose(curve[:, -1], torch.ones(H, dtype=torch.float64), atol=1e-9)
        assert torch.allclose(torch.tensor(spec["curve_mean"], dtype=torch.float64), curve.mean(0))
        old = {"curve", "curve_mean", "effective_rank", "rank90", "rank99"}  # keys of earlier analysis.json files
        assert set(spec) == old | {"curve_k", "curve_k_mean", "k90", "k99", "tokens"}
        for key in ("effective_rank", "rank90", "rank99", "k90", "k99"):
            assert len(spec[key]) == H and all(isinstance(v, float) for v in spec[key])
        assert all(1 - 1e-9 <= v <= N for v in spec["effective_rank"])
        assert all(0 < a <= b <= 1 for a, b in zip(spec["rank90"], spec["rank99"]))
        assert all(1 <= a <= b <= N for a, b in zip(spec["k90"], spec["k99"]))
        assert 2 <= spec["tokens"] <= N
        # first-k curves: all N components here (N < k_max), non-decreasing, saturated at the end
        curve_k = torch.tensor(spec["curve_k"], dtype=torch.float64)
        assert curve_k.shape == (H, N) and (curve_k.diff(dim=-1) >= -1e-9).all()
        assert torch.allclose(curve_k[:, -1], torch.ones(H, dtype=torch.float64), atol=1e-9)
        assert torch.allclose(torch.tensor(spec["curve_k_mean"], dtype=torch.float64), curve_k.mean(0))
        red = layer["redundancy"]
        assert set(red) == {"maps", "outputs"}
        assert isinstance(red["maps"], float) and -1 - 1e-9 <= red["maps"] <= 1 + 1e-9
        assert red["outputs"] is None or -1 - 1e-9 <= red["outputs"] <= 1 + 1e-9


@pytest.mark.parametrize("name", ["softmax", "primal", "linear", "softmax_sh"])
def test_structure_padding_and_json_round_trip(name, tmp_path):
    model = Classifier(name).train()
    result = analyze_model(model, _batches(), points=POINTS)
    _check_result(result, [name, name])
    assert result["samples"] == 6 and result["power"] == 1 and result["k_max"] == 64
    # real tokens per sample: 10, 6 and 2 in each batch
    assert all(layer["spectrum"]["tokens"] == pytest.approx(6.0) for layer in result["layers"])
    assert [layer["name"] for layer in result["layers"]] == ["enc.blocks.0.attn", "enc.blocks.1.attn"]
    assert model.training, "the model's training flag is restored"
    path = write_json(result, tmp_path / "sub" / "analysis.json")
    assert json.loads(path.read_text()) == result
    assert not [p for p in path.parent.iterdir() if p.name != "analysis.json"], "no temporary file left"


def test_power_two_and_mixed_layers():
    result = analyze_model(Classifier(["softmax", "primal"]), _batches(1), points=7, power=2)
    _check_result(result, ["softmax", "primal"], points=7)
    assert result["power"] == 2


def test_max_samples_is_respected_and_stops_pulling_batches():
    model = Classifier("softmax")
    seen = []
    model.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[0]))
    pulled = []

    def gen():
        for i, b in enumerate(_batches(count=4)):
            pulled.append(i)
            yield b

    result = analyze_model(model, gen(), max_samples=5, points=POINTS)
    assert result["samples"] == 5
    assert seen == [3, 3, 2, 2], "capture pass and redundancy pass each see the sliced batch"
    assert pulled == [0, 1]


def test_layer_called_twice_is_aggregated_over_calls():
    torch.manual_seed(1)
    model = TwoTower()
    a, b = torch.randn(3, N, DIM), torch.randn(3, N, DIM)
    result = analyze_model(model, [(a, b, torch.zeros(3))], points=POINTS)
    assert [layer["name"] for layer in result["layers"]] == ["enc.blocks.0.attn", "enc.blocks.1.attn"]
    assert result["samples"] == 3
    # the same encoder fed both towers' samples as one batch gives the same per-sample average
    single = analyze_model(model.enc, [(torch.cat([a, b]), None)], points=POINTS)
    for two, one in zip(result["layers"], single["layers"]):
        for key in ("curve", "effective_rank", "rank90", "rank99", "curve_k", "k90", "k99", "tokens"):
            got = torch.tensor(two["spectrum"][key], dtype=torch.float64)
            assert torch.allclose(got, torch.tensor(one["spectrum"][key], dtype=torch.float64), atol=1e-6)
        assert two["redundancy"]["maps"] == pytest.approx(one["redundancy"]["maps"], abs=1e-6)
        assert two["redundancy"]["outputs"] == pytest.approx(one["redundancy"]["outputs"], abs=1e-6)


def test_rank_one_attention_reaches_one_at_the_first_component():
    # uniform softmax attention (constant scores) is rank one, also after cutting the padding
    layer = pd.build_attention("softmax", DIM, HEADS)
    with torch.no_grad():
        layer.qkv.weight[: 2 * DIM].zero_()
        layer.qkv.bias[: 2 * DIM].zero_()
    x, mask, y = _batches(1)[0]
    result = analyze_model(layer, [(x, mask, y)], points=POINTS)
    (entry,) = result["layers"]
    assert entry["name"] == "" and entry["mechanism"] == "softmax"
    # the curve runs from 0 at k = 0 to 1 at the first component (k / n = 1 / n) and stays there
    curve = torch.tensor(entry["spectrum"]["curve"], dtype=torch.float64)
    assert torch.allclose(curve[:, POINTS // 2 :], torch.ones_like(curve[:, POINTS // 2 :]))
    assert entry["spectrum"]["effective_rank"] == pytest.approx([1.0] * HEADS, abs=1e-6)
    assert entry["spectrum"]["k90"] == [1.0] * HEADS and entry["spectrum"]["k99"] == [1.0] * HEADS
    assert entry["spectrum"]["curve_k_mean"] == pytest.approx([1.0] * N)
    assert entry["redundancy"]["maps"] == pytest.approx(1.0)  # identical uniform maps in every head
    # and directly on hand-made rank-one weights
    u, v = torch.randn(2, HEADS, N, 1), torch.randn(2, HEADS, 1, N)
    stats = layer_spectra(u @ v, points=POINTS)
    first = next(i for i in range(POINTS) if (i + 1) * N >= POINTS)  # first grid point at or past k / N = 1 / N
    assert torch.allclose(stats["curve"][:, first:], torch.ones(HEADS, POINTS - first, dtype=torch.float64))
    assert (stats["curve"][:, :first] < 1).all()


def test_plots_write_png_files(tmp_path):
    pytest.importorskip("matplotlib")
    r_soft = analyze_model(Classifier("softmax"), _batches(1), points=POINTS)
    r_plus = analyze_model(Classifier(["softmax", "primal"]), _batches(1), points=POINTS)
    r_one = analyze_model(Classifier("softmax_sh", depth=1), _batches(1), points=POINTS)
    png = b"\x89PNG\r\n\x1a\n"
    p = plot_spectra(r_plus, tmp_path / "spectra.png", title="Primal.+")
    assert p == tmp_path / "spectra.png" and p.read_bytes().startswith(png) and p.stat().st_size > 1000
    # a result read back from JSON, with a layer that has no spectrum, still plots
    weightless = json.loads(json.dumps(r_soft))
    weightless["layers"][1]["spectrum"] = None
    assert plot_spectra(weightless, tmp_path / "w.png").read_bytes().startswith(png)
    results = {"Transformer": r_soft, "Primal.+": r_plus, "SH (depth 1)": r_one}
    c = compare_spectra(results, tmp_path / "compare.png")
    assert c.read_bytes().startswith(png) and c.stat().st_size > 1000
    assert compare_spectra(results, tmp_path / "last.png", layer=-1).read_bytes().startswith(png)
    with pytest.raises(ValueError, match="layer"):
        compare_spectra(results, tmp_path / "x.png", layer=5)
    with pytest.raises(ValueError, match="results"):
        compare_spectra({}, tmp_path / "x.png")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["compare.png", "last.png", "spectra.png", "w.png"]


def test_errors():
    model = Classifier("softmax")
    with pytest.raises(ValueError, match="batches"):
        analyze_model(model, [])
    with pytest.raises(ValueError, match="batches"):
        analyze_model(model, [torch.randn(2, N, DIM)])  # not (*inputs, y) tuples
    with pytest.raises(ValueError, match="model"):
        analyze_model(nn.Sequential(nn.Linear(DIM, DIM)), _batches(1))
    with pytest.raises(ValueError, match="max_samples"):
        analyze_model(model, _batches(1), max_samples=0)
