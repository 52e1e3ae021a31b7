"""Benchmark: Attention-SH memory and Attention-BN time against softmax attention.

1. **Memory.** Peak attention memory of ``softmax_sh`` (default ladder ``1, 1, 2, 2, 4, 4, 8, 8``) vs ``softmax``,
   both on the eager path (the attention matrix is materialised), forward + backward on ``(1, 8, N, 64)``
   float32 q, k, v at N = 4096. Each case runs in a fresh subprocess and reports, over the baseline taken after
   the inputs exist, the memory **held after the forward pass** (current RSS; on CUDA ``memory_allocated``): what
   autograd saved for backward, i.e. the attention matrices of all heads, which is what ``(1/H) sum_h 1/r_h``
   predicts; and the **peak over forward + backward** (``ru_maxrss``; on CUDA ``max_memory_allocated``), which adds
   transient score/gradient buffers. SH processes head groups one after another, so its transients are those of
   one group, and its peak ratio falls below the prediction.
2. **Time.** Forward + backward of the ``softmax_bn`` layer vs the ``softmax`` layer (same default backend),
   median of interleaved repeats after warm-up.

Usage::

    python benchmarks/svr_attention.py                 # both, N = 4096 memory, N = 1024 time
    python benchmarks/svr_attention.py --out runs/svr_attention.json

Writes a JSON record with the machine, versions and settings when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

import primaldual as pd
from primaldual.functional.softmax import softmax_attention
from primaldual.functional.svr import factor_ladder, memory_ratio, svr_attention


def _rss_now() -> int:
    """Current resident set size in bytes (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _peak_case(mech: str, n: int, heads: int, head_dim: int, device: str) -> dict:
    """Runs inside the subprocess: one forward + backward; memory growth in MiB.

    ``retained_mib``: memory still held after the forward pass (what autograd saved for backward: the attention
    matrices); ``peak_mib``: the peak over forward + backward (adds the transient buffers of the largest step).
    """
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim, device=device, requires_grad=True) for _ in range(3))
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = base_peak = torch.cuda.memory_allocated()
    else:
        base, base_peak = _rss_now(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if mech == "softmax":
        out, _ = softmax_attention(q, k, v, backend="eager")
    else:
        out, _ = svr_attention(q, k, v, factors=factor_ladder(heads), backend="eager")
    retained = (torch.cuda.memory_allocated() if cuda else _rss_now()) - base
    out.sum().backward()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mech": mech, "retained_mib": retained / 2**20, "peak_mib": (peak - base_peak) / 2**20}


def memory(n: int, heads: int, head_dim: int, device: str) -> dict:
    res = {}
    for mech in ("softmax", "softmax_sh"):
        cmd = [sys.executable, __file__, "--_case", mech, "--n", str(n), "--heads", str(heads)]
        cmd += ["--head-dim", str(head_dim), "--device", device]
        # a fixed mmap threshold makes glibc return every freed buffer over 1 MiB to the OS at once, so the RSS
        # held after the forward pass counts live tensors only (the default threshold grows to 32 MiB and keeps
        # freed score buffers of the smaller head groups in the heap)
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            oom = "out of memory" in p.stderr.lower() or p.returncode in (-9, 137)
            res[mech] = {"error": "OOM" if oom else p.stderr.strip().splitlines()[-1]}
            continue
        res[mech] = json.loads(p.stdout.strip().splitlines()[-1])
    predicted = memory_ratio(factor_ladder(heads))
    ok = all("peak_mib" in r for r in res.values())
    sh, sm = res["softmax_sh"], res["softmax"]
    retained = sh["retained_mib"] / sm["retained_mib"] if ok else None
    peak = sh["peak_mib"] / sm["peak_mib"] if ok else None
    return {
        "n": n,
        "heads": heads,
        "head_dim": head_dim,
        "factors": factor_ladder(heads),
        "cases": res,
        "predicted_ratio": predicted,
        "retained_ratio": retained,
        "peak_ratio": peak,
        "retained_within_10pct": None if retained is None else abs(retained / predicted - 1) <= 0.10,
    }


def timing(n: int, batch: int, dim: int, heads: int, repeats: int, device: str) -> dict:
    torch.manual_seed(0)
    layers = {name: pd.build_attention(name, dim, heads, device=device) for name in ("softmax", "softmax_bn")}
    layers["softmax_bn"].load_state_dict(layers["softmax"].state_dict())
    x = torch.randn(batch, n, dim, device=device)

    def step(layer):
        xi = x.detach().requires_grad_(True)
        layer(xi).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {k: [] for k in layers}
    for layer in layers.values():
        for _ in range(2):  # warm-up
            step(layer)
    for _ in range(repeats):  # interleaved, so drifting machine load hits both alike
        for name, layer in layers.items():
            t0 = time.perf_counter()
            step(layer)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "n": n,
        "batch": batch,
        "dim": dim,
        "heads": heads,
        "repeats": repeats,
        "median_s": med,
        "ratio_bn_over_softmax": med["softmax_bn"] / med["softmax"],
        "within_1p3x": med["softmax_bn"] / med["softmax"] <= 1.3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="sequence length of the memory case")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--time-n", type=int, default=1024, help="sequence length of the timing case")
    ap.add_argument("--time-batch", type=int, default=2)
    ap.add_argument("--time-dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--only", choices=["memory", "time"], default=None)
    ap.add_argument("--out", default=None, help="write the JSON record here")
    ap.add_argument("--_case", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._case:
        print(json.dumps(_peak_case(args._case, args.n, args.heads, args.head_dim, args.device)))
        return
    record = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "device": args.device},
        "versions": {"torch": torch.__version__, "primaldual": pd.__version__},
        "threads": torch.get_num_threads(),
    }
    if args.only in (None, "memory"):
        m = memory(args.n, args.heads, args.head_dim, args.device)
        record["memory"] = m
        for mech, r in m["cases"].items():
            if "error" in r:
                print(f"memory  {mech:<11} N={args.n} H={args.heads}: {r['error']}")
            else:
                print(
                    f"memory  {mech:<11} N={args.n} H={args.heads}: held after forward {r['retained_mib']:.1f} MiB, "
                    f"peak fwd+bwd {r['peak_mib']:.1f} MiB"
                )
        if m["retained_ratio"] is not None:
            print(
                f"memory  ratio softmax_sh / softmax: held after forward {m['retained_ratio']:.4f}, peak "
                f"{m['peak_ratio']:.4f}; predicted {m['predicted_ratio']:.4f} (factors {m['factors']}); "
                f"held within 10%: {m['retained_within_10pct']}"
            )
    if args.only in (None, "time"):
        t = timing(args.time_n, args.time_batch, args.time_dim, args.heads, args.repeats, args.device)
        record["time"] = t
        for name, s in t["median_s"].items():
            print(f"time    {name:<11} fwd+bwd B={t['batch']} N={t['n']} dim={t['dim']}: {s * 1e3:.1f} ms (median)")
        print(f"time    ratio softmax_bn / softmax: {t['ratio_bn_over_softmax']:.3f}, within 1.3x: {t['within_1p3x']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
