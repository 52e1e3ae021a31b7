"""Spectrum and head-redundancy report of any model's attention layers: the core of ``primaldual analyze``.

What is analysed, and why: the Primal-Attention paper (Chen et al., NeurIPS 2023) argues that attention matrices
are low rank, so a rank-s primal representation loses little. Its figure plots, per layer and head, the
**normalised cumulative singular values** ``c_k = sum_{i<=k} s_i / sum_i s_i`` of the attention matrix against
the fraction of components ``k / N``: a curve that reaches 1 early means a low-rank (redundant) matrix. The SVR
paper (Nguyen et al., ICLR 2023) argues that Attention-BN / -SH make heads less redundant. This module gathers
both, per attention layer, over a few batches of real data:

* the spectrum statistics of :func:`primaldual.analysis.spectrum.layer_spectra` (per-head curve on a common
  ``k / N`` grid, effective rank, fraction of components for 90% / 99% of the mass), and
* the head redundancy of :mod:`primaldual.analysis.redundancy` (mean pairwise cosine similarity between heads
  of the attention maps and of the head outputs).

**Which matrix.** Weights are read with :func:`primaldual.analysis.capture.capture_attention`, i.e. each layer's
``need_weights=True`` output ``(B, H, N, N)``, restricted per sample to its real tokens (the padding mask the
layer received; padded rows and columns are cut before the SVD). For softmax layers this is the row-stochastic
attention matrix. Layers that never build an ``N x N`` matrix in their forward materialise the matrix they stand
for only when asked: for ``linear`` (and its BN / SH variants) the normalised kernel matrix, for SH variants the
pooled weights spread back over the tokens, and for ``primal`` the **implicit asymmetric kernel matrix**
``phi_q(Q) phi_k(K)^T`` per head, the matrix whose SVD the KSVD objective is about. The primal matrix is
**signed and not row-stochastic** (it is not a mixing matrix: the output is not ``weights @ v``); singular
values are still non-negative so the curves are comparable, but its redundancy similarities can be negative.
Each layer's ``weights_meaning`` (from the mechanism's capabilities) is copied into the report.

Memory stays bounded: per batch, weights are turned into per-layer sums of the statistics and dropped; only
``max_samples`` samples are fed. Redundancy needs hooks that cannot be active together with the capture hooks
(both rewrite the layer's output), so it is measured in a second forward of the same (sliced) batch with
:func:`primaldual.analysis.redundancy.head_redundancy`.

Example::

    result = analyze_model(model, loader, max_samples=64)
    write_json(result, "analysis.json")
    plot_spectra(result, "spectra.png")
    compare_spectra({"Transformer": r1, "PrimalFormer": r2}, "compare.png")
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer
from ..utils.io import atomic_write_bytes, atomic_write_json
from .capture import capture_attention
from .redundancy import head_redundancy
from .spectrum import layer_spectra

__all__ = ["analyze_model", "compare_spectra", "plot_spectra", "write_json"]

_INSTALL_HINT = "plotting needs matplotlib: pip install 'primaldual[bench]'"


@dataclass
class _SpectrumAcc:
    """Per-layer running sums (over samples with >= 2 real tokens) of the :func:`layer_spectra` statistics."""

    mechanism: str
    weights_meaning: str
    num_heads: int
    curve: Tensor | None = None  # (H, points)
    effective_rank: Tensor | None = None  # (H,)
    rank90: Tensor | None = None
    rank99: Tensor | None = None
    count: int = 0

    def add(self, weights: Tensor, mask: Tensor | None, points: int, power: int) -> None:
        """Add one call's ``(B, H, N, N)`` weights with its ``(B, N)`` mask (True = real token)."""
        B, _, N, _ = weights.shape
        # layer_spectra averages over the samples it keeps (those with >= 2 real tokens); weight by that count
        n_ok = int((mask.sum(-1) >= 2).sum()) if mask is not None else (B if N >= 2 else 0)
        if n_ok == 0:
            return
        stats = layer_spectra(weights, mask, points=points, power=power)
        for key in ("curve", "effective_rank", "rank90", "rank99"):
            s = stats[key].double() * n_ok
            prev = getattr(self, key)
            setattr(self, key, s if prev is None else prev + s)
        self.count += n_ok

    def result(self) -> dict[str, Any] | None:
        if self.count == 0 or self.curve is None:
            return None
        curve = self.curve / self.count
        return {
            "curve": _floats(curve),
            "curve_mean": _floats(curve.mean(0)),
            "effective_rank": _floats(self.effective_rank / self.count),
            "rank90": _floats(self.rank90 / self.count),
            "rank99": _floats(self.rank99 / self.count),
        }


def _floats(t: Tensor) -> list:
    """Tensor -> nested lists of Python floats (non-finite values -> None, so the JSON stays standard)."""
    if t.dim() == 0:
        v = float(t)
        return v if math.isfinite(v) else None  # type: ignore[return-value]
    return [_floats(row) for row in t]


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _slice(batch: Any, remaining: int) -> tuple[tuple[Any, ...], int]:
    """``(*inputs, y)`` -> (inputs cut to at most ``remaining`` samples along dim 0, number of samples)."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        got = type(batch).__name__ + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
        raise ValueError(f"batches must yield (*inputs, y) tuples with at least one input, got {got}")
    inputs = tuple(batch[:-1])
    sized = [t for t in inputs if isinstance(t, Tensor) and t.dim() >= 1]
    if not sized:
        raise ValueError("batches must yield tuples whose inputs include at least one tensor with a batch dimension")
    size = sized[0].shape[0]
    take = min(size, remaining)
    if take < size:
        inputs = tuple(t[:take] if isinstance(t, Tensor) and t.dim() >= 1 else t for t in inputs)
    return inputs, take


def analyze_model(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, ...]],
    *,
    max_samples: int = 64,
    points: int = 50,
    power: int = 1,
) -> dict[str, Any]:
    """Spectrum and head-redundancy statistics of every attention layer of ``model`` over a few batches.

    The model is put in eval mode (its training flag is restored afterwards) and run under ``torch.no_grad()``
    as ``model(*batch[:-1])`` for each ``(*inputs, y)`` batch (the inputs may include a ``(B, N)`` bool mask;
    tensors must already be on the model's device). Batches are cut along dim 0 so that at most
    ``max_samples`` samples are fed in total. A layer called several times per forward (e.g. a shared encoder in
    a two-tower model) is aggregated over all its calls into one entry.

    Args:
        model: any module containing :class:`~primaldual.attention.base.AttentionLayer` layers at any depth.
        batches: iterable of ``(*inputs, y)`` tuples (e.g. a DataLoader); ``y`` is ignored.
        max_samples: stop after this many samples.
        points: resolution of the cumulative-spectrum curves on the ``k / N`` grid ``1/points, ..., 1``.
        power: 1 = cumulative singular values (the paper's plot), 2 = cumulative explained variance.

    Returns:
        A JSON-serialisable dict ``{"layers": [...], "samples": int, "points": int, "power": int}``; each layer
        (in the order layers are first called) is ``{"name", "mechanism", "weights_meaning", "num_heads",
        "spectrum", "redundancy"}`` with ``spectrum`` = ``{"curve": H lists of points floats, "curve_mean",
        "effective_rank" (absolute, per head), "rank90", "rank99" (fractions of the real tokens, per head)}``
        averaged over the samples with at least 2 real tokens (None if the mechanism returns no weights or no
        such sample was seen), and ``redundancy`` = ``{"maps": float | None, "outputs": float | None}``.

    Raises:
        ValueError: ``model`` has no attention layer (or none ran), ``batches`` is empty, or a bad argument.
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, AttentionLayer)}
    if not layers:
        raise ValueError(f"model ({type(model).__name__}) contains no primaldual attention layer to analyse")
    for arg, v in (("max_samples", max_samples), ("points", points), ("power", power)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{arg} must be a positive int, got {v!r}")

    spectra: dict[str, _SpectrumAcc] = {}  # insertion order = order of first call
    red_sums: dict[str, dict[str, float]] = {}  # name -> sample-weighted sums of the redundancy means
    samples = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                inputs, n = _slice(batch, max_samples - samples)
                if n == 0:
                    continue
                with capture_attention(model) as records:
                    model(*inputs)
                for rec in records:
                    acc = spectra.get(rec.name)
                    if acc is None:
                        layer = layers.get(rec.name)
                        heads = rec.weights.shape[1] if rec.weights is not None else getattr(layer, "num_heads", 0)
                        mech = rec.mechanism or type(layer).__name__
                        acc = spectra[rec.name] = _SpectrumAcc(mech, rec.weights_meaning, int(heads))
                    if rec.weights is not None:
                        acc.add(rec.weights, rec.mask, points, power)
                del records
                for r in head_redundancy(model, *inputs):  # second pass: its hooks clash with capture's
                    s = red_sums.setdefault(r.name, {"maps": 0.0, "maps_n": 0, "outputs": 0.0, "outputs_n": 0})
                    for key, value in (("maps", r.weights), ("outputs", r.outputs)):
                        if value is not None and r.samples:
                            s[key] += value * r.samples  # the tracker's value is linear in its (H, H) mean
                            s[f"{key}_n"] += r.samples
                samples += n
                if samples >= max_samples:
                    break  # before pulling another batch from the iterable
    finally:
        model.train(was_training)

    if samples == 0:
        raise ValueError("batches is empty: no sample was fed to the model")
    if not spectra:
        raise ValueError(f"no attention layer of model ({type(model).__name__}) was called during the forward")

    out_layers = []
    for name, acc in spectra.items():
        s = red_sums.get(name, {})
        out_layers.append(
            {
                "name": name,
                "mechanism": acc.mechanism,
                "weights_meaning": acc.weights_meaning,
                "num_heads": acc.num_heads,
                "spectrum": acc.result(),
                "redundancy": {
                    key: _finite(s[key] / s[f"{key}_n"]) if s.get(f"{key}_n") else None for key in ("maps", "outputs")
                },
            }
        )
    return {"layers": out_layers, "samples": samples, "points": points, "power": power}


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    """Write ``result`` (e.g. from :func:`analyze_model`) as indented JSON, atomically; returns the path."""
    return atomic_write_json(path, result, indent=2, allow_nan=False)


def _figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas (object API: no pyplot, no global backend switch)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(_INSTALL_HINT) from e
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return atomic_write_bytes(path, buf.getvalue())


def _grid(points: int) -> list[float]:
    return [(j + 1) / points for j in range(points)]


def _layers_of(result: dict[str, Any], arg: str) -> list[dict[str, Any]]:
    layers = result.get("layers") if isinstance(result, dict) else None
    if not layers:
        raise ValueError(f"{arg} has no layers (expected the dict returned by analyze_model)")
    return layers


def plot_spectra(result: dict[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Draw the Primal-Attention-style spectrum figure of one :func:`analyze_model` result as a PNG.

    One row per layer: a heat map (x = fraction of components ``k / N``, y = head, colour = normalised
    cumulative singular value on a fixed [0, 1] scale, shared colour bar) and, beside it, the head-mean curve
    with the flat-spectrum diagonal for reference. Layers without a spectrum get an empty, labelled row.

    Returns:
        ``path`` (written atomically). Raises ImportError without matplotlib (``pip install 'primaldual[bench]'``).
    """
    layers = _layers_of(result, "result")
    L = len(layers)
    fig = _figure(8.0, 0.6 + 1.5 * L)
    gs = fig.add_gridspec(L, 3, width_ratios=[3.0, 1.4, 0.08], wspace=0.35, hspace=0.55)
    image = None
    for i, layer in enumerate(layers):
        ax_map, ax_line = fig.add_subplot(gs[i, 0]), fig.add_subplot(gs[i, 1])
        label = f"{layer['name'] or '<model>'} ({layer['mechanism']})"
        spec = layer.get("spectrum")
        ax_map.set_title(label, fontsize=8, loc="left")
        if spec is None:
            for ax in (ax_map, ax_line):
                ax.text(0.5, 0.5, "no weights", ha="center", va="center", fontsize=8, transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
            continue
        curve = [[float("nan") if v is None else v for v in row] for row in spec["curve"]]
        H, P = len(curve), len(curve[0])
        image = ax_map.imshow(
            curve, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, extent=(0.0, 1.0, H - 0.5, -0.5)
        )
        ax_map.set_yticks(range(H))
        ax_map.set_ylabel("head", fontsize=8)
        ax_map.tick_params(labelsize=7)
        ax_line.plot(_grid(P), [float("nan") if v is None else v for v in spec["curve_mean"]], lw=1.5)
        ax_line.plot([0, 1], [0, 1], ls="--", lw=0.8, color="gray")
        ax_line.set_xlim(0, 1)
        ax_line.set_ylim(0, 1.05)
        ax_line.tick_params(labelsize=7)
        ax_line.grid(True, alpha=0.3)
        ax_line.set_title("head mean", fontsize=8)
        if i == L - 1:
            ax_map.set_xlabel("fraction of components k / N", fontsize=8)
            ax_line.set_xlabel("k / N", fontsize=8)
    if image is not None:
        cbar = fig.colorbar(image, cax=fig.add_subplot(gs[:, 2]))
        cbar.set_label("normalised cumulative singular value", fontsize=8)
        cbar.ax.tick_params(labelsize=7)
    what = "singular values" if result.get("power", 1) == 1 else f"singular values^{result.get('power')}"
    fig.suptitle(title or f"Cumulative {what} per head ({result.get('samples', '?')} samples)", fontsize=10)
    return _save(fig, path)


def compare_spectra(results: dict[str, dict[str, Any]], path: str | Path, layer: int | None = None) -> Path:
    """Overlay the head-mean cumulative curves of several models (``label -> analyze_model result``) in one PNG.

    One subplot per layer index (models of different depths are aligned by index; a model without that layer,
    or without a spectrum there, is left out of that subplot). ``layer`` picks a single index instead (negative
    counts from each model's own last layer, so ``-1`` compares last layers).

    Returns:
        ``path`` (written atomically). Raises ImportError without matplotlib (``pip install 'primaldual[bench]'``),
        ValueError if ``results`` is empty or ``layer`` exists in no model.
    """
    if not results:
        raise ValueError("results is empty: give at least one label -> analyze_model result")
    per_model = {label: _layers_of(r, f"results[{label!r}]") for label, r in results.items()}
    if layer is None:
        indices = list(range(max(len(v) for v in per_model.values())))
    else:
        if not any(-len(v) <= layer < len(v) for v in per_model.values()):
            raise ValueError(f"layer {layer} exists in none of the results")
        indices = [layer]
    cols = min(len(indices), 4)
    rows = math.ceil(len(indices) / cols)
    fig = _figure(0.4 + 3.0 * cols, 0.9 + 2.6 * rows)
    handles: dict[str, Any] = {}
    for j, idx in enumerate(indices):
        ax = fig.add_subplot(rows, cols, j + 1)
        ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="gray")
        mechs = []
        for k, (label, layers) in enumerate(per_model.items()):
            if not -len(layers) <= idx < len(layers) or layers[idx].get("spectrum") is None:
                continue
            entry = layers[idx]
            ys = [float("nan") if v is None else v for v in entry["spectrum"]["curve_mean"]]
            (line,) = ax.plot(_grid(len(ys)), ys, lw=1.5, color=f"C{k % 10}", label=label)
            handles.setdefault(label, line)
            mechs.append(entry["mechanism"])
        ax.set_title(f"layer {idx}" + (f" ({', '.join(dict.fromkeys(mechs))})" if mechs else ""), fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("fraction of components k / N", fontsize=8)
        if j % cols == 0:
            ax.set_ylabel("cumulative singular value", fontsize=8)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 4), fontsize=8)
    fig.suptitle("Head-mean cumulative singular values", fontsize=10)
    fig.subplots_adjust(bottom=0.2 if rows == 1 else 0.12, top=0.85 if rows == 1 else 0.92, wspace=0.3, hspace=0.5)
    return _save(fig, path)
