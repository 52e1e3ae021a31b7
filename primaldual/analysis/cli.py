"""``primaldual analyze RUN_DIR [RUN_DIR ...]``: spectra and head redundancy of trained checkpoints.

For each run directory written by ``primaldual fit`` (its ``config.yaml`` rebuilds the data and the model), the
chosen checkpoint is loaded, ``--samples`` examples of ``--split`` are fed through the model and
:func:`primaldual.analysis.report.analyze_model` measures every attention layer. Written to
``<run_dir>/analysis/`` (or ``--out``/<label>, the label made file-name safe; runs of one config are told apart by
their directory names): ``analysis.json`` and ``spectra.png`` (the paper-style grid of
cumulative spectra per layer and head). With several runs, ``--out`` also gets ``compare_spectra.png`` (head-mean
curves of all runs per layer) and ``summary.md`` (one row per run and layer).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from ..utils.cli import FORMATTER, examples

__all__ = ["analyze_run", "format_summary", "register"]


def analyze_run(
    run_dir: str | Path,
    *,
    ckpt: str = "best",
    split: str = "test",
    samples: int = 64,
    batch_size: int = 16,
    power: int = 1,
) -> dict[str, Any]:
    """Load a run's checkpoint and analyse it on ``samples`` examples of ``split`` (see the module docstring).

    The checkpoint is read in the safe mode (``weights_only=True``: tensors and plain data only; anything else is
    refused before it can run) and checked against the run's model.
    """
    from torch.utils.data import DataLoader

    from ..tasks.base import get_task
    from ..train.checkpoints import check_fits, load_checkpoint
    from ..train.run import build_datamodule, build_module, run_config
    from .report import analyze_model

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no config.yaml; expected a run directory written by `primaldual fit`")
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if ckpt in ("best", "last") else Path(ckpt)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found (--ckpt best, last, or a path)")
    cfg = run_config(run_dir)
    if not get_task(cfg.task).example_splits:
        raise ValueError(
            f"{run_dir}: a {cfg.task!r} run, whose data has no split of examples to feed the model (it is evaluated "
            "by rollouts); analyze reads the runs of the tasks with train / val / test examples"
        )
    state = load_checkpoint(path)["state_dict"]  # before any data is read: an unsafe file is refused first
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("test")
    if split not in dm.datasets:
        raise ValueError(f"split: {split!r} is not in this run's data (it has {sorted(dm.datasets)})")
    module = build_module(cfg, dm)
    check_fits(module, {"state_dict": state}, path, str(cfg_path))
    module.load_state_dict(state)
    loader = DataLoader(dm.datasets[split], batch_size=batch_size, shuffle=False)
    result = analyze_model(module.model, loader, max_samples=samples, power=power)
    result.update(
        run_dir=str(run_dir),
        name=cfg.name,
        task=cfg.task,
        dataset=cfg.data.name,
        protocol=cfg.protocol,
        seed=cfg.seed,
        attention=cfg.model.attention,
        checkpoint=str(path),
        split=split,
    )
    return result


def _mean(xs: list[float | None] | None) -> float | None:
    xs = [x for x in xs or [] if x is not None]
    return sum(xs) / len(xs) if xs else None


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def format_summary(results: dict[str, dict[str, Any]]) -> str:
    """Markdown table: per run and layer, head means of effective rank, k90 / k99 (components for 90% / 99% of the
    mass, absolute and as a fraction of N) and redundancy."""
    lines = [
        "| run | layer | mechanism | effective rank | k90 | k99 | rank90 / N | rank99 / N | redundancy (maps) "
        "| redundancy (outputs) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, res in results.items():
        for i, layer in enumerate(res["layers"]):
            sp = layer.get("spectrum") or {}
            red = layer.get("redundancy") or {}
            lines.append(
                f"| {label} | {i} | {layer['mechanism']} | {_fmt(_mean(sp.get('effective_rank')), '.2f')} | "
                f"{_fmt(_mean(sp.get('k90')), '.1f')} | {_fmt(_mean(sp.get('k99')), '.1f')} | "
                f"{_fmt(_mean(sp.get('rank90')))} | {_fmt(_mean(sp.get('rank99')))} | {_fmt(red.get('maps'))} | "
                f"{_fmt(red.get('outputs'))} |"
            )
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    if args.labels and len(args.labels) != len(args.runs):
        raise ValueError(f"--labels: needs {len(args.runs)} names (one per run), got {len(args.labels)}")
    if args.labels and len(set(args.labels)) != len(args.labels):
        raise ValueError(f"--labels: must be distinct, got {args.labels}")
    from ..options import check_int

    check_int("--samples", args.samples, low=1)
    check_int("--batch", args.batch, low=1)
    missing = [r for r in args.runs if not Path(r).is_dir()]
    if missing:
        raise FileNotFoundError(f"no such run directory: {', '.join(missing)}")
    import importlib.util

    from .report import INSTALL_HINT

    if importlib.util.find_spec("matplotlib") is None:  # before any run is analysed: the figures need it
        raise ImportError(INSTALL_HINT)
    from ..train.run import set_threads
    from ..utils.io import atomic_write_text
    from .report import compare_spectra, plot_spectra, write_json

    set_threads(args.threads)
    results: dict[str, dict[str, Any]] = {}
    for i, run in enumerate(args.runs):
        res = analyze_run(
            run, ckpt=args.ckpt, split=args.split, samples=args.samples, batch_size=args.batch, power=args.power
        )
        label = args.labels[i] if args.labels else res["name"]
        if label in results:  # two runs of one config (seeds, --attention overrides): name them by directory
            label = f"{label} ({Path(run).name})"
        out = Path(args.out) / _slug(label) if args.out else Path(run) / "analysis"
        write_json(res, out / "analysis.json")
        title = f"{label}: {res['dataset']} {res['split']}, {res['samples']} samples"
        plot_spectra(res, out / "spectra.png", title=title)
        print(f"{label}: wrote {out / 'analysis.json'} and {out / 'spectra.png'}", flush=True)
        results[label] = res
    table = format_summary(results)
    print(table)
    if args.out and len(results) > 1:
        out = Path(args.out)
        compare_spectra(results, out / "compare_spectra.png")
        atomic_write_text(out / "summary.md", table + "\n")
        print(f"wrote {out / 'compare_spectra.png'} and {out / 'summary.md'}")
    return 0


def _slug(label: str) -> str:
    """A directory name for a label: runs of characters other than letters, digits and ``._+-`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", label).strip("_") or "run"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``analyze`` to the ``primaldual`` parser."""
    p = subparsers.add_parser(
        "analyze",
        help="attention spectra and head redundancy of trained runs (JSON + PNG)",
        description=__doc__,
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual analyze runs/uea/JapaneseVowels/primalformer-heldout-seed0-*",
            "primaldual analyze RUN_A RUN_B --labels Transformer PrimalFormer --out runs/analysis/jv --samples 128",
        ),
    )
    p.add_argument("runs", nargs="+", help="run directories written by `primaldual fit`")
    p.add_argument("--ckpt", default="best", help="best, last, or a checkpoint path")
    p.add_argument("--split", default="test", help="data split to feed (default test)")
    p.add_argument("--samples", type=int, default=64, help="examples analysed per run")
    p.add_argument("--batch", type=int, default=16, help="batch size of the forward passes")
    p.add_argument(
        "--power",
        type=int,
        choices=(1, 2),
        default=1,
        help="1: cumulative singular values (the paper's plot); 2: cumulative explained variance",
    )
    p.add_argument("--labels", nargs="+", default=None, help="one name per run (default: the run's config name)")
    p.add_argument("--out", default=None, help="output folder (default <run_dir>/analysis; needed to compare runs)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.set_defaults(func=_cmd)
