"""Multi-seed runner: every (config, protocol, seed) as its own ``primaldual fit`` process, then mean +- std.

Runs are separate processes (``--jobs`` at a time, ``--threads`` torch threads each) so that one crash or
SIGKILL loses nothing: re-running the same command skips finished runs (their ``summary.json`` exists) and
resumes unfinished ones from ``last.ckpt``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..tasks.base import Task, get_task
from .config import ConfigError, load_config, parse_overrides
from .run import default_run_dir

__all__ = ["format_table", "run_seeds"]


def _one(cmd: list[str], log: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode


def run_seeds(
    configs: list[str],
    seeds: list[int],
    protocols: list[str],
    overrides: list[str],
    *,
    base: str = "runs",
    jobs: int = 1,
    threads: int | None = None,
    config_dir: str | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume, or reuse) every combination; return the summaries (``config_dir``: see ``--config-dir``)."""
    for key, _ in parse_overrides(list(overrides)):
        if key in ("seed", "protocol"):  # each run's own, from the grid: an override would collapse it
            raise ConfigError(f"--{key}: `primaldual seeds` sets each run's {key}; give them with --{key}s")
    plan = []
    for spec in configs:
        for protocol in protocols:
            for seed in seeds:
                extra = [*overrides, "--protocol", protocol, "--seed", str(seed)]
                cfg = load_config(spec, extra, config_dir)
                run_dir = default_run_dir(cfg, base)
                cmd = [sys.executable, "-m", "primaldual.cli", "fit", "--config", spec, *extra]
                cmd += ["--config-dir", str(config_dir)] if config_dir is not None else []
                cmd += ["--trainer.enable_progress_bar", "false", "--run-dir", str(run_dir)]
                if threads:
                    cmd += ["--threads", str(threads)]
                plan.append((cfg, run_dir, cmd))

    def go(item: tuple[Any, Path, list[str]]) -> dict[str, Any]:
        cfg, run_dir, cmd = item
        done = run_dir / "summary.json"
        if not done.is_file():
            t0 = time.time()
            print(f"[start] {cfg.name} {cfg.protocol} seed {cfg.seed} -> {run_dir}", flush=True)
            rc = _one(cmd, run_dir.with_suffix(".log"))
            if rc != 0 or not done.is_file():
                raise RuntimeError(f"run failed (exit {rc}); see {run_dir.with_suffix('.log')}")
            print(f"[done ] {cfg.name} {cfg.protocol} seed {cfg.seed} in {time.time() - t0:.0f}s", flush=True)
        return json.loads(done.read_text())

    # Every run gets its chance before a failure is reported: one crashed run must not cancel the others.
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(go, item) for item in plan]
    failed = [str(f.exception()) for f in futures if f.exception() is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(plan)} runs failed:\n" + "\n".join(failed))
    return [f.result() for f in futures]


def format_table(summaries: list[dict[str, Any]], command: str | None = None) -> str:
    """Markdown table: one row per (dataset, config), one column per protocol, test accuracy mean +- std (n seeds);
    when every summary is of one task, that task's figure (test perplexity for ``lm``, the final normalised score for
    ``offline_rl``: :meth:`~primaldual.tasks.Task.table_value`).

    Rows are keyed by dataset as well as config name, so configs of different tasks that share a name (the LRA
    ``transformer_reduced`` of ListOps and of Image) are never averaged together; a dataset column appears when
    the summaries span more than one dataset.
    """
    rows = list(dict.fromkeys((s["dataset"], s["name"]) for s in summaries))
    protocols = list(dict.fromkeys(s["protocol"] for s in summaries))
    datasets = list(dict.fromkeys(s["dataset"] for s in summaries))
    several = len(datasets) > 1
    tasks = {s.get("task") for s in summaries}
    # one task: its own figure (perplexity, normalised score...); a mix: accuracy, which the classification tasks share
    task = get_task(tasks.pop()) if len(tasks) == 1 and None not in tasks else Task()
    head = (["dataset"] if several else []) + ["model"] + [task.table_column(p) for p in protocols]
    lines = [f"{task.table_title} on {', '.join(datasets)}, mean +- std over seeds", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for dataset, name in rows:
        cells = ([dataset] if several else []) + [name]
        for p in protocols:
            acc = [
                task.table_value(s) for s in summaries if (s["dataset"], s["name"], s["protocol"]) == (dataset, name, p)
            ]
            if not acc:
                cells.append("-")
                continue
            sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
            cells.append(f"{statistics.mean(acc):.2f} +- {sd:.2f} (n={len(acc)})")
        lines.append("| " + " | ".join(cells) + " |")
    for note in task.table_notes(summaries):
        lines += ["", note]
    if command:
        lines += ["", f"Command: `{command}`"]
    return "\n".join(lines)
