"""The ``primaldual`` command line.

Subcommands: ``attentions`` (the registry with capabilities); ``smoke`` and ``bench`` (benchmarks); ``fit``,
``validate``, ``test``, ``seeds``, ``configs``, ``generate`` (training; ``generate`` continues a text with a
trained language model); ``data`` (datasets); ``analyze`` (spectra of trained runs). Each module registers its
own subcommands.

Errors: bad input of any subcommand (an unknown config or config key, a missing file, run directory or checkpoint,
a malformed data file, a bad argument value) ends with exactly one line ``primaldual <subcommand>: error: <message>``
on stderr and exit code 2, without a traceback; an unexpected internal error ends with one such line too (exit code
1) that suggests ``--debug``. ``--debug`` (before or after the subcommand) re-raises instead, with the traceback.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import sys

from .utils.cli import FORMATTER, examples, iter_subparsers

__all__ = ["build_parser", "main"]

# Exceptions that mean "bad input": the project's own (ConfigError and TSFormatError are ValueErrors,
# MissingDataError is a FileNotFoundError) and the built-in ones raised on bad paths and values.
# errno values of OSErrors that are the machine's state, reported like bad input: no space, quota, read-only
_USER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
USER_ERRORS: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    ValueError,
    KeyError,
    TypeError,
)


def _cmd_attentions(args: argparse.Namespace) -> int:
    from .attention import attention_table

    print(attention_table())
    return 0


# Modules that add subcommands: each defines ``register(subparsers)`` that adds its parsers and sets
# ``func`` (taking the parsed namespace, returning an exit code). Imported lazily so that a missing
# optional extra only breaks its own subcommand.
SUBCOMMAND_MODULES: list[str] = [
    "primaldual.bench.cli",
    "primaldual.train.cli",
    "primaldual.tasks.lm.cli",
    "primaldual.data.cli",
    "primaldual.analysis.cli",
]


def build_parser() -> argparse.ArgumentParser:
    """The full ``primaldual`` parser (every subcommand, each with ``--debug``)."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="primaldual",
        allow_abbrev=False,
        description="Primal-dual attention for PyTorch.",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual attentions",
            "primaldual fit --config uea/JapaneseVowels/primalformer",
            "primaldual data fetch uea JapaneseVowels",
            "primaldual fit --help",
        ),
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "attentions",
        help="list registered attentions and their capabilities",
        formatter_class=FORMATTER,
        epilog=examples("primaldual attentions"),
    )
    p.set_defaults(func=_cmd_attentions)
    for mod in SUBCOMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    for p in iter_subparsers(parser):
        p.set_defaults(cmd_prog=p.prog)  # the innermost parser's value wins
        # no prefixes: `seeds --seed 5` would be read as --seeds 5, and `fit --conf` is an override, not --config
        p.allow_abbrev = False
        if not any("--debug" in a.option_strings for a in p._actions):
            p.add_argument(
                "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback on errors"
            )
    return parser


def _top_level_keys() -> set[str]:
    """The run config's top-level keys and ``attention``: overrides (``--seed 1``), never misspelt flags."""
    from dataclasses import fields

    from .train.schema import RunConfig

    return {f.name for f in fields(RunConfig)} | {"attention"}


def _message(exc: BaseException) -> str:
    """The exception's message on one line (a ``KeyError``'s without quotes, an ``OSError``'s without errno)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:  # "[Errno 2] ..." -> "path: ..."
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc)
    if "Original Traceback (most recent call last):" in text:  # re-raised from a DataLoader worker: its last line
        last = [line for line in text.splitlines() if line.strip()][-1].strip()
        text = last.partition(": ")[2] if last.startswith(f"{type(exc).__name__}: ") else last
    return " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Run ``primaldual`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Subcommands that set ``accepts_overrides`` (fit / validate / test / seeds) take free-form
    # ``--section.key value`` overrides; everywhere else an unknown argument is an error.
    prog = getattr(args, "cmd_prog", parser.prog)
    command = next((p for p in iter_subparsers(parser) if p.prog == prog), parser) if extra else parser
    if extra and not getattr(args, "accepts_overrides", False):
        command.error(f"unrecognized arguments: {' '.join(extra)}")  # usage of the subcommand, exit code 2
    if extra:  # an override that is a misspelt flag of this command (--confg, --run_dir, --print_config) says so
        flags = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
        for tok in extra:
            name = tok.partition("=")[0]
            if tok.startswith("--") and "." not in name and name not in flags:
                close = difflib.get_close_matches(name.replace("_", "-"), flags, n=1, cutoff=0.8)
                if close and close[0] != name and name[2:] not in _top_level_keys():
                    command.error(f"unrecognized argument {name}; did you mean {close[0]}?")
    args.overrides = extra
    if getattr(args, "debug", False):
        return args.func(args)
    try:
        return args.func(args)
    except SystemExit as e:  # ``raise SystemExit("message")`` deep in a command is bad input as well
        if isinstance(e.code, str):
            print(f"{prog}: error: {_message(e)}", file=sys.stderr)
            return 2
        raise
    except USER_ERRORS as e:
        print(f"{prog}: error: {_message(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``primaldual configs | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 1
    except OSError as e:  # a read-only run directory, a full disk: the machine's state, not a bug of ours
        if isinstance(e, PermissionError) or e.errno in _USER_ERRNOS:
            print(f"{prog}: error: {_message(e)}", file=sys.stderr)
            return 2
        return _unexpected(prog, e)
    except ImportError as e:  # an optional dependency this command needs: name its extra
        if (hint := _missing_extra(e)) is None:
            return _unexpected(prog, e)
        print(f"{prog}: error: {hint}", file=sys.stderr)
        return 2
    except Exception as e:
        return _unexpected(prog, e)


# the optional packages the commands import, by top-level module: (PyPI name, the primaldual extra that brings it)
_OPTIONAL = {
    "PIL": ("pillow", "data"),
    "tokenizers": ("tokenizers", "data"),
    "debian": ("python-debian", "data"),
    "rdata": ("rdata", "data"),
    "unlzw3": ("unlzw3", "data"),
    "matplotlib": ("matplotlib", "bench"),
    "transformers": ("transformers", "hf"),
    "accelerate": ("accelerate", "hf"),
    "gguf": ("gguf", "llama"),
    "h5py": ("h5py", "rl"),
    "gymnasium": ("gymnasium[mujoco]", "rl"),
    "mujoco": ("mujoco", "rl"),
    "stable_baselines3": ("stable-baselines3", "rl"),
    "triton": ("triton", "kernels"),
    "scipy": ("scipy", "theory"),
    "clarabel": ("clarabel", "theory"),
    "lightning": ("lightning", "train"),
    "omegaconf": ("omegaconf", "train"),
}


def _missing_extra(e: ImportError) -> str | None:
    """The one-line message for an optional dependency that is not installed, or None for any other ImportError
    (a broken installation is unexpected). Our own ImportErrors that already say what to install pass as they are."""
    if "pip install" in str(e):
        return _message(e)
    top = (getattr(e, "name", None) or "").partition(".")[0]
    if isinstance(e, ModuleNotFoundError) and top in _OPTIONAL:
        package, extra = _OPTIONAL[top]
        return (
            f"this command needs {package}, which is not installed: pip install '{package}' (or 'primaldual[{extra}]')"
        )
    return None


def _unexpected(prog: str, e: BaseException) -> int:
    print(
        f"{prog}: error: {type(e).__name__}: {_message(e)} (unexpected; rerun with --debug for the traceback)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
