"""Layer sweep: time and peak memory of every attention vs sequence length, one subprocess per case.

Each case (mechanism, N, mode) runs in a fresh Python process so that its peak memory is its own:

* CPU: the kernel's peak-RSS counter is reset (``/proc/self/clear_refs`` = 5) after the layer and input
  are built, and the reported memory is ``VmHWM - VmRSS`` at that point, i.e. the activation peak of the
  timed calls alone (weights, input and the interpreter excluded). Where the reset is unavailable the
  process-lifetime ``ru_maxrss`` minus the baseline is reported and flagged.
* CUDA: ``torch.cuda.reset_peak_memory_stats`` / ``max_memory_allocated`` minus the baseline.

Time is the median of ``repeats`` calls after ``warmup`` calls (the device is synchronised before
reading clocks). An allocation failure is recorded as ``"oom"`` and a case over its time budget as
``"timeout"``, never a crash; once a mechanism fails at some N, larger N are recorded the same way
without running. The worker caps its address space (``--mem-limit-gb``) so a quadratic mechanism cannot
take the whole machine down.

Hand-written rather than pytest-benchmark/torch.utils.benchmark because the per-case process isolation
and peak-RSS accounting are the point, and neither library measures CPU activation memory.

Output: a JSON file with machine, versions and settings plus one record per case, and a CSV beside it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..utils.io import atomic_write_json, atomic_write_text
from ..utils.memory import PeakMemory, status_kb

__all__ = [
    "FLOOR",
    "PEERS",
    "PeakMemory",
    "SweepConfig",
    "fit_slope",
    "machine_info",
    "profile_layer",
    "profile_tables",
    "projection_floor",
    "run_case",
    "run_sweep",
    "run_worker",
    "status_kb",
    "summary_table",
]

# Peers from PyPI (the 'bench' extra): name -> (module, builder source) built in the worker.
PEERS = ("performer", "nystrom")
# The floor of the primal layer: its unavoidable dense maps without the attention (recorded in every sweep).
FLOOR = "projections"


def projection_floor(dim: int, heads: int, s: int = 20) -> Any:
    """``(B, N, dim) -> (B, N, dim)``: the primal layer's Q/K projection ``dim -> 2 dim`` and its fused output map
    ``heads * 2s -> dim`` (fed with the first ``heads * 2s`` projected channels), nothing else: what the layer
    costs at the least, so the sweep's ``primal / projections`` ratio is its overhead."""
    import torch
    from torch import nn

    class ProjectionFloor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qk = nn.Linear(dim, 2 * dim)
            self.out = nn.Linear(heads * 2 * s, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.qk(x)[..., : heads * 2 * s])  # (B, N, 2 dim) -> (B, N, H*2s) -> (B, N, dim)

    if heads * 2 * s > 2 * dim:
        raise ValueError(f"the projections floor needs heads * 2s <= 2 * dim, got {heads} * 2 * {s} > {2 * dim}")
    return ProjectionFloor()


@dataclass
class SweepConfig:
    attentions: list[str]
    lengths: list[int]
    modes: list[str]
    batch: int = 4
    tokens: int | None = None  # if set, each case's batch is max(1, tokens // N): equal work per call across N
    dim: int = 64
    heads: int = 2
    dtype: str = "float32"
    device: str = "cpu"
    repeats: int = 5
    warmup: int = 2
    timeout_s: float = 300.0
    mem_limit_gb: float = 16.0
    threads: int = 0
    options: dict[str, dict[str, Any]] | None = None
    quadratic_max: int | None = None  # skip N above this for mechanisms with O(N^2) time
    sdpa_backend: str | None = None  # force torch's SDPA to one backend (flash, cudnn, efficient, math)


def _is_quadratic(name: str) -> bool:
    from primaldual.attention.registry import list_attentions

    caps = {i.name: i.capabilities for i in list_attentions()}
    # softmax-family time strings: "O(N^2 D)", and "O(N D sum_h N/r_h)" for scaled heads (quadratic in N as well)
    return name in caps and ("N^2" in caps[name].time or "N/r_h" in caps[name].time)


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """Machine, versions and git commit, stored with every result file."""
    import torch

    import primaldual

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu = m.group(1) if m else cpu
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = ""
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "primaldual": primaldual.__version__,
        "git_commit": commit,
        "device": device,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


# ---------------------------------------------------------------------------------------------- worker


def _build_layer(name: str, dim: int, heads: int, opts: dict[str, Any], device, dtype):
    """A ``(B, N, dim) -> (B, N, dim)`` module and whether it takes our mask convention."""
    import torch

    if name == FLOOR:
        layer = projection_floor(dim, heads, **opts)
    elif name == "performer":
        from performer_pytorch import SelfAttention

        layer = SelfAttention(dim=dim, heads=heads, dim_head=dim // heads, causal=False, **opts)
    elif name == "nystrom":
        from nystrom_attention import NystromAttention

        layer = NystromAttention(dim=dim, heads=heads, dim_head=dim // heads, **opts)
    else:
        from primaldual import build_attention

        layer = build_attention(name, dim, heads, **opts)
    return layer.to(device=device, dtype=dtype), isinstance(layer, torch.nn.Module)


def _case_call(case: dict[str, Any]) -> tuple[Any, Any]:
    """One timed call of a case (forward, or forward + backward) and a device sync."""
    import torch

    if case.get("threads"):
        torch.set_num_threads(case["threads"])
    device = torch.device(case["device"])
    dtype = getattr(torch, case["dtype"])
    torch.manual_seed(0)
    layer, _ = _build_layer(case["attention"], case["dim"], case["heads"], case.get("options") or {}, device, dtype)
    layer.train(case["mode"] == "fwd_bwd")
    x = torch.randn(case["batch"], case["length"], case["dim"], device=device, dtype=dtype)
    x.requires_grad_(case["mode"] == "fwd_bwd")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    call = _plain_call(case, layer, x)
    backend = case.get("sdpa_backend")
    if backend is None:
        return call, sync
    # the softmax layers run torch's SDPA: forced to one backend, one that cannot run is the case's error
    from torch.nn.attention import SDPBackend, sdpa_kernel

    forced = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]

    def forced_call():
        with sdpa_kernel(forced):
            call()

    return forced_call, sync


def _plain_call(case: dict[str, Any], layer: Any, x: Any) -> Any:
    import torch

    def call():
        if case["mode"] == "fwd":
            with torch.no_grad():
                layer(x)
        else:
            out = layer(x)
            from primaldual.aux_loss import collect_aux_loss

            aux = collect_aux_loss(layer) if isinstance(layer, torch.nn.Module) else None
            loss = out.float().square().mean() + (aux if aux is not None else 0.0)
            loss.backward()
            x.grad = None
            layer.zero_grad(set_to_none=True)

    return call


def profile_tables(call: Any, sync: Any, device: str, calls: int, head: str, rows: int = 12) -> str:
    """torch.profiler over ``calls`` calls of ``call`` (after one warm-up call): the top ops by self time and by the
    memory they allocate themselves, as two tables headed by ``head``. Used to explain missed efficiency targets."""
    from torch.profiler import ProfilerActivity, profile

    call()
    sync()
    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, profile_memory=True) as prof:
        for _ in range(calls):
            call()
        sync()
    ev = prof.key_averages()
    dev = "cuda" if cuda else "cpu"
    return "\n".join(
        [
            f"# {head}: by self {dev} time",
            ev.table(sort_by=f"self_{dev}_time_total", row_limit=rows),
            f"# {head}: by memory allocated by the op itself",
            ev.table(sort_by=f"self_{dev}_memory_usage", row_limit=rows),
        ]
    )


def profile_layer(case: dict[str, Any], calls: int = 2, rows: int = 12) -> str:
    """:func:`profile_tables` of one layer case of the sweep (e.g. to explain a missed slope)."""
    call, sync = _case_call(case)
    head = f"{case['attention']} {case['mode']} N={case['length']} B={case['batch']} dim={case['dim']}, {calls} calls"
    return profile_tables(call, sync, case["device"], calls, head, rows)


def _worker(case: dict[str, Any]) -> dict[str, Any]:
    call, sync = _case_call(case)
    memory = PeakMemory(case["device"])
    times = []
    for i in range(case["warmup"] + case["repeats"]):
        sync()
        t0 = time.perf_counter()
        call()
        sync()
        if i >= case["warmup"]:
            times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "time_ms": 1e3 * times[len(times) // 2],
        "time_min_ms": 1e3 * times[0],
        "peak_mem_mb": memory.mb(),
        "mem_method": memory.method,
    }


def run_worker(case_json: str, worker) -> None:
    """Worker-process entry shared by the benchmarks: cap memory, run ``worker(case)``, print one RESULT line.

    Allocation failures become ``{"status": "oom"}`` records instead of crashes.
    """
    case = json.loads(case_json)
    if case["device"] == "cpu" and case["mem_limit_gb"] > 0:
        lim = int(case["mem_limit_gb"] * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    try:
        res = {"status": "ok", **worker(case)}
    except (RuntimeError, MemoryError) as e:  # allocation failures surface as either
        msg = str(e).lower()
        if not (isinstance(e, MemoryError) or "memory" in msg or "alloc" in msg):
            raise
        res = {"status": "oom", "error": str(e)[:200]}
    print("RESULT " + json.dumps(res), flush=True)


def _worker_main(case_json: str) -> None:
    run_worker(case_json, _worker)


# ---------------------------------------------------------------------------------------------- driver


def run_case(case: dict[str, Any], module: str = "primaldual.bench.layers") -> dict[str, Any]:
    """Run one case in a fresh interpreter (``python -m module --worker CASE``); returns the worker's record
    (status ok / oom / timeout / error)."""
    cmd = [sys.executable, "-m", module, "--worker", json.dumps(case)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=case["timeout_s"])
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    if proc.returncode in (-9, 137):
        return {"status": "oom", "error": "killed (SIGKILL), most likely out of memory"}
    return {"status": "error", "error": (proc.stderr or proc.stdout)[-500:]}


def run_sweep(cfg: SweepConfig, out: Path, progress: bool = True) -> list[dict[str, Any]]:
    """Run every case of ``cfg``; writes ``out`` (JSON) and ``out.with_suffix('.csv')``; returns the records."""
    records: list[dict[str, Any]] = []
    failed: set[tuple[str, str]] = set()
    cases = [(a, m, n) for a in cfg.attentions for m in cfg.modes for n in sorted(cfg.lengths)]
    try:
        from tqdm import tqdm

        it = tqdm(cases, desc="bench layers", disable=None if progress else True)  # None: a terminal only
    except ImportError:
        it = cases
    for attn, mode, n in it:
        batch = cfg.batch if cfg.tokens is None else max(1, cfg.tokens // n)
        case = {
            **asdict(cfg),
            "attention": attn,
            "mode": mode,
            "length": n,
            "batch": batch,
            "options": (cfg.options or {}).get(attn, {}),
        }
        for k in ("attentions", "lengths", "modes", "tokens"):
            case.pop(k)
        if (attn, mode) in failed:
            res = {"status": "skipped", "error": "failed at a smaller N"}
        elif cfg.quadratic_max is not None and n > cfg.quadratic_max and _is_quadratic(attn):
            res = {"status": "skipped", "error": f"O(N^2) mechanism, N > --quadratic-max {cfg.quadratic_max}"}
        else:
            res = run_case(case)
            if res["status"] != "ok":
                failed.add((attn, mode))
        rec = {"attention": attn, "mode": mode, "length": n, "batch": batch, "dim": cfg.dim, "heads": cfg.heads}
        rec.update({"dtype": cfg.dtype, "device": cfg.device, "options": case["options"], **res})
        records.append(rec)
        if hasattr(it, "set_postfix"):
            it.set_postfix_str(f"{attn} {mode} N={n}: {res.get('time_ms', res['status'])}")
        _write(out, cfg, records)
    return records


def _write(out: Path, cfg: SweepConfig, records: list[dict[str, Any]]) -> None:
    """Write the JSON and the CSV after every case, atomically: a killed sweep never leaves a truncated file."""
    payload = {"kind": "layers", "machine": machine_info(cfg.device), "settings": asdict(cfg), "records": records}
    atomic_write_json(out, payload, indent=1)
    fields = ["attention", "mode", "length", "batch", "dim", "heads", "dtype", "device", "status", "time_ms"]
    fields += ["time_min_ms", "peak_mem_mb", "mem_method"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    w.writerows(records)
    atomic_write_text(out.with_suffix(".csv"), buf.getvalue())


def fit_slope(lengths: list[float], values: list[float]) -> float | None:
    """Least-squares slope of log(value) on log(N) (None with fewer than 2 points)."""
    import numpy as np

    pts = [(n, v) for n, v in zip(lengths, values) if v and v > 0]
    if len(pts) < 2:
        return None
    x = np.log([p[0] for p in pts])
    y = np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def summary_table(records: list[dict[str, Any]], min_length: int = 4096) -> str:
    """Markdown table: per mechanism and mode, time/memory at each N and the fitted slopes from ``min_length``."""
    lengths = sorted({r["length"] for r in records})
    keys = sorted({(r["attention"], r["mode"]) for r in records})
    head = "| attention | mode | " + " | ".join(f"N={n}" for n in lengths) + " | time slope | mem slope |"
    lines = [head, "|" + "---|" * (len(lengths) + 4)]
    for a, m in keys:
        rs = {r["length"]: r for r in records if r["attention"] == a and r["mode"] == m}
        cells = []
        for n in lengths:
            r = rs.get(n)
            if r is None:
                cells.append("")
            elif r["status"] == "ok":
                cells.append(f"{r['time_ms']:.1f} ms / {r['peak_mem_mb']:.0f} MB")
            else:
                cells.append(r["status"])
        ok = [rs[n] for n in lengths if n in rs and rs[n]["status"] == "ok" and n >= min_length]
        ts = fit_slope([r["length"] for r in ok], [r["time_ms"] for r in ok])
        ms = fit_slope([r["length"] for r in ok], [r["peak_mem_mb"] for r in ok])
        fmt = lambda s: "" if s is None else f"{s:.2f}"  # noqa: E731
        lines.append(f"| {a} | {m} | " + " | ".join(cells) + f" | {fmt(ts)} | {fmt(ms)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="primaldual bench layers", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``primaldual bench layers``."""
    p.add_argument("--attentions", default="all", help="comma list of registry names and peers, or 'all'")
    p.add_argument("--peers", action="store_true", help="also run performer and nystrom (the 'bench' extra)")
    p.add_argument("--no-floor", action="store_true", help="leave out the primal layer's projection floor")
    p.add_argument("--lengths", default="256,1024,4096,16384,65536", help="comma list of N")
    p.add_argument("--modes", default="fwd,fwd_bwd", help="comma list of fwd, fwd_bwd")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 4)")
    p.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="tokens per call instead of --batch: each length N runs at batch max(1, TOKENS // N)",
    )
    p.add_argument("--dim", type=int, default=64, help="width")
    p.add_argument("--heads", type=int, default=2, help="heads")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per case (the median is reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per case first")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    p.add_argument("--mem-limit-gb", type=float, default=16.0, help="address-space cap per CPU case")
    p.add_argument("--threads", type=int, default=0, help="torch threads per case (0 = default)")
    p.add_argument("--options", default="{}", help='JSON per-attention options, e.g. {"primal": {"s": 20}}')
    p.add_argument(
        "--sdpa-backend",
        default=None,
        choices=["flash", "cudnn", "efficient", "math"],
        help="force torch's scaled_dot_product_attention (the softmax layers) to this backend in every case",
    )
    p.add_argument(
        "--quadratic-max",
        type=int,
        default=None,
        help="skip N above this for O(N^2) mechanisms (recorded as skipped), to spend the time on linear ones",
    )
    p.add_argument("--out", default="runs/bench/layers.json", help="output JSON file (a CSV is written beside it)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def _int_list(text: str, flag: str) -> list[int]:
    """A comma list of positive integers (at least one)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag}: expected a comma list of integers >= 1, got {text!r}")
    return values


def _options(text: str) -> dict[str, dict[str, Any]]:
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--options: not valid JSON ({e}): {text!r}") from None
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise ValueError(f'--options: expected {{"attention": {{"option": value}}}}, got {text!r}')
    return options


def _floor_options(options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The floor uses the primal layer's ``s`` unless given its own."""
    if FLOOR not in options and "s" in options.get("primal", {}):
        options = {**options, FLOOR: {"s": options["primal"]["s"]}}
    return options


def run_from_args(args: argparse.Namespace) -> int:
    """Run the sweep described by the parsed ``primaldual bench layers`` arguments.

    Raises:
        ValueError: an unknown attention or mode, or a malformed ``--lengths`` / ``--options``.
    """
    if args.worker is not None:
        _worker_main(args.worker)
        return 0
    from primaldual import list_attentions

    names = [i.name for i in list_attentions() if i.capabilities.non_causal]
    attns = names if args.attentions == "all" else [a.strip() for a in args.attentions.split(",") if a.strip()]
    if not attns:
        raise ValueError(f"--attentions: empty; give a comma list of {[*names, *PEERS]} or 'all'")
    if (args.attentions == "all" or "primal" in attns) and not args.no_floor:  # the floor rides along with primal
        attns += [FLOOR] if FLOOR not in attns else []
    if args.peers:
        attns += [p for p in PEERS if p not in attns]
    unknown = [a for a in attns if a not in names and a not in PEERS and a != FLOOR]
    if unknown:
        raise ValueError(f"--attentions: unknown {unknown}; choose from {[*names, FLOOR, *PEERS]}")
    if args.batch is not None and args.tokens is not None:
        raise ValueError("--batch and --tokens: give one (--tokens sets each length's batch to TOKENS // N)")
    for flag, value in (("--batch", args.batch), ("--tokens", args.tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: expected an integer >= 1, got {value}")
    cfg = SweepConfig(
        attentions=attns,
        lengths=_int_list(args.lengths, "--lengths"),
        modes=[m.strip() for m in args.modes.split(",")],
        batch=4 if args.batch is None else args.batch,
        tokens=args.tokens,
        dim=args.dim,
        heads=args.heads,
        dtype=args.dtype,
        device=args.device,
        repeats=args.repeats,
        warmup=args.warmup,
        timeout_s=args.timeout,
        mem_limit_gb=args.mem_limit_gb,
        threads=args.threads,
        options=_floor_options(_options(args.options)),
        quadratic_max=args.quadratic_max,
        sdpa_backend=args.sdpa_backend,
    )
    bad = [m for m in cfg.modes if m not in ("fwd", "fwd_bwd")]
    if bad:
        raise ValueError(f"--modes: takes fwd and/or fwd_bwd, got {bad}")
    out = Path(args.out)
    records = run_sweep(cfg, out)
    print(summary_table(records))
    print(f"\nwrote {out} and {out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2])
    else:
        sys.exit(main())
