"""The language-model task's own subcommands: ``generate`` (continue a prompt), ``export`` (a Hugging Face model
directory) and ``convert`` (a trained softmax run to primal attention). The task package owns them, so the runner's
CLI (:mod:`primaldual.train.cli`) knows no task."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...utils.cli import FORMATTER, examples
from ...utils.errors import ConfigError
from ..convert_configs import convert_config_names

#: the conversion config of a language-model teacher when none is given
LM_DEFAULT = "lm/english/convert/primal_plus"


def _cmd_generate(args: argparse.Namespace) -> int:
    from ...train.run import set_threads
    from .training import generate_text

    set_threads(args.threads)
    text = generate_text(
        args.run_dir,
        args.prompt,
        args.max_new_tokens,
        ckpt=args.ckpt,
        seed=args.seed,
        temperature=args.temperature,
        top_k=args.top_k,
        device=args.device,
        cuda_graph=args.cuda_graph,
    )
    print(text)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:

    if not str(args.out).strip():
        raise ValueError("--out: empty; give the directory to write")
    try:
        import primaldual.integrations.hf.export  # noqa: F401  (transformers, the hf extra)
    except ImportError as e:
        raise ConfigError(f"--format hf: needs the hf extra (pip install 'primaldual[hf]'): {e}") from None
    from .export import export_run

    out = export_run(args.run_dir, args.out, ckpt=args.ckpt, force=args.force)
    print(f"wrote {out} (AutoModelForCausalLM.from_pretrained({str(out)!r}) after `import primaldual`)")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from ...train.config import parse_overrides
    from ...train.run import set_threads
    from .convert import convert_run, load_convert_config
    from .convert_hf import convert_hf_run, is_hf_teacher

    set_threads(args.threads)
    pairs = parse_overrides(args.overrides)  # --stage1.tokens 0 / --options.s=16: values are YAML
    if not Path(args.teacher).exists() and args.teacher != "smollm2":
        raise ConfigError(
            f"TEACHER {args.teacher}: not found (a primaldual run directory, a save_pretrained directory, a .gguf "
            "file, or smollm2)"
        )
    run = dict(overrides=pairs, seed=args.seed, run_dir=args.run_dir, fresh=args.fresh)
    task = None if is_hf_teacher(args.teacher) else _run_task(Path(args.teacher))
    family = "lm" if task in (None, "lm") else task.split("_")[0]  # lra_listops -> lra
    named = args.config is not None and not args.config.endswith((".yaml", ".yml"))
    if named and args.config.split("/")[0] != family:
        raise ConfigError(
            f"--config: {args.config} is a conversion of the {args.config.split('/')[0]!r} family; this teacher "
            f"takes {family}/<dataset>/convert/<name> (shipped: {', '.join(convert_config_names(family)) or 'none'})"
        )
    if is_hf_teacher(args.teacher):
        config = args.config or LM_DEFAULT
        conv = load_convert_config(config, pairs)
        convert_hf_run(args.teacher, conv, config, seed=args.seed, run_dir=args.run_dir, fresh=args.fresh)
    elif task in (None, "lm"):  # (convert_run names what is wrong with a run)
        convert_run(args.teacher, args.config or LM_DEFAULT, **run)
    else:  # a classifier: uea, vision, the one-input LRA tasks
        from ..convert_classifier import convert_classifier_run

        convert_classifier_run(args.teacher, args.config, **run)
    return 0


def _run_task(run_dir: Path) -> str | None:
    """The task a run directory's ``config.yaml`` names, read without validating it (None where it cannot be read):
    which conversion takes the run."""
    import yaml

    try:
        raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return raw.get("task") if isinstance(raw, dict) and isinstance(raw.get("task"), str) else None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the language-model subcommands to the ``primaldual`` parser."""
    p = subparsers.add_parser(
        "generate",
        help="continue a text with the language model of a run (task lm)",
        formatter_class=FORMATTER,
        allow_abbrev=False,
        epilog=examples(
            'primaldual generate runs/lm/english/transformer_reduced-heldout-seed0-* --prompt "The kernel" '
            "--max-new-tokens 40",
            'primaldual generate RUN_DIR --prompt "It is a truth universally acknowledged" --max-new-tokens 60 '
            "--temperature 0.8 --top-k 40 --seed 1",
            'primaldual generate RUN_DIR --prompt "And God said" --max-new-tokens 30 --temperature 0 --ckpt last',
            'primaldual generate RUN_DIR --prompt "The kernel" --max-new-tokens 100 --device cuda --cuda-graph',
            note="The model comes from the run's config.yaml, the checkpoint is read in the safe mode, the prompt is "
            "encoded with the run's tokenizer (tokenizer.json, or dict.txt for WikiText); the prompt and its "
            "continuation are printed. Prompt tokens + --max-new-tokens must fit the model's positions "
            "(data.max_len).",
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `primaldual fit` (task lm)")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate (default 50)")
    p.add_argument("--ckpt", default="best", help="best, last, or a checkpoint path (default best)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 is greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens (default all)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="where the model decodes: cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="replay each decoding step from a CUDA graph (a CUDA device; every layer primal or linear)",
    )
    p.set_defaults(func=_cmd_generate)
    p = subparsers.add_parser(
        "export",
        help="write the language model of a run as a Hugging Face model directory (task lm)",
        formatter_class=FORMATTER,
        allow_abbrev=False,
        epilog=examples(
            "primaldual export runs/lm/english/transformer_reduced-heldout-seed0-* --format hf --out exported/lm",
            "primaldual export RUN_DIR --format hf --out exported/lm --ckpt last --force",
            note="The directory loads with transformers.AutoModelForCausalLM.from_pretrained after `import "
            "primaldual` (needs the hf extra); a byte-level BPE run's tokenizer with AutoTokenizer. HF generate "
            "decodes through the model's own state (constant-size for primal layers). --force replaces only an "
            "earlier export.",
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `primaldual fit` (task lm)")
    p.add_argument("--format", required=True, choices=("hf",), help="hf: a transformers model directory")
    p.add_argument("--out", required=True, help="the directory to write (new, empty, or an earlier export)")
    p.add_argument("--ckpt", default="best", help="best, last, or a checkpoint path (default best)")
    p.add_argument("--force", action="store_true", help="replace an earlier export at --out")
    p.set_defaults(func=_cmd_export)
    p = subparsers.add_parser(
        "convert",
        help="convert a trained softmax model (an LM or classifier run, or a Hugging Face LM) to primal attention",
        formatter_class=FORMATTER,
        allow_abbrev=False,
        epilog=examples(
            "primaldual convert runs/lm/english/transformer_medium-heldout-seed0-* --config lm/english/convert/primal_plus",
            "primaldual convert TEACHER_RUN -c lm/english/convert/hybrid --seed 1 --run-dir runs/hybrid_s1",
            "primaldual convert TEACHER_RUN -c lm/english/convert/primal_plus --stage1.tokens 0 --init random  "
            "# swap and finetune",
            "primaldual convert smollm2 -c lm/english/convert/smollm2_primal_plus --run-dir runs/smollm2_pp",
            "primaldual convert ./my-llama -c lm/english/convert/smollm2_hybrid --data.text notes.txt",
            "primaldual convert runs/vision/fashion_mnist/deit_reduced-heldout-seed0-*  "
            "# a classifier: vision/fashion_mnist/convert/primal_plus",
            note="TEACHER is a primaldual run of a softmax CausalLM or classifier (uea, vision, one-input lra), or a "
            "Hugging Face causal LM: a save_pretrained directory, a .gguf file, or smollm2. The conversion config "
            "(student, layers, options, init, stage1 / stage2 budgets: in tokens for an LM; in steps and run-config "
            "overrides for a classifier; data: the text, for a Hugging Face teacher) is a shipped name "
            f"<family>/<dataset>/convert/<name> ({', '.join(convert_config_names())}) or a YAML path (default: "
            f"{LM_DEFAULT} for an LM, the dataset's primal_plus for a classifier); --key value overrides it. A run's "
            "conversion directory is an ordinary run's (resume, test, generate for an LM) plus convert.yaml and "
            "convert/ (stage 1); a Hugging Face one holds model/ (save_pretrained) and summary.json. See "
            "docs/conversion.md.",
        ),
    )
    p.add_argument(
        "teacher",
        metavar="TEACHER",
        help="a finished `primaldual fit` run of a softmax CausalLM or classifier, or a Hugging Face causal LM (a "
        "save_pretrained directory, a .gguf file, smollm2)",
    )
    p.add_argument(
        "--config",
        "-c",
        default=None,
        help=f"conversion config name or path (default {LM_DEFAULT}; a classifier's: its dataset's primal_plus)",
    )
    p.add_argument("--seed", type=int, default=0, help="the conversion's seed (default 0)")
    p.add_argument(
        "--run-dir",
        default=None,
        help="run directory (default runs/<task>/<dataset>/<name>-...; a Hugging Face teacher's: "
        "runs/convert/<teacher>-<config>-seed<N>)",
    )
    p.add_argument(
        "--fresh", action="store_true", help="start the conversion over in its run directory (a primaldual run's)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.set_defaults(func=_cmd_convert, accepts_overrides=True)
