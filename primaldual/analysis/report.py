"""Spectrum and head-redundancy report of any model's attention layers: the core of ``primaldual analyze``.

What is analysed, and why: the Primal-Attention paper (Chen et al., NeurIPS 2023) argues that attention matrices
are low rank, so a rank-s primal representation loses little. Its figure plots, per layer and head, the
**normalised cumulative singular values** ``c_k = sum_{i<=k} s_i / sum_i s_i`` of the attention matrix against
the fraction of components ``k / N``: a curve that reaches 1 early means a low-rank (redundant) matrix. The SVR
paper (Nguyen et al., ICLR 2023) argues that Attention-BN / -SH make heads less redundant. This module gathers
both, per attention layer, over a few batches of real data:

* the spectrum statistics of :func:`primaldual.analysis.spectrum.layer_spectra`: per-head curves on a common
  ``k / N`` grid (``curve``, the paper's axis) and against the absolute component index k = 1..K (``curve_k``,
  the first ``k_max`` = 64 components by default), effective rank, and the components needed for 90% / 99% of
  the mass both as fractions of N (``rank90`` / ``rank99``) and as counts (``k90`` / ``k99``), and
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

**The figure** (:func:`plot_spectra`, one row per layer): a heat map of ``1 - c_k`` (the mass beyond the first
k components) per head on a log colour scale, over k on a log axis, with each head's k90 / k99 marked; the
head-mean ``c_k`` against k (log axis); and the head-mean curve against ``k / N`` as in the paper. Why: with
N of a few hundred tokens and attention of rank 1-5, the ``k / N`` curve reaches 1 within the first 2% of the
axis and a linear [0, 1] colour scale shows one colour; a log k axis gives k = 1, 2, 5, 10, 50 equal room, and
a log scale of ``1 - c_k`` gives 90%, 99% and 99.9% of the mass each its own colour band, so "saturates almost
at once" (k = 1-2, the paper's claim for Primal.+'s last layer) is readable for N = 50 (ViT) and 197 (DeiT)
alike. :func:`compare_spectra` overlays several runs' head-mean ``c_k`` on the same log k axis (or ``k / N``).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionLayer
from ..utils.io import atomic_write_bytes, atomic_write_json
from .capture import capture_attention
from .redundancy import head_redundancy
from .spectrum import first_k, layer_spectra

__all__ = ["INSTALL_HINT", "analyze_model", "compare_spectra", "plot_spectra", "write_json"]

INSTALL_HINT = "plotting needs matplotlib: pip install 'primaldual[bench]'"


_MEAN_KEYS = ("curve", "effective_rank", "rank90", "rank99", "k90", "k99", "tokens")


@dataclass
class _SpectrumAcc:
    """Per-layer running sums (over samples with >= 2 real tokens) of the :func:`layer_spectra` statistics."""

    mechanism: str
    weights_meaning: str
    num_heads: int
    sums: dict[str, Tensor] = field(default_factory=dict)  # key -> sample-weighted sum; curve_k (H, K) grows
    count: int = 0

    def add(self, weights: Tensor, mask: Tensor | None, points: int, power: int, k_max: int) -> None:
        """Add one call's ``(B, H, N, N)`` weights with its ``(B, N)`` mask (True = real token) or None."""
        B, _, N, _ = weights.shape
        # layer_spectra averages over the samples it keeps (those with >= 2 real tokens); weight by that count
        n_ok = int((mask.sum(-1) >= 2).sum()) if mask is not None else (B if N >= 2 else 0)
        if n_ok == 0:
            return
        stats = layer_spectra(weights, mask, points=points, power=power, k_max=k_max)
        for key in (*_MEAN_KEYS, "curve_k"):
            s = stats[key].double() * n_ok
            prev = self.sums.get(key)
            if prev is not None and key == "curve_k" and prev.shape[-1] != s.shape[-1]:
                # calls with fewer tokens give shorter curves; every sample in the shorter sum has saturated at
                # its last column, so extending it by that column keeps the sum exact
                K = max(prev.shape[-1], s.shape[-1])
                prev, s = first_k(prev, K), first_k(s, K)
            self.sums[key] = s if prev is None else prev + s
        self.count += n_ok

    def result(self) -> dict[str, Any] | None:
        if self.count == 0 or not self.sums:
            return None
        mean = {key: v / self.count for key, v in self.sums.items()}
        return {
            "curve": _floats(mean["curve"]),
            "curve_mean": _floats(mean["curve"].mean(0)),
            "effective_rank": _floats(mean["effective_rank"]),
            "rank90": _floats(mean["rank90"]),
            "rank99": _floats(mean["rank99"]),
            "curve_k": _floats(mean["curve_k"]),
            "curve_k_mean": _floats(mean["curve_k"].mean(0)),
            "k90": _floats(mean["k90"]),
            "k99": _floats(mean["k99"]),
            "tokens": _floats(mean["tokens"]),
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
    k_max: int = 64,
) -> dict[str, Any]:
    """Spectrum and head-redundancy statistics of every attention layer of ``model`` over a few batches.

    The model is put in eval mode (its training flag is restored afterwards) and run under ``torch.no_grad()``
    as ``model(*batch[:-1])`` for each ``(*inputs, y)`` batch: e.g. ``(x (B, N, C), mask (B, N) bool, y)`` for a
    sequence model or ``(images (B, C, H, W), y)`` for a vision model (tensors must already be on the model's
    device and of the dtype it takes). The number of tokens N is whatever the layers see (e.g. 1 + patches with
    a CLS token); without a mask every token is real. Batches are cut along dim 0 so that at most
    ``max_samples`` samples are fed in total. A layer called several times per forward (e.g. a shared encoder in
    a two-tower model) is aggregated over all its calls into one entry.

    Args:
        model: any module containing :class:`~primaldual.attention.base.AttentionLayer` layers at any depth.
        batches: iterable of ``(*inputs, y)`` tuples (e.g. a DataLoader); ``y`` is ignored.
        max_samples: stop after this many samples.
        points: resolution of the cumulative-spectrum curves on the ``k / N`` grid ``1/points, ..., 1``.
        power: 1 = cumulative singular values (the paper's plot), 2 = cumulative explained variance.
        k_max: length of the absolute-index curves ``curve_k`` (the first ``k_max`` components, or all if the
            sequences are shorter).

    Returns:
        A JSON-serialisable dict ``{"layers": [...], "samples": int, "points": int, "power": int, "k_max": int}``;
        each layer (in the order layers are first called) is ``{"name", "mechanism", "weights_meaning",
        "num_heads", "spectrum", "redundancy"}`` with ``spectrum`` = ``{"curve": H lists of points floats (on
        the k / N grid), "curve_mean" (points,), "effective_rank" (absolute, per head), "rank90", "rank99"
        (fractions of the real tokens, per head), "curve_k": H lists of K floats (c_k at k = 1..K,
        K = min(k_max, most real tokens)), "curve_k_mean" (K,), "k90", "k99" (absolute numbers of components for
        90% / 99% of the mass, per head), "tokens" (mean number of real tokens n)}`` averaged over the samples
        with at least 2 real tokens (None if the mechanism returns no weights or no such sample was seen), and
        ``redundancy`` = ``{"maps": float | None, "outputs": float | None}``.

    Raises:
        ValueError: ``model`` has no attention layer (or none ran), ``batches`` is empty, or a bad argument.
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, AttentionLayer)}
    if not layers:
        raise ValueError(f"model ({type(model).__name__}) contains no primaldual attention layer to analyse")
    for arg, v in (("max_samples", max_samples), ("points", points), ("power", power), ("k_max", k_max)):
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
                        acc.add(rec.weights, rec.mask, points, power, k_max)
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
    return {"layers": out_layers, "samples": samples, "points": points, "power": power, "k_max": k_max}


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    """Write ``result`` (e.g. from :func:`analyze_model`) as indented JSON, atomically; returns the path."""
    return atomic_write_json(path, result, indent=2, allow_nan=False)


def _figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas (object API: no pyplot, no global backend switch)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(INSTALL_HINT) from e
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


def _nan(values: list) -> list[float]:
    """JSON lists (None = non-finite) -> floats with NaN."""
    return [float("nan") if v is None else v for v in values]


def _head_mean(values: list | None) -> float | None:
    xs = [v for v in values or [] if v is not None]
    return sum(xs) / len(xs) if xs else None


_FLOOR = 1e-3  # heat-map floor of 1 - c_k: a head with 99.9% of its mass in the first k components is saturated
_K_TICKS = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)


def _k_axis(ax, K: int) -> None:
    """Log-scaled x axis over the component index k = 1..K with plain-number ticks."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_xlim(0.5, K + 0.5)  # cell edges of the heat map; the curve's points sit at the cell centres
    ticks = [t for t in _K_TICKS if t <= K]
    if K / ticks[-1] > 1.3:
        ticks.append(K)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _heat(ax, curves: list[list], x_edges: list[float]):
    """Heat map of ``1 - c`` (mass not yet covered) per head on a log colour scale floored at ``_FLOOR``.

    On a linear [0, 1] colour scale c = 0.9, 0.99 and 1 look alike; on a log scale of ``1 - c`` each decade
    (90%, 99%, 99.9% of the mass) is its own colour band, so heads that saturate after 1 or after 5
    components can be told apart.
    """
    import numpy as np
    from matplotlib.colors import LogNorm

    rest = np.clip(1.0 - np.asarray([_nan(row) for row in curves], dtype=float), _FLOOR, 1.0)  # NaN stays NaN
    H = rest.shape[0]
    mesh = ax.pcolormesh(
        np.asarray(x_edges),
        np.arange(H + 1) - 0.5,
        np.ma.masked_invalid(rest),
        cmap="viridis_r",  # saturated = bright, as c = 1 was on the old linear map
        norm=LogNorm(vmin=_FLOOR, vmax=1.0),
        shading="flat",
    )
    ax.set_ylim(H - 0.5, -0.5)
    ax.set_yticks(range(H))
    ax.set_ylabel("head", fontsize=8)
    ax.tick_params(labelsize=7)
    return mesh


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_spectra(result: dict[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Draw the Primal-Attention-style spectrum figure of one :func:`analyze_model` result as a PNG.

    One row per layer, three panels:

    1. heat map, x = component index k = 1..K on a **log** axis, y = head, colour = ``1 - c_k`` (mass beyond
       the first k components) on a log scale from 1 (nothing covered) to ``1e-3`` (saturated), with each
       head's ``k90`` (circle) and ``k99`` (square) marked;
    2. head-mean ``c_k`` against k (log axis), with a flat spectrum of the mean length n (``k / n``) dashed;
    3. head-mean ``c`` against the fraction ``k / N`` (the paper's axis) with the flat diagonal.

    Why a log k axis rather than ``k / N`` or a linear first-k axis: with N = 200-300 tokens and attention of
    rank 1-5, the ``k / N`` curve reaches 1 within the first 2% of the width, and on a linear axis over the
    first 64 components k = 1..5 still take only 7% of it. A log axis gives k = 1, 2, 5, 10, 50 equal room,
    so "saturates at once" (k = 1-2) and "needs 40 components" are both resolved in one figure, for N = 50
    (ViT on 28x28 images with 4x4 patches) as for N = 1000. Results without first-k curves (written before
    they existed) fall back to the ``k / N`` axis in the heat map. Layers without a spectrum get an empty row.

    Returns:
        ``path`` (written atomically). Raises ImportError without matplotlib (``pip install 'primaldual[bench]'``).
    """
    layers = _layers_of(result, "result")
    L = len(layers)
    height = 0.8 + 1.6 * L
    top, bottom = 1 - 0.7 / height, 0.45 / height  # fixed inch margins for the title and the x labels
    fig = _figure(11.0, height)
    gs = fig.add_gridspec(L, 3, width_ratios=[2.6, 1.5, 1.3], wspace=0.3, hspace=0.65)
    gs.update(left=0.06, right=0.88, top=top, bottom=bottom)
    mesh, marked = None, False
    for i, layer in enumerate(layers):
        ax_map, ax_k, ax_frac = (fig.add_subplot(gs[i, j]) for j in range(3))
        ax_map.set_title(f"{layer['name'] or '<model>'} ({layer['mechanism']})", fontsize=8, loc="left")
        spec = layer.get("spectrum")
        if spec is None:
            for ax in (ax_map, ax_k, ax_frac):
                _empty(ax, "no weights")
            continue
        curve_k = spec.get("curve_k")
        if curve_k:  # 1 - c_k on the log k axis
            K = len(curve_k[0])
            mesh = _heat(ax_map, curve_k, [k + 0.5 for k in range(K + 1)])
            _k_axis(ax_map, K)
            for key, marker in (("k90", "o"), ("k99", "s")):
                if spec.get(key):
                    ks = [float("nan") if v is None else min(v, K) for v in spec[key]]
                    ax_map.scatter(
                        ks,
                        range(len(ks)),
                        marker=marker,
                        s=14,
                        c="white",
                        edgecolors="black",
                        linewidths=0.6,
                        label=key,
                        zorder=3,
                        clip_on=False,  # a k99 beyond K sits on the right edge
                    )
            if not marked:
                ax_map.legend(
                    fontsize=6, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False, borderaxespad=0.1
                )
                marked = True
            ys = _nan(spec["curve_k_mean"])
            ks = list(range(1, K + 1))
            ax_k.plot(ks, ys, lw=1.5, marker="." if K <= 64 else None, ms=3)
            n = spec.get("tokens")
            if n:
                ax_k.plot(ks, [min(k / n, 1.0) for k in ks], ls="--", lw=0.8, color="gray")
            ax_k.axhline(0.9, ls=":", lw=0.8, color="gray")
            _k_axis(ax_k, K)
            ax_k.set_ylim(0, 1.05)
            ax_k.tick_params(labelsize=7)
            ax_k.grid(True, alpha=0.3)
            k90, k99 = _head_mean(spec.get("k90")), _head_mean(spec.get("k99"))
            ax_k.set_title(
                "head mean"
                + (f": k90 {k90:.1f}, k99 {k99:.1f}" if k90 is not None and k99 is not None else "")
                + (f" (n {n:.0f})" if n else ""),
                fontsize=7,
            )
        else:  # an older result: only the k / N grid
            P = len(spec["curve"][0])
            mesh = _heat(ax_map, spec["curve"], [j / P for j in range(P + 1)])
            ax_map.set_xlim(0, 1)
            _empty(ax_k, "no first-k curve\n(older analysis.json)")
        ax_frac.plot(_grid(len(spec["curve_mean"])), _nan(spec["curve_mean"]), lw=1.5)
        ax_frac.plot([0, 1], [0, 1], ls="--", lw=0.8, color="gray")
        ax_frac.set_xlim(0, 1)
        ax_frac.set_ylim(0, 1.05)
        ax_frac.tick_params(labelsize=7)
        ax_frac.grid(True, alpha=0.3)
        ax_frac.set_title("head mean", fontsize=7)
        if i == L - 1:
            ax_map.set_xlabel("component k (log)" if curve_k else "fraction of components k / N", fontsize=8)
            ax_k.set_xlabel("component k (log)", fontsize=8)
            ax_frac.set_xlabel("fraction k / N", fontsize=8)
    if mesh is not None:
        cbar = fig.colorbar(mesh, cax=fig.add_axes((0.9, bottom, 0.01, top - bottom)))
        cbar.set_label(f"1 - c_k: mass beyond the first k (log; {_FLOOR:g} = saturated)", fontsize=8)
        cbar.ax.tick_params(labelsize=7)
    what = "singular values" if result.get("power", 1) == 1 else f"singular values^{result.get('power')}"
    fig.suptitle(title or f"Cumulative {what} c_k per head ({result.get('samples', '?')} samples)", fontsize=10)
    return _save(fig, path)


def compare_spectra(
    results: dict[str, dict[str, Any]], path: str | Path, layer: int | None = None, axis: str = "k"
) -> Path:
    """Overlay the head-mean cumulative curves of several models (``label -> analyze_model result``) in one PNG.

    One subplot per layer index (models of different depths are aligned by index; a model without that layer,
    or without a spectrum there, is left out of that subplot). ``layer`` picks a single index instead (negative
    counts from each model's own last layer, so ``-1`` compares last layers).

    Args:
        axis: ``"k"`` (default) plots ``c_k`` against the component index k = 1..K on a log axis (readable for
            long sequences and low rank, see :func:`plot_spectra`); ``"fraction"`` against ``k / N`` (the
            paper's axis; also works for results written before the first-k curves existed).

    Returns:
        ``path`` (written atomically). Raises ImportError without matplotlib (``pip install 'primaldual[bench]'``),
        ValueError if ``results`` is empty, ``layer`` exists in no model, ``axis`` is unknown, or ``axis="k"``
        and a result has no first-k curves.
    """
    if not results:
        raise ValueError("results is empty: give at least one label -> analyze_model result")
    if axis not in ("k", "fraction"):
        raise ValueError(f"axis must be 'k' or 'fraction', got {axis!r}")
    per_model = {label: _layers_of(r, f"results[{label!r}]") for label, r in results.items()}
    if axis == "k":
        for label, layers in per_model.items():
            if any(e.get("spectrum") is not None and not e["spectrum"].get("curve_k") for e in layers):
                raise ValueError(
                    f"results[{label!r}] has no first-k curves (written by an older version): re-run "
                    "`primaldual analyze` or pass axis='fraction'"
                )
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
        if axis == "fraction":
            ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="gray")
        else:
            ax.axhline(0.9, ls=":", lw=0.8, color="gray")
        mechs, K = [], 1
        for k, (label, layers) in enumerate(per_model.items()):
            if not -len(layers) <= idx < len(layers) or layers[idx].get("spectrum") is None:
                continue
            entry = layers[idx]
            if axis == "fraction":
                ys = _nan(entry["spectrum"]["curve_mean"])
                xs = _grid(len(ys))
            else:
                ys = _nan(entry["spectrum"]["curve_k_mean"])
                xs = list(range(1, len(ys) + 1))
                K = max(K, len(ys))
            (line,) = ax.plot(xs, ys, lw=1.5, color=f"C{k % 10}", label=label)
            handles.setdefault(label, line)
            mechs.append(entry["mechanism"])
        ax.set_title(f"layer {idx}" + (f" ({', '.join(dict.fromkeys(mechs))})" if mechs else ""), fontsize=8)
        if axis == "fraction":
            ax.set_xlim(0, 1)
        else:
            _k_axis(ax, K)
        ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("fraction of components k / N" if axis == "fraction" else "component k (log)", fontsize=8)
        if j % cols == 0:
            ax.set_ylabel("cumulative singular value", fontsize=8)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 4), fontsize=8)
    fig.suptitle("Head-mean cumulative singular values c_k", fontsize=10)
    fig.subplots_adjust(bottom=0.2 if rows == 1 else 0.12, top=0.85 if rows == 1 else 0.92, wspace=0.3, hspace=0.5)
    return _save(fig, path)
