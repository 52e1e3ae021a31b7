"""Plot the language-modelling context study: test perplexity, time per update, and perplexity against training time.

Reads the run directories of ``lm/<corpus>/ctx{256,1024,4096}/<model>`` runs (their ``summary.json``: test
perplexity, ``tokens_per_sample``, the median step time ``train_step_seconds``; and ``history.csv``: validation
perplexity at each evaluation) and, optionally, the ``steps.json`` of ``primaldual bench steps`` over the same
configs (step times measured one config at a time, interleaved, which a run that shared its device with other runs
cannot give). Writes one figure with three panels:

1. test perplexity against tokens per sample;
2. milliseconds per update against tokens per sample (from ``steps.json`` when given, else the runs' own medians);
3. the equal-wall-clock view: validation perplexity against training seconds (evaluation step x seconds per update).

Run::

    python benchmarks/lm_context_plot.py runs/lm/english/*_ctx* --steps runs/bench/steps/steps.json \\
        --out docs/figures/lm_context.png

Hand-written on matplotlib (the ``bench`` extra): a few lines of plotting of this project's own run files.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

LABELS = {"transformer": "Transformer", "primal_plus": "Primal.+Trans.", "primalformer": "PrimalFormer"}


def _model(name: str) -> str:
    return name.rsplit("_ctx", 1)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (each with summary.json and history.csv)")
    p.add_argument("--steps", default=None, help="steps.json of `primaldual bench steps` over the same configs")
    p.add_argument("--out", default="lm_context.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for d in map(Path, args.runs):
        s = json.loads((d / "summary.json").read_text())
        with open(d / "history.csv") as f:
            hist = [(int(r["step"]), float(r["val/ppl"])) for r in csv.DictReader(f)]
        runs.append((s, hist))
    bench: dict[tuple[str, int], float] = {}
    if args.steps:
        for r in json.loads(Path(args.steps).read_text())["records"]:
            bench[(_model(r["name"]), int(r["config"].split("/ctx")[1].split("/")[0]))] = r["ms_per_step"]
    by_model: dict[str, list] = defaultdict(list)
    for s, hist in runs:
        by_model[_model(s["name"])].append((int(s["tokens_per_sample"]), s, hist))
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for model, rows in sorted(by_model.items(), key=lambda kv: list(LABELS).index(kv[0]) if kv[0] in LABELS else 9):
        rows.sort(key=lambda r: r[0])
        ctx = [r[0] for r in rows]
        label = LABELS.get(model, model)
        ax[0].plot(ctx, [r[1]["test_ppl"] for r in rows], "o-", label=label)
        ms = [bench.get((model, c), 1e3 * r[1]["train_step_seconds"]) for c, r in zip(ctx, rows)]
        ax[1].plot(ctx, ms, "o-", label=label)
        for (c, _s, hist), m in zip(rows, ms):
            style = {256: ":", 1024: "--", 4096: "-"}.get(c, "-")
            color = ax[0].lines[-1].get_color()
            ax[2].plot([st * m / 1e3 for st, _ in hist], [v for _, v in hist], style, color=color, label=f"{label} {c}")
    for a in ax[:2]:
        a.set_xscale("log", base=2)
        a.set_xlabel("tokens per sample")
    ax[0].set_ylabel("test perplexity")
    ax[1].set_ylabel("ms per update" + (" (bench steps)" if bench else " (runs' median)"))
    ax[2].set_xlabel("training seconds (updates x ms per update)")
    ax[2].set_ylabel("validation perplexity")
    ax[2].set_yscale("log")
    ax[0].legend()
    ax[2].legend(fontsize=7, ncol=1)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
