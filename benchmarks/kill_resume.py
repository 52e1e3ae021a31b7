"""A killed run always resumes: SIGKILL a tiny run at random moments until it finishes, and compare it with an
uninterrupted run of the same command.

Each trial starts ``primaldual fit`` in a new run directory, kills it (SIGKILL: no handler runs) after a random
delay drawn from the uninterrupted run's own wall time (the bound doubles after every 10 kills, for a busier
machine), and starts the same command again, until a start ends by itself. The kills land anywhere: during start-up, in an epoch, inside a checkpoint or history write. A trial passes
when the run ends with exit 0 and its ``summary.json`` metrics, every ``history.csv`` row and the last checkpoint's
weights equal the uninterrupted run's, bit for bit, and the run directory holds nothing but primaldual's own
entries (no leftover temporary file).

Usage::

    python benchmarks/kill_resume.py --trials 20 --out kill_resume.json
    python benchmarks/kill_resume.py --config uea/JapaneseVowels/primalformer --trials 3 --max-epochs 3

Default config: the tiny JapaneseVowels model the harness tests use (width 16, primal + softmax layers, dropout),
6 epochs. Written by hand: a fault-injection loop around our own CLI, which no library provides.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TINY: dict[str, Any] = {
    "name": "kill_resume",
    "task": "uea",
    "protocol": "heldout",
    "seed": 3,
    "data": {"name": "JapaneseVowels", "val_fraction": 0.2, "batch_size": 16},
    "model": {
        "dim": 16,
        "depth": 2,
        "num_heads": 2,
        "ffn_dim": 32,
        "dropout": 0.1,
        "attention": ["softmax", "primal"],
        "attention_options": [None, {"s": 4}],
    },
    "optim": {"name": "radam", "lr": 3e-3},
    "trainer": {"max_epochs": 6, "accelerator": "cpu", "gradient_clip_val": 4.0, "enable_progress_bar": False},
}
METRICS = ("epochs", "best_epoch", "test_acc", "test_loss", "val_acc")


def _cmd(config: str, run_dir: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "primaldual.cli", "fit", "--config", config, "--run-dir", str(run_dir), *extra]


def _history(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "history.csv", newline="") as f:
        return [{k: v for k, v in row.items() if "time" not in k} for row in csv.DictReader(f)]


def _weights_equal(a: Path, b: Path) -> bool:
    import torch

    x = torch.load(a, weights_only=True)["state_dict"]
    y = torch.load(b, weights_only=True)["state_dict"]
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _leftovers(run_dir: Path) -> list[str]:
    from primaldual.train.rundir import _foreign, _foreign_inside

    return [p for p in _foreign(run_dir) + _foreign_inside(run_dir) if not p.startswith("run.lock")]


def trial(
    cmd: list[str], run_dir: Path, reference: Path, span: float, rng: random.Random, max_starts: int
) -> dict[str, Any]:
    """Kill ``cmd`` at random moments until a start finishes; compare with ``reference``."""
    kills: list[float] = []
    for _ in range(max_starts):
        # on a machine busier than during the uninterrupted run a start may need longer than ``span`` to reach its
        # first checkpoint: the bound doubles after every 10 kills, so a trial always ends
        delay = rng.uniform(0.3, span * 2 ** (len(kills) // 10))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            kills.append(round(delay, 2))
            continue
        if proc.returncode != 0:
            return {"passed": False, "kills": kills, "error": err.strip().splitlines()[-1:] or [proc.returncode]}
        break
    else:
        return {"passed": False, "kills": kills, "error": f"still running after {max_starts} starts"}
    ref = json.loads((reference / "summary.json").read_text())
    got = json.loads((run_dir / "summary.json").read_text())
    problems = [k for k in METRICS if got.get(k) != ref.get(k)]
    if _history(run_dir) != _history(reference):
        problems.append("history.csv")
    if not _weights_equal(run_dir / "checkpoints" / "last.ckpt", reference / "checkpoints" / "last.ckpt"):
        problems.append("last.ckpt weights")
    if left := _leftovers(run_dir):
        problems.append(f"left behind: {left}")
    return {"passed": not problems, "kills": kills, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="a config name or file (default: the tiny JapaneseVowels run)")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--max-epochs", type=int, help="override trainer.max_epochs")
    p.add_argument("--max-starts", type=int, default=40, help="starts per trial before it counts as failed")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill times")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="write the per-trial results as JSON here")
    p.add_argument("--work", help="directory for the runs (default: a temporary one, removed afterwards)")
    args = p.parse_args(argv)
    if args.trials < 1 or args.max_starts < 2 or args.threads < 1:
        p.error("--trials >= 1, --max-starts >= 2 and --threads >= 1 expected")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        config = args.config
        if config is None:
            import yaml

            config = str(work / "kill_resume.yaml")
            Path(config).write_text(yaml.safe_dump(TINY, sort_keys=False))
        extra = ["--threads", str(args.threads)]
        if args.max_epochs is not None:
            extra += ["--trainer.max_epochs", str(args.max_epochs)]
        reference = work / "uninterrupted"
        t0 = time.perf_counter()
        subprocess.run(_cmd(config, reference, extra), check=True, stdout=subprocess.DEVNULL)
        span = time.perf_counter() - t0
        print(f"uninterrupted: {span:.1f} s; kills drawn from U(0.3, {span:.1f}) s", flush=True)
        rng = random.Random(args.seed)
        results = []
        for i in range(args.trials):
            res = trial(
                _cmd(config, work / f"trial{i}", extra), work / f"trial{i}", reference, span, rng, args.max_starts
            )
            results.append(res)
            print(
                f"trial {i}: {'pass' if res['passed'] else 'FAIL'} after {len(res['kills'])} kills "
                f"{res['kills']} {res.get('problems') or res.get('error') or ''}",
                flush=True,
            )
        passed = sum(r["passed"] for r in results)
        kills = sum(len(r["kills"]) for r in results)
        print(f"{passed} of {args.trials} trials resumed to the uninterrupted result ({kills} kills in all)")
        if args.out:
            from primaldual.utils.io import atomic_write_json

            atomic_write_json(
                args.out,
                {"passed": passed, "trials": args.trials, "kills": kills, "uninterrupted_s": span, "results": results},
                indent=2,
            )
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
