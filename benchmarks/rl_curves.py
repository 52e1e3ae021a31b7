"""Plot offline-RL runs: normalised score against training step, mean +- std over seeds, one panel per dataset and
target return, with the behaviour policy's score.

Reads the run directories of ``primaldual fit`` runs of task ``offline_rl`` (``config.yaml``: dataset, model name,
seed; ``history.csv``: the normalised score at each evaluation; ``summary.json`` when the run finished: the behaviour
policy's score). Runs of the same dataset and config ``name`` (``dt``, ``primal_plus``, ``hf_dt``) are seeds of one
curve; a seed that stopped early contributes the evaluations it reached. Run::

    python benchmarks/rl_curves.py runs/offline_rl/* --out docs/figures/rl_medium_scores.png

Hand-written on matplotlib (the ``bench`` extra): a few lines of plotting of this project's own run files.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

LABELS = {"dt": "Decision Transformer", "primal_plus": "Primal.+DT", "hf_dt": "HF DecisionTransformerModel"}


def _read(run: Path) -> tuple[str, str, dict[str, dict[int, float]], float | None]:
    """(dataset, config name, {target: {step: score}}, behaviour score or None) of one run directory."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    scores: dict[str, dict[int, float]] = defaultdict(dict)
    with open(run / "history.csv", newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                key = key.removeprefix("val/")  # val/target<t>/...; runs of the old offline-RL loop: target<t>/...
                if key.startswith("target") and key.endswith("/normalized_score_mean") and value:
                    scores[key.split("/")[0].removeprefix("target")][int(row["step"])] = float(value)
    behaviour = None
    if (run / "summary.json").is_file():
        b = json.loads((run / "summary.json").read_text()).get("behaviour_policy") or {}
        behaviour = b.get("normalized_score_mean")
    return cfg["data"]["name"], cfg["name"], scores, behaviour


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (config.yaml, history.csv; summary.json if finished)")
    p.add_argument("--out", default="rl_scores.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # (dataset, target) -> model -> step -> [score per seed]
    curves: dict[tuple[str, str], dict[str, dict[int, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    behaviour: dict[str, float] = {}
    for run in map(Path, args.runs):
        if not (run / "history.csv").is_file():
            raise SystemExit(f"{run}: no history.csv; expected an offline_rl run directory")
        dataset, name, scores, b = _read(run)
        if b is not None:
            behaviour[dataset] = b
        for target, by_step in scores.items():
            for step, score in by_step.items():
                curves[(dataset, target)][name][step].append(score)
    panels = sorted(curves, key=lambda k: (k[0], -float(k[1])))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (dataset, target) in zip(axes[0], panels, strict=True):
        for name, by_step in sorted(curves[(dataset, target)].items()):
            steps = sorted(by_step)
            mean = [statistics.fmean(by_step[s]) for s in steps]
            std = [statistics.stdev(by_step[s]) if len(by_step[s]) > 1 else 0.0 for s in steps]
            seeds = max(len(v) for v in by_step.values())
            ax.errorbar(steps, mean, yerr=std, marker="o", capsize=3, label=f"{LABELS.get(name, name)} ({seeds} seeds)")
        if dataset in behaviour:
            ax.axhline(behaviour[dataset], color="gray", ls="--", label=f"behaviour policy ({behaviour[dataset]:.1f})")
        ax.set_title(f"{dataset}, target return {float(target):,.0f}")
        ax.set_xlabel("training step")
        ax.set_ylabel("D4RL normalised score")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
