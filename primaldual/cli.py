"""The ``primaldual`` command line.

Subcommands: ``attentions`` (the registry with capabilities), ``smoke`` (forward + backward through
every attention). Training, data and benchmark subcommands are added by their modules.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _cmd_attentions(args: argparse.Namespace) -> int:
    from .attention import attention_table

    print(attention_table())
    return 0


def _cmd_smoke(args: argparse.Namespace) -> int:
    from .smoke import format_rows, smoke

    rows = smoke(batch=args.batch, length=args.length, dim=args.dim, heads=args.heads)
    print(format_rows(rows))
    return 0 if all(r["finite"] for r in rows) else 1


# Modules that add subcommands: each defines ``register(subparsers)`` that adds its parsers and sets
# ``func`` (taking the parsed namespace, returning an exit code). Imported lazily so that a missing
# optional extra only breaks its own subcommand.
SUBCOMMAND_MODULES: list[str] = [
    "primaldual.bench.cli",
    "primaldual.train.cli",
    "primaldual.data.cli",
    "primaldual.analysis.cli",
]


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="primaldual", description="Primal-dual attention for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in SUBCOMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    p = sub.add_parser("attentions", help="list registered attentions and their capabilities")
    p.set_defaults(func=_cmd_attentions)
    p = sub.add_parser("smoke", help="forward + backward through every registered attention, with timings")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.set_defaults(func=_cmd_smoke)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Subcommands that set ``accepts_overrides`` (fit / validate / test / seeds) take free-form
    # ``--section.key value`` overrides; everywhere else an unknown argument is an error.
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
