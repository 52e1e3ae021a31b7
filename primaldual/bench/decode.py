"""Generation benchmark: per-token latency and memory of incremental decoding against the context length.

For each attention (every layer of one mechanism: ``softmax`` with its KV cache, ``primal`` and ``linear`` with
their constant-size states, or any causal mechanism), batch size and context length T, one fresh subprocess builds
a :class:`~primaldual.models.CausalLM` of the given width and depth, puts every layer in the decoding state it
would have after T tokens, then times ``steps`` decoding steps (one token per sequence each, greedy).

The state "after T tokens" is filled with random values of the right shapes (keys and values of T tokens for a
KV cache, running sums for a constant state) instead of prefilling T tokens one by one: a prefill of 64K tokens
through a KV cache costs O(T^2) and measures nothing that the steps after it do not. Time per step does not depend
on the values. Memory: ``state_mb`` is the exact size of the decoding state (what grows with the context);
``peak_mb`` is the process's peak resident memory above its baseline (the model included), read from ``VmHWM``
after resetting it (CPU) or ``max_memory_allocated`` (CUDA).

Hand-written: the decoding states are this project's own protocol; no benchmark library measures them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..utils.io import atomic_write_json, atomic_write_text
from .layers import PeakMemory, machine_info, run_case, run_worker

__all__ = ["decode_table", "filled_state", "parse_ints", "run_decode"]

DEFAULT_CONTEXTS = (1024, 4096, 16384, 65536)


def filled_state(model: Any, batch: int, context: int) -> Any:
    """The model's decoding state after ``context`` real tokens, with random contents of the right shapes."""
    import torch

    from ..attention.base import KVCache, PrefixState
    from ..attention.linear import LinearState
    from ..attention.primal import PrimalState
    from ..models.lm import LMState

    ref = model.embed.weight
    fk = {"device": ref.device, "dtype": ref.dtype}
    layers = []
    for block, empty in zip(model.decoder.blocks, model.init_state(batch).layers, strict=True):
        attn = block.attn
        if isinstance(empty, KVCache):
            keep = context
            if attn.capabilities.decoding == "window_cache" and attn.stride == 0:
                keep = min(context, attn.window + attn.num_global)
            shape = (batch, attn.num_heads, keep, attn.head_dim)  # (B, H, T kept, D)
            mask = torch.ones(batch, keep, dtype=torch.bool, device=ref.device)
            rank = torch.arange(context - keep, context, device=ref.device).repeat(batch, 1)  # (B, T kept)
            layers.append(KVCache.of(torch.randn(shape, **fk), torch.randn(shape, **fk), mask, rank, context))
        elif isinstance(empty, PrimalState):
            count = torch.full_like(empty.count, float(context))  # the state's own dtype (float32 sums for half)
            layers.append(PrimalState(torch.randn_like(empty.sum_q), torch.randn_like(empty.sum_k), count))
        elif isinstance(empty, LinearState):
            layers.append(LinearState(torch.rand_like(empty.kv) * context, torch.rand_like(empty.z) * context))
        elif isinstance(empty, PrefixState):
            x = torch.randn(batch, context, attn.dim, **fk)  # (B, T, C)
            layers.append(PrefixState(x, torch.ones(batch, context, dtype=torch.bool, device=ref.device)))
        else:
            raise TypeError(f"no way to fill a decoding state of type {type(empty).__name__}")
    return LMState(layers, torch.full((batch,), context, dtype=torch.long, device=ref.device))


def _state_bytes(state: Any) -> int:
    import torch

    total = 0
    for layer in state.layers:
        total += sum(t.numel() * t.element_size() for t in layer if isinstance(t, torch.Tensor))
    return total


def _worker(case: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ..models.graphed import GraphedStep
    from ..models.lm import CausalLM

    if case["threads"] > 0:
        torch.set_num_threads(case["threads"])
    device = torch.device(case["device"])
    T, B, steps = case["context"], case["batch"], case["steps"]
    torch.manual_seed(0)
    model = (
        CausalLM(
            case["vocab"],
            T + case["warmup"] + steps,  # positions from T on are decoded
            dim=case["dim"],
            depth=case["depth"],
            num_heads=case["heads"],
            ffn_dim=4 * case["dim"],
            dropout=0.0,
            attention=case["attention"],
            attention_options=case["options"] or None,
            positions="sinusoidal",
        )
        .to(device)
        .eval()
    )

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    memory = PeakMemory(device)
    times = []
    graph = case.get("cuda_graph", False) and model.decoder.blocks[0].attn.capabilities.decoding == "constant"
    with torch.no_grad():
        state = filled_state(model, B, T)
        ids = torch.zeros(B, dtype=torch.long, device=device)
        # greedy, with the argmax inside the graph: the loop replays it with no work on the host between tokens
        replay = GraphedStep(model, state, feed_back=True, warmup=3) if graph else None
        for i in range(case["warmup"] + steps):
            sync()
            t0 = time.perf_counter()
            if replay is not None:
                replay()
            else:
                logits, state = model.step(ids, state)
                ids = logits.argmax(-1)
            sync()
            if i >= case["warmup"]:
                times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "ms_per_token": 1e3 * times[len(times) // 2],
        "ms_per_token_min": 1e3 * times[0],
        "state_mb": _state_bytes(state) / 2**20,
        "peak_mb": memory.mb(),
        "decoding": model.decoder.blocks[0].attn.capabilities.decoding,
        "cuda_graph": bool(graph),
    }


def run_decode(
    attentions: list[str],
    batches: list[int],
    contexts: list[int],
    out: Path,
    *,
    dim: int = 256,
    depth: int = 4,
    heads: int = 4,
    vocab: int = 8192,
    steps: int = 16,
    warmup: int = 3,
    options: dict[str, dict[str, Any]] | None = None,
    device: str = "cpu",
    threads: int = 0,
    mem_limit_gb: float = 20.0,
    timeout_s: float = 900.0,
    cuda_graph: bool = False,
) -> list[dict[str, Any]]:
    """Every (attention, batch, context) case in its own process; ``out`` (JSON) rewritten after each case.

    ``cuda_graph``: each step of a constant-size state is one CUDA graph replay (a KV or window cache, whose shape
    changes, stays eager; each record says which ran)."""
    if cuda_graph and not str(device).startswith("cuda"):
        raise ValueError(f"--cuda-graph: CUDA graphs need a CUDA device, got --device {device}")
    settings = {"dim": dim, "depth": depth, "heads": heads, "vocab": vocab, "steps": steps, "warmup": warmup}
    settings.update(device=device, threads=threads, options=options or {}, cuda_graph=cuda_graph)
    records: list[dict[str, Any]] = []
    for attention in attentions:
        for batch in batches:
            for context in contexts:
                case = {"attention": attention, "batch": batch, "context": context, **settings}
                case.update(options=(options or {}).get(attention, {}), mem_limit_gb=mem_limit_gb, timeout_s=timeout_s)
                t0 = time.time()
                rec = {
                    "attention": attention,
                    "batch": batch,
                    "context": context,
                    **run_case(case, "primaldual.bench.decode"),
                }
                rec["wall_s"] = time.time() - t0
                records.append(rec)
                print(_line(rec), flush=True)
                payload = {"kind": "decode", "machine": machine_info(device), "settings": settings, "records": records}
                atomic_write_json(out, payload)
    return records


def _line(r: dict[str, Any]) -> str:
    head = f"{r['attention']:<14}B={r['batch']:<3}T={r['context']:<7}"
    if r.get("status") != "ok":
        return head + f"{r.get('status')}: {r.get('error', '')[:120]}"
    return head + f"{r['ms_per_token']:9.2f} ms/token  state {r['state_mb']:9.2f} MB  peak {r['peak_mb']:9.1f} MB"


def decode_table(records: list[dict[str, Any]]) -> str:
    """Markdown: per batch and context, each attention's ms/token and state size, and its ratio to softmax."""
    atts = list(dict.fromkeys(r["attention"] for r in records))
    rows = ["| B | context | " + " | ".join(f"{a} ms/token (state MB)" for a in atts) + " |"]
    rows.append("|---|---|" + "---|" * len(atts))
    keys = sorted({(r["batch"], r["context"]) for r in records})
    by = {(r["attention"], r["batch"], r["context"]): r for r in records}
    for b, t in keys:
        ref = by.get(("softmax", b, t))
        cells = []
        for a in atts:
            r = by.get((a, b, t))
            if r is None or r.get("status") != "ok":
                cells.append("-" if r is None else r.get("status", "?"))
                continue
            cell = f"{r['ms_per_token']:.2f} ({r['state_mb']:.1f})"
            if ref is not None and ref.get("status") == "ok" and a != "softmax":
                cell += f", {ref['ms_per_token'] / r['ms_per_token']:.1f}x faster"
            cells.append(cell)
        rows.append(f"| {b} | {t} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot_decode(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Two log-log figures against the context: ms per token, and decoding-state size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, label, name in (
        ("ms_per_token", "ms per token", "decode_latency.png"),
        ("state_mb", "state (MB)", "decode_state.png"),
    ):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for a, b in sorted({(r["attention"], r["batch"]) for r in records}):
            pts = sorted(
                (r["context"], r[key])
                for r in records
                if r["attention"] == a and r["batch"] == b and r.get("status") == "ok"
            )
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{a}, B={b}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / name
        out_dir.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attentions", default="softmax,primal,linear", help="comma list of causal attentions")
    p.add_argument("--batches", default="1,8", help="comma list of batch sizes")
    p.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)), help="comma list of context lengths")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=16, help="timed decoding steps per case")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--options", default="{}", help='JSON {attention: {option: value}}, e.g. {"primal": {"s": 30}}')
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads per case (0: torch's default)")
    p.add_argument("--mem-limit-gb", type=float, default=20.0)
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="replay each step of a constant-size state as one CUDA graph (KV and window caches stay eager)",
    )
    p.add_argument("--out", default="runs/bench/decode.json", help="JSON file; the table (.md) and plots go beside it")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def parse_ints(text: str, flag: str) -> list[int]:
    """A comma list of positive ints from the command line; a ValueError naming ``flag`` otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected a comma list of ints, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag}: expected positive ints, got {text!r}")
    return values


def run_from_args(args: argparse.Namespace) -> int:
    if args.worker is not None:
        run_worker(args.worker, _worker)
        return 0
    from ..attention.registry import list_attentions

    causal = {i.name for i in list_attentions() if i.capabilities.causal}
    attentions = [a.strip() for a in args.attentions.split(",") if a.strip()]
    bad = [a for a in attentions if a not in causal]
    if bad:
        raise ValueError(f"--attentions: {bad} cannot decode causally; causal attentions: {sorted(causal)}")
    try:
        options = json.loads(args.options)
    except json.JSONDecodeError as e:
        raise ValueError(f"--options: not valid JSON ({e})") from None
    out = Path(args.out)
    records = run_decode(
        attentions,
        parse_ints(args.batches, "--batches"),
        parse_ints(args.contexts, "--contexts"),
        out,
        dim=args.dim,
        depth=args.depth,
        heads=args.heads,
        vocab=args.vocab,
        steps=args.steps,
        warmup=args.warmup,
        options=options,
        device=args.device,
        threads=args.threads,
        mem_limit_gb=args.mem_limit_gb,
        cuda_graph=args.cuda_graph,
    )
    table = decode_table(records)
    atomic_write_text(out.with_suffix(".md"), table + "\n")
    print(table)
    try:
        for path in plot_decode(records, out.parent):
            print(f"wrote {path}")
    except ImportError:
        print("(matplotlib is not installed: no plots; pip install 'primaldual[bench]')")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m primaldual.bench.decode")
    add_arguments(parser)
    sys.exit(run_from_args(parser.parse_args()))
