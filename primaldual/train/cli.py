"""``primaldual fit | validate | test | seeds | configs | generate``: the training subcommands.

``fit`` / ``validate`` / ``test`` follow Lightning CLI conventions: ``--config FILE_OR_NAME`` plus dotted
overrides such as ``--model.attention softmax`` or ``--trainer.devices=2``; ``--attention NAME`` runs any
registered attention in every layer; ``--print-config`` prints the resolved config and exits. ``validate`` /
``test --run-dir RUN`` without ``--config`` evaluate the run with its own ``config.yaml``. ``generate RUN_DIR
--prompt TEXT`` continues a text with the language model of a run (task ``lm``).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..utils.cli import FORMATTER, examples

__all__ = ["register"]

DEFAULT_CONFIG = "uea/default"


def _reference() -> str:
    """Overrides, attentions and bundled configs, for the ``--help`` of the training subcommands."""
    from ..attention import list_attentions

    try:
        from .config import list_configs
    except ImportError as e:  # the 'train' extra is missing: help still works, training will say what to install
        return f"(training needs the 'train' extra: pip install 'primaldual[train]'; {e})"
    names = ", ".join(i.name for i in list_attentions())
    configs = "\n  ".join(list_configs()) or "(none found)"
    return (
        "overrides: --section.key VALUE (values are YAML), e.g. --model.attention softmax --trainer.max_epochs 5 "
        "--seed 1 --protocol paper --trainer.devices 2 --trainer.strategy ddp\n"
        "  --attention NAME puts NAME in every layer and drops the config's mechanism options\n"
        f"attentions: {names}\nconfigs (--config NAME, or a path):\n  {configs}"
    )


def _common(p: argparse.ArgumentParser, evaluates: bool = False) -> None:
    default = f"the run's own config.yaml with --run-dir, else {DEFAULT_CONFIG}" if evaluates else f"{DEFAULT_CONFIG}"
    p.add_argument("--config", "-c", default=None, help=f"config file or name (default: {default})")
    p.add_argument("--run-dir", default=None, help="run directory (default runs/<task>/<dataset>/<name>-...)")
    _config_dir(p)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved config (YAML) and exit without running"
    )
    p.set_defaults(accepts_overrides=True)


def _config_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config-dir",
        default=None,
        help="a folder of your own configs, searched before ./configs and the configs shipped with primaldual",
    )


def _spec(args: argparse.Namespace) -> str:
    """The config to use: ``--config``; for validate / test with ``--run-dir`` only, the run's ``config.yaml``."""
    if args.config is not None:
        return args.config
    if args.command in ("validate", "test") and args.run_dir is not None:
        from pathlib import Path

        run_dir = Path(args.run_dir)
        if not run_dir.is_dir():
            raise FileNotFoundError(f"run directory {run_dir} not found")
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(
                f"{run_dir}: no config.yaml (not a run directory written by `primaldual fit`); pass --config"
            )
        return str(saved)
    return DEFAULT_CONFIG


def _load(args: argparse.Namespace):
    from .config import load_config

    return load_config(_spec(args), getattr(args, "overrides", []), args.config_dir)


def _print_config(args: argparse.Namespace) -> int:
    """``--print-config``: the files the config is composed of and the overrides as comments, then the YAML."""
    from . import config

    cfg = _load(args)
    describe = getattr(config, "describe_config", None)
    files = list(describe(_spec(args), args.config_dir)) if describe is not None else []
    if files:
        print("# composed from (first to last):")
        for f in files:
            print(f"#   {f}")
    if getattr(args, "overrides", []):
        print(f"# overrides: {' '.join(shlex.quote(a) for a in args.overrides)}")
    print(config.dump_config(cfg), end="")
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    from .run import fit, set_threads

    set_threads(args.threads)  # checked before the config is read (and before --print-config)
    if args.print_config:
        return _print_config(args)
    cfg = _load(args)
    set_threads(args.threads, workers=cfg.data.num_workers)  # warns when threads + workers exceed the cores
    fit(cfg, args.run_dir, fresh=args.fresh)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from .run import evaluate, set_threads

    set_threads(args.threads)  # checked before the config is read (and before --print-config)
    if args.print_config:
        return _print_config(args)
    cfg = _load(args)
    set_threads(args.threads, workers=cfg.data.num_workers)
    res = evaluate(cfg, args.command, args.ckpt, args.run_dir)
    for k, v in res[0].items():
        print(f"{k}: {v:.4f}")
    return 0


def _cmd_seeds(args: argparse.Namespace) -> int:
    from ..options import check_int
    from .seeds import format_table, run_seeds

    check_int("--jobs", args.jobs, low=1)
    check_int("--threads", args.threads, low=1, allow_none=True)

    summaries = run_seeds(
        args.configs,
        args.seeds,
        args.protocols,
        getattr(args, "overrides", []),
        base=args.base,
        jobs=args.jobs,
        config_dir=args.config_dir,
        threads=args.threads,
    )
    table = format_table(summaries, "primaldual " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    print(table)
    if args.out:
        from ..utils.io import atomic_write_text

        atomic_write_text(args.out, table + "\n")
    return 0


def _cmd_configs(args: argparse.Namespace) -> int:
    from .config import list_configs, search_path

    print(f"configs under {', '.join(map(str, search_path(args.config_dir)))} (first wins):")
    for name in list_configs(config_dir=args.config_dir):
        print(f"  {name}")
    print("conversion configs (primaldual convert -c NAME): listed by `primaldual convert --help`")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the training subcommands to the ``primaldual`` parser."""
    reference = _reference()
    p = subparsers.add_parser(
        "fit",
        help="train (resumes from the run's last.ckpt)",
        formatter_class=FORMATTER,
        allow_abbrev=False,
        epilog=examples(
            "primaldual fit --config uea/JapaneseVowels/primalformer",
            "primaldual fit -c uea/JapaneseVowels/transformer --attention linear --trainer.max_epochs 5 --seed 1",
            "primaldual fit -c lra/listops/reduced/primalformer --threads 1 --run-dir runs/listops_pf",
            "primaldual fit -c uea/JapaneseVowels/primalformer --model.dim 128 --print-config",
            note=reference,
        ),
    )
    _common(p)
    p.add_argument(
        "--fresh", action="store_true", help="delete the run directory and start over (refused while a run holds it)"
    )
    p.set_defaults(func=_cmd_fit)
    for stage in ("validate", "test"):
        p = subparsers.add_parser(
            stage,
            help=f"{stage} a checkpoint of a run",
            formatter_class=FORMATTER,
            allow_abbrev=False,
            epilog=examples(
                f"primaldual {stage} --config uea/JapaneseVowels/primalformer --ckpt best",
                f"primaldual {stage} --run-dir runs/jv_pf --ckpt last      # the run's own config.yaml",
                note=reference,
            ),
        )
        _common(p, evaluates=True)
        p.add_argument("--ckpt", default="best", help="best, last, or a checkpoint path")
        p.set_defaults(func=_cmd_eval)
    p = subparsers.add_parser(
        "seeds",
        help="several configs x protocols x seeds -> mean +- std table",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual seeds --configs uea/JapaneseVowels/transformer uea/JapaneseVowels/primalformer",
            "primaldual seeds --configs uea/JapaneseVowels/transformer --seeds 0 1 2 3 4 --protocols heldout "
            "--jobs 2 --threads 1 --out results.md --trainer.max_epochs 30",
            note=reference.replace("--seed 1 --protocol paper ", ""),  # seeds sets them from --seeds / --protocols
        ),
    )
    p.add_argument("--configs", nargs="+", required=True, help="config files or names")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--protocols", nargs="+", default=["heldout", "paper"], choices=["heldout", "paper"])
    p.add_argument("--base", default="runs", help="root of the run directories")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run")
    p.add_argument("--out", default=None, help="also write the Markdown table to this file")
    _config_dir(p)
    p.set_defaults(func=_cmd_seeds, accepts_overrides=True)
    p = subparsers.add_parser(
        "configs",
        help="list the bundled training configs",
        formatter_class=FORMATTER,
        epilog=examples("primaldual configs", "primaldual fit --config uea/JapaneseVowels/primalformer --print-config"),
    )
    _config_dir(p)
    p.set_defaults(func=_cmd_configs)
