"""Where one attention layer's forward + backward spends its time, kernel by kernel (``torch.profiler``).

    python benchmarks/profile_layer.py --device cuda --dtype bfloat16 --attention primal --length 16384 --batch 4 \\
        --out profile.md

Builds the layer as ``primaldual bench layers`` does (width, heads, options), runs warm-up calls, then profiles
``--calls`` forward + backward passes (the KSVD term included, as in training) and writes a Markdown table of the
operators by their self time on the device (CUDA time on a GPU, CPU time otherwise), with call counts, plus the
number of kernel launches per call. The GPU suite runs it on the primal layer so that a measured gap to the layer's
floor comes with its cause.

Written by hand: a thin wrapper of ``torch.profiler`` with our layer builder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def profile_layer(
    attention: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    length: int = 1024,
    batch: int = 4,
    dim: int = 768,
    heads: int = 12,
    options: dict | None = None,
    calls: int = 3,
    warmup: int = 2,
    rows: int = 20,
) -> tuple[str, dict]:
    """``(markdown, summary)`` of the profile of ``calls`` forward + backward passes."""
    from torch.profiler import ProfilerActivity, profile

    import primaldual as pd

    dt = getattr(torch, dtype)
    layer = pd.build_attention(attention, dim, heads, device=device, dtype=dt, **(options or {})).train()
    x = torch.randn(batch, length, dim, device=device, dtype=dt, requires_grad=True)

    def step() -> None:
        y = layer(x)
        aux = pd.collect_aux_loss(layer)
        loss = y.float().square().mean() + (aux if aux is not None else 0.0)
        loss.backward()

    for _ in range(warmup):
        step()
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(calls):
            step()
        if cuda:
            torch.cuda.synchronize()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in averages) or 1.0
    launches = sum(e.count for e in averages if cuda and getattr(e, "self_device_time_total", 0) > 0)
    table = [
        f"# Profile: {attention} {json.dumps(options or {})}, {dtype} on {device}, B {batch} x N {length}, C {dim}, "
        f"H {heads}, forward + backward, {calls} calls",
        "",
        f"{'device' if cuda else 'CPU'} time per call: {total / calls / 1e3:.3f} ms"
        + (f"; kernels launched per call: {launches / calls:.0f}" if cuda else ""),
        "",
        "| operator | self time per call (ms) | share | calls per call |",
        "|---|---:|---:|---:|",
    ]
    for e in averages[:rows]:
        t = getattr(e, key)
        if t <= 0:
            continue
        table.append(f"| `{e.key}` | {t / calls / 1e3:.3f} | {t / total:.1%} | {e.count / calls:.0f} |")
    summary = {"ms_per_call": total / calls / 1e3, "kernels_per_call": launches / calls if cuda else None}
    return "\n".join(table) + "\n", summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attention", default="primal")
    p.add_argument("--options", default="{}", help='JSON layer options, e.g. {"s": 20}')
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--out", default=None, help="write the Markdown table here too")
    args = p.parse_args(argv)
    try:
        options = json.loads(args.options)
    except json.JSONDecodeError as err:
        p.error(f"--options: not valid JSON ({err})")
    if not isinstance(options, dict):
        p.error('--options: expected a JSON object such as {"s": 20}')
    for flag, value in (("--length", args.length), ("--batch", args.batch), ("--calls", args.calls)):
        if value < 1:
            p.error(f"{flag}: expected an integer >= 1, got {value}")
    md, _ = profile_layer(
        args.attention, device=args.device, dtype=args.dtype, length=args.length, batch=args.batch, dim=args.dim,
        heads=args.heads, options=options, calls=args.calls,
    )  # fmt: skip
    print(md)
    if args.out:
        from primaldual.utils.io import atomic_write_text

        atomic_write_text(Path(args.out), md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
