"""``primaldual fit | validate | test | seeds | configs | fetch-uea``: the training subcommands.

``fit`` / ``validate`` / ``test`` follow Lightning CLI conventions: ``--config FILE_OR_NAME`` plus dotted
overrides such as ``--model.attention softmax`` or ``--trainer.devices=2``; ``--attention NAME`` runs any
registered attention in every layer.
"""

from __future__ import annotations

import argparse
import shlex
import sys

__all__ = ["register"]

DEFAULT_CONFIG = "uea/default"


def _epilog() -> str:
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


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help=f"config file or name (default {DEFAULT_CONFIG})")
    p.add_argument("--run-dir", default=None, help="run directory (default runs/<task>/<dataset>/<name>-...)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.set_defaults(accepts_overrides=True)


def _cfg(args: argparse.Namespace):
    from .config import load_config
    from .run import set_threads

    set_threads(args.threads)
    return load_config(args.config, getattr(args, "overrides", []))


def _cmd_fit(args: argparse.Namespace) -> int:
    from .run import fit

    fit(_cfg(args), args.run_dir, fresh=args.fresh)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from .run import evaluate

    res = evaluate(_cfg(args), args.command, args.ckpt, args.run_dir)
    for k, v in res[0].items():
        print(f"{k}: {v:.4f}")
    return 0


def _cmd_seeds(args: argparse.Namespace) -> int:
    from .seeds import format_table, run_seeds

    summaries = run_seeds(
        args.configs,
        args.seeds,
        args.protocols,
        getattr(args, "overrides", []),
        base=args.base,
        jobs=args.jobs,
        threads=args.threads,
    )
    table = format_table(summaries, "primaldual " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    print(table)
    if args.out:
        from ..data.cache import atomic_write_text

        atomic_write_text(args.out, table + "\n")
    return 0


def _cmd_configs(args: argparse.Namespace) -> int:
    from .config import config_dir, list_configs

    print(f"configs under {config_dir()}:")
    for name in list_configs():
        print(f"  {name}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from ..data.uea_fetch import fetch_japanese_vowels

    print(fetch_japanese_vowels(args.dest, force=args.force))
    return 0


def _friendly(func):
    """Bad configs and missing or malformed data end with one clear line, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        from ..data.cache import MissingDataError
        from ..data.uea import TSFormatError
        from .config import ConfigError

        try:
            return func(args)
        except (ConfigError, MissingDataError, TSFormatError) as e:
            print(f"primaldual {args.command}: error: {e}", file=sys.stderr)
            return 2

    return run


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the training subcommands to the ``primaldual`` parser."""
    fmt = argparse.RawDescriptionHelpFormatter
    epilog = _epilog()
    p = subparsers.add_parser(
        "fit", help="train (resumes from the run's last.ckpt)", epilog=epilog, formatter_class=fmt, allow_abbrev=False
    )
    _common(p)
    p.add_argument("--fresh", action="store_true", help="delete the run directory and start over")
    p.set_defaults(func=_friendly(_cmd_fit))
    for stage in ("validate", "test"):
        p = subparsers.add_parser(
            stage, help=f"{stage} a checkpoint of a run", epilog=epilog, formatter_class=fmt, allow_abbrev=False
        )
        _common(p)
        p.add_argument("--ckpt", default="best", help="best, last, or a checkpoint path")
        p.set_defaults(func=_friendly(_cmd_eval))
    p = subparsers.add_parser(
        "seeds", help="several configs x protocols x seeds -> mean +- std table", epilog=epilog, formatter_class=fmt
    )
    p.add_argument("--configs", nargs="+", required=True)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--protocols", nargs="+", default=["heldout", "paper"], choices=["heldout", "paper"])
    p.add_argument("--base", default="runs", help="root of the run directories")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run")
    p.add_argument("--out", default=None, help="also write the Markdown table here")
    p.set_defaults(func=_friendly(_cmd_seeds), accepts_overrides=True)
    p = subparsers.add_parser("configs", help="list the bundled training configs")
    p.set_defaults(func=_cmd_configs)
    p = subparsers.add_parser("fetch-uea", help="fetch and verify JapaneseVowels (from the aeon wheel on PyPI)")
    p.add_argument("--dest", default=None, help="target folder (default $PRIMALDUAL_DATA/uea/JapaneseVowels)")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=_cmd_fetch)
