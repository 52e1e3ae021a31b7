"""LRA-style training-step benchmark: time per 1K steps and peak training memory, per task and model.

For each LRA task shape (ListOps 2K, Text 4K, Retrieval 4K x 2, Image 1K, Pathfinder 1K) and each model
(Transformer, PrimalFormer, Primal.+Trans., linear and the SVR-family attentions) one fresh subprocess
builds the reference LRA model (embedding 64, 2 layers, 2 heads x 32, FFN 128, mean pooling, AdamW),
runs ``warmup`` full training steps (forward, task loss + auxiliary KSVD loss, backward, optimizer step),
then times ``steps`` more. How this differs from the paper's measurement, on purpose:

* no evaluation pass inside the timed loop, no gradient checkpointing for any model, warm-up excluded;
* every model uses the same batch (``--batch`` overrides the paper's batch for CPU, for all models alike);
* the token content is random (timing and memory do not depend on it): this benchmark measures cost,
  never accuracy;
* every setting is the reference training config's, read from ``lra/<task>/<model>`` (``configs/lra``): length,
  vocabulary, classes, the paper's batch, width / depth / heads, the attention plan with the accuracy runs'
  primal ``s`` and ``eta`` (``benchmarks.md``) and AdamW; so the benchmark and the training runs cannot drift apart.

Peak memory is the whole training process above the interpreter baseline (weights, optimizer state and
activations), read as on CPU ``VmHWM`` after resetting it just before the model is built; on CUDA
``max_memory_allocated``. Out-of-memory is recorded as a value.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..utils.io import atomic_write_json
from .layers import machine_info, profile_tables, run_worker, status_kb

__all__ = ["BENCH_MODELS", "MODELS", "TASKS", "build_case", "lra_table", "profile_case", "run_lra"]

# The benchmark's tasks, in the paper's column order; their shapes come from the configs (_task_shape).
_TASK_NAMES = ("listops", "text", "retrieval", "image", "pathfinder")


def _config(task: str, model: str) -> Any:
    """The reference training config ``lra/<task>/<model>`` (a :class:`~primaldual.train.config.RunConfig`);
    ``transformer_eager`` is the Transformer's."""
    from primaldual.train.config import load_config

    return load_config(f"lra/{task}/{'transformer' if model == EAGER else model}")


def _primal_s_eta(task: str, model: str) -> tuple[int, float]:
    opts = _config(task, model).model.attention_options
    first = next(o for o in (opts if isinstance(opts, list) else [opts]) if o)
    return first["s"], first["eta"]


def _task_shape(task: str) -> dict[str, Any]:
    ref = _config(task, "transformer")
    return {
        "length": ref.data.max_len,
        "vocab": ref.model.vocab_size,
        "classes": ref.model.num_classes,
        "batch": ref.data.batch_size,
        "pf": _primal_s_eta(task, "primalformer"),
        "pp": _primal_s_eta(task, "primal_plus"),
    }


class _Tasks:
    """Read-only mapping task -> ``{"length", "vocab", "classes", "batch", "pf": (s, eta), "pp": (s, eta)}``
    (``pf`` PrimalFormer, ``pp`` Primal.+), read from the reference configs on first use: listing the tasks
    (``list(TASKS)``, argparse choices) needs no config files."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self._shapes: dict[str, dict[str, Any]] = {}

    def __getitem__(self, task: str) -> dict[str, Any]:
        if task not in self._names:
            raise KeyError(f"unknown LRA task {task!r}; expected one of {list(self._names)}")
        if task not in self._shapes:
            self._shapes[task] = _task_shape(task)
        return self._shapes[task]

    def __iter__(self) -> Any:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, task: object) -> bool:
        return task in self._names

    def keys(self) -> list[str]:
        return list(self._names)

    def items(self) -> list[tuple[str, dict[str, Any]]]:
        return [(t, self[t]) for t in self._names]


TASKS = _Tasks(_TASK_NAMES)
# the paper's efficiency table (seconds per 1K steps, GB): Transformer vs PrimalFormer
PAPER = {
    "listops": (194.5, 56.5, 5.50, 0.69),
    "text": (694.8, 93.6, 21.24, 1.37),
    "retrieval": (1333.7, 185.3, 18.72, 2.99),
    "image": (334.5, 142.9, 5.88, 1.39),
    "pathfinder": (405.5, 180.0, 5.88, 1.52),
}
MODELS = (  # the reference configs lra/<task>/<model>
    "transformer",
    "primalformer",
    "primal_plus",
    "linear",
    "softmax_bn",
    "softmax_sh",
    "softmax_bn_sh",
    "linear_bn",
)
# the paper's baseline: the Transformer with its N x N softmax matrix materialised (softmax backend "eager"), where
# "transformer" runs SDPA's fused kernels; benchmarked beside the configs' models, from the Transformer's config
EAGER = "transformer_eager"
BENCH_MODELS = (MODELS[0], EAGER, *MODELS[1:])


def model_attention(model: str, task: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Per-layer attention names and options (``{}`` for none) of the reference config ``lra/<task>/<model>``."""
    m = _config(task, model).model
    names = m.attention if isinstance(m.attention, list) else [m.attention] * m.depth
    opts = m.attention_options if isinstance(m.attention_options, list) else [m.attention_options] * m.depth
    eager = {"backend": "eager"} if model == EAGER else {}
    return list(names), [{**dict(o or {}), **eager} for o in opts]


def build_case(case: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Model, one training step (a closure) and a device sync for a (task, model, batch) case."""
    import torch

    from primaldual.aux_loss import collect_aux_loss
    from primaldual.models import RetrievalClassifier, SequenceClassifier

    device = torch.device(case["device"])
    t = TASKS[case["task"]]
    cfg = _config(case["task"], case["model"])
    m, o = cfg.model, cfg.optim
    names, opts = model_attention(case["model"], case["task"])
    if case.get("compile_primal", False):  # the primal layers' own compiled core (PrimalAttention(compile=True))
        opts = [{**o, "compile": True} if n == "primal" else o for n, o in zip(names, opts)]
    kw = {"dim": m.dim, "depth": m.depth, "num_heads": m.num_heads, "ffn_dim": m.ffn_dim, "dropout": m.dropout}
    kw.update(pooling=m.pooling, norm_first=m.norm_first, positions=m.positions)
    kw.update(attention=names, attention_options=opts)
    torch.manual_seed(0)
    B, N = case["batch"], t["length"]
    if case["task"] == "retrieval":
        model = RetrievalClassifier(t["vocab"], N, t["classes"], **kw).to(device)
        batch = (
            torch.randint(1, t["vocab"], (B, N), device=device),
            torch.randint(1, t["vocab"], (B, N), device=device),
        )
    else:
        model = SequenceClassifier(t["vocab"], t["classes"], N, **kw).to(device)
        batch = (torch.randint(1, t["vocab"], (B, N), device=device),)
    y = torch.randint(0, t["classes"], (B,), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    model.train()
    if case.get("compile", False):
        from primaldual.dropout import use_counter_dropout
        from primaldual.train.compile import compile_options

        # in place, with trainer.compile's dropout and options; the first (warm-up) steps pay for the compilation
        use_counter_dropout(model)
        model.compile(options=compile_options(model))
    amp = device.type == "cuda" and case.get("amp", False)

    def step():
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
            logits = model(*batch)
            loss = torch.nn.functional.cross_entropy(logits.float(), y)
            aux = collect_aux_loss(model)
            if aux is not None:
                loss = loss + aux
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return model, step, sync


def _worker(case: dict[str, Any]) -> dict[str, Any]:
    import torch

    if case["threads"]:
        torch.set_num_threads(case["threads"])
    base = _reset_peak(torch.device(case["device"]))
    model, step, sync = build_case(case)
    for _ in range(case["warmup"]):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(case["steps"]):
        step()
    sync()
    per_step = (time.perf_counter() - t0) / case["steps"]
    if case["device"].startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = status_kb("VmHWM") * 1024 - base
    res = {
        "s_per_1k_steps": 1000 * per_step,
        "peak_mem_gb": peak / 2**30,
        "params": sum(p.numel() for p in model.parameters()),
    }
    states = [m._compile_state for m in model.modules() if getattr(m, "compile_core", False)]
    if states:  # "ok" for each primal layer that ran compiled; "eager" where it fell back
        res["primal_compile_states"] = sorted(set(states))
    return res


def profile_case(case: dict[str, Any], steps: int = 2, rows: int = 12) -> str:
    """:func:`~primaldual.bench.layers.profile_tables` of ``steps`` LRA training steps of one (task, model) case."""
    import torch

    if case.get("threads"):
        torch.set_num_threads(case["threads"])
    _, step, sync = build_case(case)
    head = f"{case['task']} / {case['model']} / batch {case['batch']}, {steps} profiled steps"
    return profile_tables(step, sync, case["device"], steps, head, rows)


def _reset_peak(device) -> int:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kb("VmRSS") * 1024


def _worker_main(case_json: str) -> None:
    run_worker(case_json, _worker)


def run_lra(
    tasks: list[str],
    models: list[str],
    out: Path,
    *,
    batch: int | None,
    steps: int,
    warmup: int,
    device: str = "cpu",
    timeout_s: float = 1800.0,
    mem_limit_gb: float = 20.0,
    threads: int = 0,
    amp: bool = False,
    compile: bool = False,
    compile_primal: bool = False,
) -> list[dict[str, Any]]:
    """Run every (task, model) case in its own subprocess; writes JSON (atomically) after each case."""
    records: list[dict[str, Any]] = []
    settings = {"batch": batch, "steps": steps, "warmup": warmup, "device": device, "amp": amp, "threads": threads}
    settings["compile"] = compile
    settings["compile_primal"] = compile_primal
    for task in tasks:
        for model in models:
            case = {"task": task, "model": model, "batch": batch or TASKS[task]["batch"], "steps": steps}
            case.update(warmup=warmup, device=device, mem_limit_gb=mem_limit_gb, threads=threads, amp=amp)
            case["compile"] = compile
            case["compile_primal"] = compile_primal
            cmd = [sys.executable, "-m", "primaldual.bench.lra", "--worker", json.dumps(case)]
            t0 = time.time()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
                res = next(
                    (json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")),
                    None,
                )
                if res is None:
                    status = "oom" if proc.returncode in (-9, 137) else "error"
                    res = {"status": status, "error": (proc.stderr or proc.stdout)[-400:]}
            except subprocess.TimeoutExpired:
                res = {"status": "timeout"}
            rec = {"task": task, "model": model, "batch": case["batch"], "wall_s": time.time() - t0, **res}
            records.append(rec)
            print(f"{task:<11}{model:<14}{_fmt(rec)}", flush=True)
            payload = {"kind": "lra", "machine": machine_info(device), "settings": settings, "records": records}
            atomic_write_json(out, payload)  # after every case: a killed sweep keeps what it measured
    return records


def _fmt(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return r["status"]
    return f"{r['s_per_1k_steps']:9.1f} s/1K steps  {r['peak_mem_gb']:7.3f} GB"


def lra_table(records: list[dict[str, Any]]) -> str:
    """Markdown table in the layout of the paper's efficiency table, with ratios to the Transformer."""
    tasks = [t for t in TASKS if any(r["task"] == t for r in records)]
    models = [m for m in BENCH_MODELS if any(r["model"] == m for r in records)]
    lines = [
        "| model | " + " | ".join(f"{t} time (s/1K) | {t} mem (GB)" for t in tasks) + " |",
        "|---|" + "---|---|" * len(tasks),
    ]
    by = {(r["task"], r["model"]): r for r in records}
    for m in models:
        cells = []
        for t in tasks:
            r, base = by.get((t, m)), by.get((t, "transformer"))
            if r is None or r["status"] != "ok":
                cells += [r["status"] if r else "", ""]
                continue
            ok = base is not None and base["status"] == "ok" and m != "transformer"
            tr = f" ({base['s_per_1k_steps'] / r['s_per_1k_steps']:.1f}x)" if ok else ""
            mr = f" ({base['peak_mem_gb'] / max(r['peak_mem_gb'], 1e-9):.1f}x)" if ok else ""
            cells += [f"{r['s_per_1k_steps']:.1f}{tr}", f"{r['peak_mem_gb']:.3f}{mr}"]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    paper = ["| paper: PrimalFormer vs Transformer | "]
    cells = []
    for t in tasks:
        st, sp, mt, mp = PAPER[t]
        cells += [f"{sp} vs {st} ({st / sp:.1f}x)", f"{mp} vs {mt} ({mt / mp:.1f}x)"]
    lines.append(paper[0] + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {list(TASKS)}")
    p.add_argument("--models", default=",".join(BENCH_MODELS), help=f"comma list of {list(BENCH_MODELS)}")
    p.add_argument("--batch", type=int, default=None, help="batch for every model (default: the paper's per task)")
    p.add_argument("--steps", type=int, default=10, help="timed training steps")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", action="store_true", help="fp16 autocast on CUDA (the paper used AMP)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile every model (in place, as trainer.compile); warm-up steps absorb the compilation",
    )
    p.add_argument(
        "--compile-primal",
        action="store_true",
        help="run every primal layer with compile=True (its core as one torch.compile region; the rest eager)",
    )
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--mem-limit-gb", type=float, default=20.0)
    p.add_argument("--out", default="runs/bench/lra.json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def run_from_args(args: argparse.Namespace) -> int:
    if args.worker is not None:
        _worker_main(args.worker)
        return 0
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [t for t in tasks if t not in TASKS] + [m for m in models if m not in BENCH_MODELS]
    if bad:
        raise ValueError(f"unknown task/model {bad}; tasks {list(TASKS)}, models {list(BENCH_MODELS)}")
    out = Path(args.out)
    records = run_lra(
        tasks,
        models,
        out,
        batch=args.batch,
        steps=args.steps,
        warmup=args.warmup,
        device=args.device,
        timeout_s=args.timeout,
        mem_limit_gb=args.mem_limit_gb,
        threads=args.threads,
        amp=args.amp,
        compile=args.compile,
        compile_primal=args.compile_primal,
    )
    print()
    print(lra_table(records))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2])
    else:
        p = argparse.ArgumentParser(prog="primaldual bench lra")
        add_arguments(p)
        sys.exit(run_from_args(p.parse_args()))
