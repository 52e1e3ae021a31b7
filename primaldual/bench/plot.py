"""Plot a layer sweep from its JSON file: log-log time and peak memory vs N with fitted slopes.

Plotting is a separate step from measuring so figures can be redrawn from recorded files.
"""

from __future__ import annotations

import json
from pathlib import Path

from .layers import fit_slope

__all__ = ["plot_layers"]


def plot_layers(path: str | Path, out_dir: str | Path | None = None, min_length: int = 4096) -> list[Path]:
    """Draw ``<stem>_time.png`` and ``<stem>_memory.png`` (one line per mechanism and mode); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        data = json.loads(path.read_text())
        records = [r for r in data["records"] if r.get("status") == "ok"]
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(
            f"{path}: not a results file of `primaldual bench layers` (expected its JSON with 'records'; {e})"
        ) from None
    out_dir = Path(out_dir) if out_dir else path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric, label in (("time_ms", "time per call (ms)"), ("peak_mem_mb", "peak activation memory (MB)")):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
        for ax, mode in zip(axes, ("fwd", "fwd_bwd")):
            for attn in sorted({r["attention"] for r in records}):
                rs = sorted(
                    (r for r in records if r["attention"] == attn and r["mode"] == mode), key=lambda r: r["length"]
                )
                if not rs:
                    continue
                xs = [r["length"] for r in rs]
                ys = [max(r[metric], 1e-3) for r in rs]
                big = [(x, y) for x, y in zip(xs, ys) if x >= min_length]
                slope = fit_slope([p[0] for p in big], [p[1] for p in big])
                tag = f"{attn} (slope {slope:.2f})" if slope is not None else attn
                ax.plot(xs, ys, marker="o", label=tag)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(label)
            ax.set_title(f"{mode}  (slopes fitted for N >= {min_length})")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        s = data.get("settings", {})
        m = data.get("machine", {})
        fig.suptitle(
            f"B={s.get('batch')} dim={s.get('dim')} heads={s.get('heads')} {s.get('dtype')} on "
            f"{m.get('device')} ({m.get('cpu', '')[:40]}, torch {m.get('torch')})",
            fontsize=9,
        )
        fig.tight_layout()
        name = "time" if metric == "time_ms" else "memory"
        target = out_dir / f"{path.stem}_{name}.png"
        fig.savefig(target, dpi=90)
        plt.close(fig)
        written.append(target)
    return written
