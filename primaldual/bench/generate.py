"""Generation benchmark: tokens per second and peak memory of prefill + greedy decoding, against Hugging Face GPT-2.

For each model, batch size and prompt length, one fresh subprocess builds the model (random weights, float32, eval,
no dropout), takes random prompts of ``prompt`` tokens, and times one greedy generation of ``new`` tokens (at least
and at most ``new``: no early stop), after an untimed short generation that warms the process up. Models:

* ``softmax``: :class:`~primaldual.models.CausalLM` with every layer softmax (a KV cache while decoding);
* ``primal``: PrimalFormer, every layer causal primal (constant-size states);
* ``primal_plus``: Primal.+Trans., the last layer primal and the others softmax
  (:func:`~primaldual.models.plans.primal_plus`);
* ``hf_gpt2``: ``transformers.GPT2LMHeadModel`` of the same width, depth, heads, vocabulary and positions,
  ``generate(do_sample=False, use_cache=True)`` (built by :func:`primaldual.integrations.hf.peers.gpt2_lm`).

``--cuda-graph`` (a CUDA device): ``primal`` decodes with ``generate(cuda_graph=True)``, each step one CUDA graph
replay, the capture inside the timed generation (what a user's call pays); the models with a KV cache stay eager.

``tokens_per_s`` is ``batch * new / total`` with ``total`` the wall time of the whole generation, prefill included.
Then, untimed by the first, the prefill alone is timed once more (``CausalLM.prefill``; GPT-2's forward with
``use_cache=True``), and ``ms_per_token = (total - prefill) / new`` is the decoding time per step. ``peak_mb`` is
the process's peak resident memory above its baseline during the timed generation (``VmHWM`` reset, CPU) or
``max_memory_allocated`` (CUDA), the model excluded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..options import check_device
from ..utils.io import atomic_write_json, atomic_write_text
from .layers import PeakMemory, machine_info, run_case, run_worker

__all__ = ["MODELS", "generate_table", "run_generate"]

MODELS = ("softmax", "primal", "primal_plus", "hf_gpt2")
DEFAULT_PROMPTS = (32, 512, 4096)


def _build(case: dict[str, Any]) -> Any:
    """The case's model, in eval mode on its device."""
    import torch

    from ..models.lm import CausalLM
    from ..models.plans import primal_plus, primalformer

    name, depth, max_len = case["model"], case["depth"], case["prompt"] + case["new"]
    sizes = {"dim": case["dim"], "num_heads": case["heads"], "ffn_dim": 4 * case["dim"]}
    torch.manual_seed(0)
    if name == "hf_gpt2":
        from ..integrations.hf.peers import gpt2_lm

        model = gpt2_lm(case["vocab"], max_len, depth=depth, **sizes)
    else:
        plan = {"softmax": {"attention": "softmax"}, "primal": primalformer(depth), "primal_plus": primal_plus(depth)}
        model = CausalLM(case["vocab"], max_len, depth=depth, dropout=0.0, **sizes, **plan[name])
    return model.to(case["device"]).eval()


def _generate(model: Any, ids: Any, new: int, hf: bool, graph: bool = False) -> Any:
    """Greedy generation of exactly ``new`` tokens after the ``(B, N)`` prompts ``ids`` (``graph``: each step a CUDA
    graph replay)."""
    import torch

    if hf:
        mask = torch.ones_like(ids)
        return model.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new, use_cache=True
        )
    return model.generate(ids, max_new_tokens=new, temperature=0.0, cuda_graph=graph)[0]


def _prefill(model: Any, ids: Any, hf: bool) -> None:
    if hf:  # the next-token logits only, as generate computes them
        model(ids, attention_mask=ids.new_ones(ids.shape), use_cache=True, logits_to_keep=1)
    else:
        model.prefill(ids, last_only=True)


def _worker(case: dict[str, Any]) -> dict[str, Any]:
    import torch

    if case["threads"] > 0:
        torch.set_num_threads(case["threads"])
    device = torch.device(case["device"])
    hf = case["model"] == "hf_gpt2"
    graph = case["model"] == "primal" and case.get("cuda_graph", False)
    model = _build(case)
    g = torch.Generator().manual_seed(1)
    # the last id is GPT-2's end-of-sequence id: prompts avoid it
    ids = torch.randint(0, case["vocab"] - 1, (case["batch"], case["prompt"]), generator=g).to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.no_grad():
        _generate(model, ids[:, : min(8, case["prompt"])], 2, hf, graph)  # warm-up: first-call costs
        sync()
        memory = PeakMemory(device)
        t0 = time.perf_counter()
        out = _generate(model, ids, case["new"], hf, graph)
        sync()
        total = time.perf_counter() - t0
        peak = memory.mb()
        if out.shape != (case["batch"], case["prompt"] + case["new"]):
            raise RuntimeError(f"generated {tuple(out.shape)}, expected {case['new']} new tokens per prompt")
        t0 = time.perf_counter()
        _prefill(model, ids, hf)
        sync()
        prefill = time.perf_counter() - t0
    return {
        "tokens_per_s": case["batch"] * case["new"] / total,
        "total_s": total,
        "prefill_s": prefill,
        "ms_per_token": 1e3 * max(total - prefill, 0.0) / case["new"],
        "peak_mb": peak,
        "mem_method": memory.method,
        "cuda_graph": graph,
    }


def run_generate(
    models: list[str],
    batches: list[int],
    prompts: list[int],
    out: Path,
    *,
    new: int = 128,
    dim: int = 256,
    depth: int = 4,
    heads: int = 4,
    vocab: int = 8192,
    device: str = "cpu",
    threads: int = 0,
    mem_limit_gb: float = 20.0,
    timeout_s: float = 1800.0,
    cuda_graph: bool = False,
) -> list[dict[str, Any]]:
    """Every (model, batch, prompt) case in its own process; ``out`` (JSON) rewritten atomically after each case.
    ``cuda_graph``: ``primal`` decodes from CUDA graphs (a CUDA device)."""
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"models: unknown {unknown}; choose from {list(MODELS)}")
    if cuda_graph and not str(device).startswith("cuda"):
        raise ValueError(f"--cuda-graph: CUDA graphs need a CUDA device, got --device {device}")
    settings = {"new": new, "dim": dim, "depth": depth, "heads": heads, "vocab": vocab}
    settings.update(device=device, threads=threads, cuda_graph=cuda_graph)
    records: list[dict[str, Any]] = []
    for batch in batches:
        for prompt in prompts:
            for model in models:  # the models side by side per shape, so that a load change hits them alike
                case = {"model": model, "batch": batch, "prompt": prompt, **settings}
                case.update(mem_limit_gb=mem_limit_gb, timeout_s=timeout_s)
                rec = {"model": model, "batch": batch, "prompt": prompt, **run_case(case, "primaldual.bench.generate")}
                records.append(rec)
                print(_line(rec), flush=True)
                payload = {
                    "kind": "generate",
                    "machine": machine_info(device),
                    "settings": settings,
                    "records": records,
                }
                atomic_write_json(out, payload)
    return records


def _line(r: dict[str, Any]) -> str:
    head = f"{r['model']:<12}B={r['batch']:<3}prompt={r['prompt']:<6}"
    if r.get("status") != "ok":
        return head + f"{r.get('status')}: {r.get('error', '')[:120]}"
    return head + (
        f"{r['tokens_per_s']:9.1f} tokens/s  prefill {r['prefill_s']:7.3f} s  decode {r['ms_per_token']:7.2f} ms/token"
        f"  peak {r['peak_mb']:8.1f} MB"
    )


def generate_table(records: list[dict[str, Any]]) -> str:
    """Markdown: per batch and prompt, each model's tokens/s (prefill s, decode ms/token, peak MB) and, beside ours,
    the ratio of its tokens/s to GPT-2's."""
    models = list(dict.fromkeys(r["model"] for r in records))
    rows = ["| B | prompt | " + " | ".join(f"{m} tokens/s" for m in models) + " |"]
    rows.append("|---|---|" + "---|" * len(models))
    by = {(r["model"], r["batch"], r["prompt"]): r for r in records}
    for b, p in sorted({(r["batch"], r["prompt"]) for r in records}):
        ref = by.get(("hf_gpt2", b, p))
        cells = []
        for m in models:
            r = by.get((m, b, p))
            if r is None or r.get("status") != "ok":
                cells.append("-" if r is None else r.get("status", "?"))
                continue
            cell = f"{r['tokens_per_s']:.0f} ({r['prefill_s']:.2f} s + {r['ms_per_token']:.1f} ms/tok, {r['peak_mb']:.0f} MB)"
            if ref is not None and ref.get("status") == "ok" and m != "hf_gpt2":
                cell += f", {r['tokens_per_s'] / ref['tokens_per_s']:.2f}x GPT-2"
            cells.append(cell)
        rows.append(f"| {b} | {p} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--batches", default="1,8", help="comma list of batch sizes")
    p.add_argument("--prompts", default=",".join(map(str, DEFAULT_PROMPTS)), help="comma list of prompt lengths")
    p.add_argument("--new", type=int, default=128, help="new tokens per prompt (greedy, no early stop)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--cuda-graph", action="store_true", help="primal decodes each step from a CUDA graph (a CUDA device)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads per case (0: torch's default)")
    p.add_argument("--mem-limit-gb", type=float, default=20.0)
    p.add_argument("--out", default="runs/bench/generate.json", help="JSON file; the table (.md) goes beside it")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def run_from_args(args: argparse.Namespace) -> int:
    if args.worker is not None:
        run_worker(args.worker, _worker)
        return 0
    from .decode import parse_ints

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        raise ValueError(f"--models: unknown {bad or models}; choose from {list(MODELS)}")
    for flag, value in (("--new", args.new), ("--dim", args.dim), ("--depth", args.depth), ("--heads", args.heads)):
        if value < 1:
            raise ValueError(f"{flag}: expected a positive int, got {value}")
    if args.vocab < 2:
        raise ValueError(f"--vocab: expected at least 2 ids (the last is GPT-2's end-of-sequence id), got {args.vocab}")
    if args.dim % args.heads:
        raise ValueError(f"--heads: {args.heads} heads do not divide --dim {args.dim}")
    if args.threads < 0:
        raise ValueError(f"--threads: expected 0 (torch's default) or a positive int, got {args.threads}")
    if not args.mem_limit_gb > 0:
        raise ValueError(f"--mem-limit-gb: expected a positive number of GiB, got {args.mem_limit_gb}")
    check_device("--device", args.device)
    out = Path(args.out)
    records = run_generate(
        models,
        parse_ints(args.batches, "--batches"),
        parse_ints(args.prompts, "--prompts"),
        out,
        new=args.new,
        dim=args.dim,
        depth=args.depth,
        heads=args.heads,
        vocab=args.vocab,
        device=args.device,
        threads=args.threads,
        mem_limit_gb=args.mem_limit_gb,
        cuda_graph=args.cuda_graph,
    )
    table = generate_table(records)
    atomic_write_text(out.with_suffix(".md"), table + "\n")
    print(table)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m primaldual.bench.generate")
    add_arguments(parser)
    sys.exit(run_from_args(parser.parse_args()))
