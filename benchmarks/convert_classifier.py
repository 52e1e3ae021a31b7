"""Convert trained softmax classifiers to primal attention and set each conversion beside its controls.

For every teacher run given (finished ``primaldual fit`` runs of a softmax classifier, e.g.
``vision/fashion_mnist/reduced/deit`` with seeds 0-2), the phases are ``primaldual convert`` runs of the teacher with
the shipped conversion config of its dataset (or ``--config``), each in its own run directory under ``--out``:

* ``primal_plus``: the config as it is (the last layer primal, the teacher initialisation, stage 1, stage 2);
* ``swap``: the same student and stage 2, without the initialisation and stage 1 (``--init random
  --stage1.steps 0``): swap and finetune;
* ``fixed``: as ``primal_plus`` with data-independent ``W_e, W_r`` (``data_dependent: false``: the KSVD
  initialisation is exact, but each token's output depends on that token alone);
* ``all`` and ``all_swap``: every layer primal (PrimalFormer by conversion), with and without transfer;
* ``control``: the teacher itself given the same stage 2 (its own softmax layers, its weights, the conversion's
  run-config overrides), so that what stage 2 alone adds is not read as the conversion's.

Each phase is a run directory, so a killed run resumes where it was and a rerun reports the finished ones. The table
(test accuracy per phase and teacher, mean and spread) is printed and written to ``--out/table.md``. One core per
phase (``--threads``); run nothing else beside it when its timings matter (they are not reported here)::

    python benchmarks/convert_classifier.py runs/vision/fashion_mnist/deit_reduced-heldout-seed{0,1,2}-* \
        --out runs/convert_vision

Written by hand: an experiment driver around ``primaldual convert`` and ``fit``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from primaldual.tasks.conversion import load_convert_config, load_teacher  # noqa: E402
from primaldual.tasks.convert_classifier import (  # noqa: E402
    ClassifierConvertConfig,
    convert_classifier_run,
)
from primaldual.train.rundir import run_config  # noqa: E402
from primaldual.utils.io import atomic_write_text  # noqa: E402

PHASES = ("primal_plus", "swap", "fixed", "all", "all_swap", "control")


def _overrides(phase: str, conv: ClassifierConvertConfig) -> list[tuple[str, Any]]:
    random = [("init", "random"), ("stage1.steps", 0)]
    if phase == "swap":
        return random
    if phase == "fixed":
        keep = {k: v for k, v in conv.options.items() if k not in ("n", "rank_multi", "max_len")}
        return [("options", {**keep, "data_dependent": False})]
    if phase == "all":
        return [("layers", "all")]
    if phase == "all_swap":
        return [("layers", "all"), *random]
    return []


def _control(teacher_dir: Path, conv: ClassifierConvertConfig, seed: int, run_dir: Path) -> dict[str, Any]:
    """The teacher given the conversion's stage 2: same overrides, its own layers and weights."""
    from primaldual.train.config import apply_overrides
    from primaldual.train.run import fit
    from primaldual.train.validate import validate_config

    tcfg = run_config(teacher_dir)
    flat: dict[str, Any] = {}

    def walk(tree: dict[str, Any], prefix: str = "") -> None:
        for k, v in tree.items():
            walk(v, f"{prefix}{k}.") if isinstance(v, dict) else flat.__setitem__(f"{prefix}{k}", v)

    walk(conv.stage2)
    sets = {"name": f"{tcfg.name}-control", "seed": seed, **flat}
    cfg = validate_config(apply_overrides(tcfg, [a for k, v in sets.items() for a in (f"--{k}", json.dumps(v))]))
    _, _, module, _ = load_teacher(teacher_dir)
    weights = module.model.state_dict()

    def start(mod: Any, rd: Path, resuming: bool) -> None:
        if not resuming:
            mod.model.load_state_dict(weights)

    return fit(cfg, run_dir, before_training=start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("teachers", nargs="+", help="finished softmax classifier runs")
    p.add_argument("--out", required=True, help="folder for the phases' run directories and table.md")
    p.add_argument("--config", default=None, help="conversion config (default: the dataset's shipped primal_plus)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    phases = [x for x in args.phases.split(",") if x]
    if bad := sorted(set(phases) - set(PHASES)):
        raise SystemExit(f"--phases: unknown {bad}; choose from {PHASES}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    for teacher in map(Path, args.teachers):
        summary = json.loads((teacher / "summary.json").read_text())
        row = {"teacher": summary["test_acc"]}
        conv = load_convert_config(args.config or _default(teacher), [], ClassifierConvertConfig)
        for phase in phases:
            rd = out / f"{teacher.name}-{phase}"
            if phase == "control":
                row[phase] = _control(teacher, conv, args.seed, rd)["test_acc"]
                continue
            overrides = _overrides(phase, conv)
            row[phase] = convert_classifier_run(teacher, args.config, overrides=overrides, seed=args.seed, run_dir=rd)[
                "test_acc"
            ]
        results[teacher.name] = row
        print(json.dumps({teacher.name: row}), flush=True)
    cols = ["teacher", *phases]
    lines = ["| teacher run | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, row in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{100 * row[c]:.2f}" for c in cols) + " |")
    if len(results) > 1:
        cells = []
        for c in cols:
            vals = [100 * r[c] for r in results.values()]
            cells.append(f"{statistics.mean(vals):.2f} +- {statistics.stdev(vals):.2f}")
        lines.append("| mean +- std | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    atomic_write_text(out / "table.md", table)
    print(table)
    return 0


def _default(teacher: Path) -> str:
    """The shipped ``primal_plus`` conversion of the teacher's family and dataset."""
    tcfg = run_config(teacher)
    return f"{tcfg.task.split('_')[0]}/{tcfg.data.name}/convert/primal_plus"


if __name__ == "__main__":
    sys.exit(main())
