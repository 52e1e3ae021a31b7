"""The prepared GPU run: correctness first, then the primal layer against SDPA, LM steps, decoding and LRA steps.

One command on a machine with one GPU (an H100 or H200), sized to about 9 minutes (540 s of step budgets), so
that one 10-minute device call holds it::

    python benchmarks/gpu_suite.py --out gpu_suite

Steps, each with a time budget; after every step ``suite.json`` (the environment and every step's records) and
``suite.md`` (its tables) are rewritten atomically, so a run cut off keeps what it measured:

1. ``tests``: the CUDA cases of the test files that have them (``pytest -rfEs -k "cuda or gpu"``), among them every
   registered mechanism against its float64 CPU result (``tests/attention/test_cuda.py``); the timing steps run only
   when they pass (``--keep-going`` times anyway and marks every figure untrusted).
2. ``layers``: one attention layer (with its QKV and output projections), bfloat16, forward + backward, width 768,
   12 heads, s = 20, N = 1K-64K at 64K tokens per call (batch 64K / N), causal and not: softmax with SDPA forced to
   its flash backend; primal eager, with the fused Triton score kernel (``kernel="triton"``) and with its compiled
   core; the projection floor; softmax with SDPA forced to cuDNN last
   (``primaldual bench layers --tokens 65536``: one call per mechanism and mask, one process per case inside it;
   median and minimum of the timed calls, peak memory). ``--causal only|no``, ``--no-compile`` and ``--layers``
   (the mechanisms by label) narrow it.
3. ``lm_steps``: training steps of ``lm/english/medium/{transformer,primalformer}`` at 4K tokens eager, compiled and
   compiled with CUDA graphs (``trainer.compile_mode=reduce-overhead``), PrimalFormer with the fused score kernel
   (eager and compiled), the CUDA graphs at 256 tokens, then 1K and 256 (``primaldual bench steps``; needs
   ``primaldual data fetch english``).
4. ``decode``: ms per generated token at 1K-64K context, batch 1 and 8, softmax's KV cache (eager) against primal
   and linear states replayed as CUDA graphs (``primaldual bench decode --cuda-graph``, random weights); then
   primal eager at 1K and 64K, batch 1.
5. ``lra``: LRA ListOps and Text training steps at the paper's batch sizes with AMP: Transformer (SDPA), the
   paper's materialised softmax (``transformer_eager``), PrimalFormer, Primal.+ (``primaldual bench lra --amp``).
6. ``profile``: the primal layer's operators by device time at N = 16K, eager and with the Triton kernel
   (``benchmarks/profile_layer.py``).

``--quick --device cpu`` runs every step at toy sizes (what CI checks; no GPU figures; the kernel's interpreter
tests are left to the test suite, which runs them anyway). A failing test is named in
``suite.json`` (``failures``: pytest's ``FAILED`` lines), not only in the output's tail.

Written by hand: it orchestrates our own ``primaldual bench`` commands and records the machine; nothing to reuse.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout that is not installed: its package is the one measured
    sys.path.insert(0, str(ROOT))
# the files with CUDA cases; only those cases run here (``-k "cuda or gpu"``): the CPU ones run in CI
GPU_TEST_FILES = (
    "tests/attention/test_cuda.py",
    "tests/models/test_lm.py",
    "tests/train/test_compile.py",
    "tests/data/test_augment.py",
    "tests/functional/test_scan.py",
    "tests/bench/test_decode.py",
    "tests/models/test_graphed.py",
)
# run whole: on a GPU every case of these runs natively (on a CPU, in Triton's interpreter)
KERNEL_TEST_FILES = ("tests/kernels/test_primal_scores.py",)
LENGTHS = (1024, 4096, 16384, 65536)
TOKENS_PER_CALL = 65536
# (label, attention, sdpa backend, options, shortest N): the mechanisms of the layer sweep, most needed first (a
# budget cut drops the last: cuDNN, timed on the H100 and the H200 already); the compiled primal layer compiles in
# each case's own process (tens of seconds)
LAYER_CASES = (
    ("softmax_flash", "softmax", "flash", {}, 0),
    ("primal", "primal", None, {"s": 20}, 0),  # its non-causal call also times the floor (projections alone)
    ("primal_triton", "primal", None, {"s": 20, "kernel": "triton"}, 0),  # the fused score kernel
    ("primal_compiled", "primal", None, {"s": 20, "compile": True}, 0),
    # the kernel as one opaque operator in the compiled core: the compiler fuses the work around it
    ("primal_triton_compiled", "primal", None, {"s": 20, "kernel": "triton", "compile": True}, 0),
    ("softmax_cudnn", "softmax", "cudnn", {}, 0),
)
# seconds per step, 540 s in all; measured on an H100 / H200: the tests 32 s (before the kernel tests compiled the
# core natively), a layer-sweep process ~10 s of start-up
# before its first case, the three-mechanism decode sweep ~100 s, one LM step comparison 10-20 s (compiled: more)
BUDGETS = {"tests": 75.0, "layers": 240.0, "lm_steps": 70.0, "decode": 60.0, "lra": 70.0, "profile": 25.0}


def environment(device: str) -> dict[str, Any]:
    """Device, torch, triton, CUDA and driver versions."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "host": platform.node(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        env["cudnn"] = torch.backends.cudnn.version()
    if shutil.which("nvidia-smi"):
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        env["driver"] = q.stdout.strip() or None
    return env


class Suite:
    """The output folder: ``suite.json`` and ``suite.md``, rewritten after every step."""

    def __init__(self, out: Path, env: dict[str, Any], settings: dict[str, Any]) -> None:
        self.out = out
        self.record: dict[str, Any] = {"environment": env, "settings": settings, "steps": {}}

    def save(self) -> None:
        from primaldual.utils.io import atomic_write_json, atomic_write_text

        atomic_write_json(self.out / "suite.json", self.record, indent=2)
        atomic_write_text(self.out / "suite.md", self.markdown())

    def step(self, name: str, result: dict[str, Any]) -> None:
        self.record["steps"][name] = result
        self.save()
        print(f"[{name}] {result['status']} in {result.get('seconds', 0):.0f} s", flush=True)

    def markdown(self) -> str:
        env = self.record["environment"]
        lines = [
            "# GPU suite",
            "",
            ", ".join(f"{k}: {v}" for k, v in env.items() if v is not None),
            "",
        ]
        if untrusted := self.record["settings"].get("untrusted"):
            lines += [f"**Untrusted figures:** {untrusted}.", ""]
        for name, res in self.record["steps"].items():
            lines += [f"## {name}: {res['status']} ({res.get('seconds', 0):.0f} s)", ""]
            if res.get("reason"):
                lines += [res["reason"], ""]
            if res.get("failures"):
                lines += [f"- `{f}`" for f in res["failures"]] + [""]
            if name == "layers" and res.get("records"):
                lines += _layer_table(res["records"]) + [""]
            for path in res.get("tables", []):
                p = self.out / path
                if p.is_file():
                    lines += [p.read_text().strip(), ""]
        return "\n".join(lines) + "\n"


def _layer_table(records: list[dict[str, Any]]) -> list[str]:
    """Rows: mechanism, causal; columns: N; cells: median ms (peak MB) of forward + backward."""
    lengths = sorted({r["length"] for r in records})
    rows: dict[tuple[str, bool], dict[int, str]] = {}
    for r in records:
        cell = f"{r['time_ms']:.2f} ms ({r['peak_mem_mb']:.0f} MB)" if r.get("status") == "ok" else r.get("status")
        rows.setdefault((r["label"], r["causal"]), {})[r["length"]] = str(cell)
    head = "| mechanism | causal | " + " | ".join(f"N={n}" for n in lengths) + " |"
    out = [head, "|" + "---|" * (len(lengths) + 2)]
    for (label, causal), cells in rows.items():
        out.append(f"| {label} | {causal} | " + " | ".join(cells.get(n, "") for n in lengths) + " |")
    return out


def _run(cmd: list[str], timeout: float) -> tuple[int | None, str]:
    """Run ``cmd`` from the repository root; ``(exit code or None on timeout, the end of its output)``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, timeout), env=env)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-2000:]
        return None, tail.decode() if isinstance(tail, bytes) else tail
    return res.returncode, (res.stdout + res.stderr)[-3000:]


def _failures(output: str) -> list[str]:
    """pytest's ``FAILED`` / ``ERROR`` summary lines (``-rfE``): the tail alone can hide which cases failed."""
    return [line[:400] for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def _status(code: int | None) -> str:
    return "done" if code == 0 else "budget spent" if code is None else "failed"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "primaldual.cli", *args]


def step_tests(suite: Suite, args: argparse.Namespace) -> bool:
    t0 = time.perf_counter()
    base = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]
    files = [f for f in GPU_TEST_FILES if (ROOT / f).is_file()]
    # a quick CPU check of the script: the kernel's interpreter tests are the test suite's own, not run twice
    quick_cpu = args.quick and args.device == "cpu"
    kernels = [f for f in KERNEL_TEST_FILES if (ROOT / f).is_file() and not quick_cpu]
    runs = [(base + ["-k", "cuda or gpu", *files], files), (base + kernels, kernels)]
    outputs, failures, ok = [], [], True
    for cmd, chosen in runs:
        if not chosen:
            continue
        left = BUDGETS["tests"] * args.budget_scale - (time.perf_counter() - t0)
        code, tail = _run(cmd, left)
        ok = ok and code == 0
        outputs.append(tail)
        failures += _failures(tail) or ([] if code == 0 else [f"{' '.join(chosen)}: exit {code} (None: timed out)"])
    suite.step(
        "tests",
        {
            "status": "passed" if ok else "failed",
            "seconds": time.perf_counter() - t0,
            "files": files + kernels,
            "failures": failures,
            "output": "\n".join(outputs)[-3000:],
        },
    )
    return ok


def step_layers(suite: Suite, args: argparse.Namespace) -> None:
    """One ``bench layers`` call per (mechanism, mask) over all lengths: it runs each length in its own process,
    so a call here per length would pay the interpreter and CUDA start twice per case."""
    t0 = time.perf_counter()
    budget = BUDGETS["layers"] * args.budget_scale
    lengths = (64,) if args.quick else LENGTHS
    tokens = 256 if args.quick else TOKENS_PER_CALL
    dim, heads = (32, 2) if args.quick else (768, 12)
    dtype = "float32" if args.quick else "bfloat16"
    records: list[dict[str, Any]] = []
    status = "done"
    work = suite.out / "layers"
    causal_cases = {"both": (False, True), "no": (False,), "only": (True,)}[args.causal]
    # mechanisms outside, masks inside: a budget cut drops the last mechanisms (cuDNN, compiled) of both masks
    for label, attention, backend, options, shortest in LAYER_CASES:
        if args.layers and label not in args.layers:
            continue
        for causal in (False,) if args.quick else causal_cases:
            if args.quick and (options.get("compile") or backend == "cudnn" or options.get("kernel")):
                continue  # minutes of CPU compilation; no cuDNN or Triton on a CPU: no information at toy sizes
            if options.get("compile") and args.no_compile:
                continue
            left = budget - (time.perf_counter() - t0)
            if left <= 0:
                status = "budget spent"
                break
            ns = [n for n in lengths if n >= shortest or args.quick]
            opts = {**options, "s": min(options.get("s", 20), 8)} if args.quick and "s" in options else options
            if causal:
                opts = {**opts, "causal": True}
            out = work / f"{label}_{'causal' if causal else 'full'}.json"
            cmd = _cli(
                "bench", "layers", "--attentions", attention, "--lengths", ",".join(map(str, ns)),
                "--modes", "fwd_bwd", "--tokens", str(tokens), "--dim", str(dim), "--heads", str(heads),
                "--dtype", dtype, "--device", args.device, "--repeats", "1" if args.quick else "5",
                "--warmup", "0" if args.quick else "2", "--timeout", str(max(5.0, min(left, 120.0))),
                "--options", json.dumps({attention: opts} if opts else {}), "--out", str(out),
            )  # fmt: skip
            if backend is not None:
                cmd += ["--sdpa-backend", backend]
            floor = label == "primal" and not causal
            if not floor:
                cmd += ["--no-floor"]
            code, tail = _run(cmd, left)
            # the sweep rewrites its JSON after every case: a call cut off by the budget keeps the lengths it timed
            cases = json.loads(out.read_text())["records"] if out.is_file() else []
            for name, shown in ((attention, label), *((("projections", "floor"),) if floor else ())):
                by_n = {c.get("length"): c for c in cases if c.get("attention") == name}
                for n in ns:
                    rec: dict[str, Any] = {"label": shown, "causal": causal, "length": n, "batch": max(1, tokens // n)}
                    if (case := by_n.get(n)) is not None:
                        rec.update(status=case.get("status"), time_ms=case.get("time_ms"),
                                   time_min_ms=case.get("time_min_ms"), peak_mem_mb=case.get("peak_mem_mb"))  # fmt: skip
                        if case.get("error"):
                            rec["error"] = case["error"][-300:]
                    else:
                        rec.update(status="error" if code is not None else "timeout", error=tail[-300:])
                    records.append(rec)
        if status != "done":
            break
    settings = {"dim": dim, "heads": heads, "dtype": dtype, "tokens_per_call": tokens, "mode": "fwd_bwd"}
    suite.step(
        "layers", {"status": status, "seconds": time.perf_counter() - t0, "settings": settings, "records": records}
    )


def step_profile(suite: Suite, args: argparse.Namespace) -> None:
    """The primal layer's kernels by device time (``benchmarks/profile_layer.py``), eager and with the fused kernel:
    the cause behind its gap to the floor in the layer table."""
    t0 = time.perf_counter()
    n, b, dim, heads = (64, 2, 32, 2) if args.quick else (16384, 4, 768, 12)
    dtype = "float32" if args.quick else "bfloat16"
    variants = [("eager", {"s": 8 if args.quick else 20, "path": "scores"})]
    if not args.quick:
        variants.append(("triton", {"s": 20, "kernel": "triton"}))
    tables, runs = [], []
    for label, opts in variants:
        left = BUDGETS["profile"] * args.budget_scale - (time.perf_counter() - t0)
        if left <= 0:
            break
        out = suite.out / f"profile_primal_{label}.md"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_layer.py"), "--attention", "primal",
               "--options", json.dumps(opts), "--device", args.device, "--dtype", dtype, "--length", str(n),
               "--batch", str(b), "--dim", str(dim), "--heads", str(heads), "--out", str(out)]  # fmt: skip
        code, tail = _run(cmd, left)
        runs.append({"variant": label, "exit": code, **({} if code == 0 else {"error": tail[-500:]})})
        if code == 0:
            tables.append(out.name)
    status = "done" if runs and all(r["exit"] == 0 for r in runs) else "partial"
    suite.step("profile", {"status": status, "seconds": time.perf_counter() - t0, "runs": runs, "tables": tables})


def step_lm_steps(suite: Suite, args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    if args.quick:
        suite.step("lm_steps", {"status": "skipped", "seconds": 0.0, "reason": "--quick: needs the English corpus"})
        return
    runs = []
    # 4K first, eager and compiled: the comparison issue 44 asks for; then PrimalFormer with the fused score kernel
    # (the Transformer has no such option), then the launch-bound lengths
    # compiled: False, True (torch.compile's default mode) or "reduce-overhead" (its graphs replayed as CUDA graphs)
    cases = [(4096, False, False), (4096, True, False), (4096, "reduce-overhead", False), (4096, False, True)]
    cases += [(4096, True, True), (256, "reduce-overhead", False), (1024, False, False), (256, False, False)]
    cases += [(1024, True, False), (256, True, False)]
    for n, compiled, triton in cases:
        left = BUDGETS["lm_steps"] * args.budget_scale - (time.perf_counter() - t0)
        if left <= 0:
            break
        mode = ["--set", f"trainer.compile_mode={compiled}"] if isinstance(compiled, str) else []
        name = f"n{n}{'_compiled' if compiled else ''}{'_graphs' if mode else ''}{'_triton' if triton else ''}"
        out = suite.out / "lm_steps" / name
        configs = (
            ["lm/english/medium/primalformer"]
            if triton
            else ["lm/english/medium/transformer", "lm/english/medium/primalformer"]
        )
        kernel = ["--set", "model.primal_options.kernel=triton"] if triton else []
        cmd = _cli(
            "bench", "steps", *configs,
            "--device", args.device, "--steps", "5", "--rounds", "3", "--warmup", "2",
            "--set", f"data.max_len={n}", "--set", f"trainer.compile={str(bool(compiled)).lower()}", *mode, *kernel,
            "--out", str(out),
        )  # fmt: skip
        code, tail = _run(cmd, left)
        runs.append(
            {"tokens": n, "compiled": compiled, "triton": triton, "exit": code, "out": str(out.relative_to(suite.out))}
        )
        if code != 0:
            runs[-1]["error"] = tail[-500:]
    tables = [str(Path(r["out"]) / "steps.md") for r in runs if r["exit"] == 0]
    status = "done" if runs and all(r["exit"] == 0 for r in runs) else "partial"
    suite.step("lm_steps", {"status": status, "seconds": time.perf_counter() - t0, "runs": runs, "tables": tables})


def step_decode(suite: Suite, args: argparse.Namespace) -> None:
    """Constant states replayed as CUDA graphs against the eager KV cache (as a user runs each), primal first; then,
    with what is left of the budget, primal decoding eager at 1K and 64K: what the graph removes."""
    t0 = time.perf_counter()
    budget = BUDGETS["decode"] * args.budget_scale
    size = ["--dim", "32", "--depth", "1", "--heads", "2", "--vocab", "64"] if args.quick else []
    calls = (
        ("decode", "softmax,primal" if args.quick else "primal,softmax,linear", "1" if args.quick else "1,8",
         "32" if args.quick else "1024,16384,65536", not args.quick),
        ("decode_eager", "primal", "1", "32" if args.quick else "1024,65536", False),
    )  # fmt: skip
    res: dict[str, Any] = {"status": "done", "tables": [], "records": []}
    for name, attentions, batches, contexts, graph in calls:
        left = budget - (time.perf_counter() - t0)
        if left <= 0:
            res["status"] = "budget spent"
            break
        out = suite.out / "decode" / f"{name}.json"
        cmd = _cli(
            "bench", "decode", "--device", args.device, "--contexts", contexts, "--batches", batches,
            "--attentions", attentions, "--steps", "2" if args.quick else "16", *size,
            *(["--cuda-graph"] if graph else []), "--out", str(out),
        )  # fmt: skip
        code, tail = _run(cmd, left)
        if code == 0:
            res["tables"].append(str(out.with_suffix(".md").relative_to(suite.out)))
        else:
            res["status"], res[f"error_{name}"] = _status(code), tail[-800:]
        res["records"] += [{**r, "cuda_graph": bool(r.get("cuda_graph"))} for r in _records(out)]
        if code != 0:
            break
    res["seconds"] = time.perf_counter() - t0
    suite.step("decode", res)


def step_lra(suite: Suite, args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    if args.quick:
        suite.step("lra", {"status": "skipped", "seconds": 0.0, "reason": "--quick: the paper's batch sizes"})
        return
    out = suite.out / "lra" / "lra.json"
    cmd = _cli(
        "bench",
        "lra",
        "--device",
        args.device,
        "--amp",
        "--tasks",
        "listops,text",
        "--steps",
        "5",
        "--out",
        str(out),
        "--models",
        "transformer,transformer_eager,primalformer,primal_plus",
    )  # fmt: skip  (both baselines: SDPA, and the materialised softmax the paper's Table 3 timed)
    code, tail = _run(cmd, BUDGETS["lra"] * args.budget_scale)
    res: dict[str, Any] = {"status": _status(code), "seconds": time.perf_counter() - t0, "records": _records(out)}
    if code != 0:
        res["error"] = tail[-800:]
    suite.step("lra", res)


def _records(path: Path) -> list[dict]:
    """The records a bench command wrote to its JSON (rewritten after each case, so a budget cut keeps them)."""
    try:
        return json.loads(path.read_text()).get("records", [])
    except (OSError, ValueError):
        return []


STEPS = {
    "layers": step_layers,
    "lm_steps": step_lm_steps,
    "decode": step_decode,
    "lra": step_lra,
    "profile": step_profile,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (suite.json, suite.md, each step's files)")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu with --quick")
    p.add_argument("--quick", action="store_true", help="toy sizes: checks that every step runs (no figures)")
    p.add_argument("--steps", default="tests," + ",".join(STEPS), help="comma list of steps to run, in order")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every step's time budget")
    p.add_argument("--causal", choices=("both", "no", "only"), default="both", help="layers step: which masks")
    p.add_argument("--no-compile", action="store_true", help="layers step: skip the compiled primal layer")
    labels = [case[0] for case in LAYER_CASES]
    p.add_argument(
        "--layers",
        default="",
        metavar="LABEL,...",
        help=f"layers step: only these mechanisms, from {', '.join(labels)} (default all; the floor comes with primal)",
    )
    p.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="STEP=SECONDS",
        help="one step's time budget in seconds (repeatable), before --budget-scale",
    )
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="time even when the tests fail (one-shot leases); suite.json marks every figure as untrusted then",
    )
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.steps.split(",") if s.strip()]
    if unknown := [s for s in chosen if s != "tests" and s not in STEPS]:
        p.error(f"--steps: unknown {unknown}; choose from {['tests', *STEPS]}")
    if args.budget_scale <= 0:
        p.error("--budget-scale: expected a number > 0")
    args.layers = [x.strip() for x in args.layers.split(",") if x.strip()]
    if wrong := [x for x in args.layers if x not in labels]:
        p.error(f"--layers: unknown {wrong}; choose from {labels}")
    for item in args.budget:
        name, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if name not in BUDGETS or seconds <= 0:
            p.error(f"--budget: expected STEP=SECONDS with STEP in {list(BUDGETS)} and SECONDS > 0, got {item!r}")
        BUDGETS[name] = seconds
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: no CUDA device here (run with --quick --device cpu to check the steps)")
    elif not args.quick:
        p.error("--device cpu: only with --quick (the figures are GPU figures)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suite = Suite(out, environment(args.device), {"quick": args.quick, "steps": chosen, "budgets": BUDGETS})
    suite.save()
    if "tests" in chosen and not step_tests(suite, args):
        if not args.keep_going:
            print("the correctness tests failed: no timing (see suite.json)", flush=True)
            return 1
        suite.record["settings"]["untrusted"] = "the correctness tests failed; timed anyway (--keep-going)"
        print("the correctness tests failed: timing anyway (--keep-going)", flush=True)
    for name in chosen:
        if name != "tests":
            STEPS[name](suite, args)
    print(f"wrote {out / 'suite.json'} and {out / 'suite.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
