"""Plot the SAC learning curves of ``primaldual data generate d4rl`` runs, against D4RL's medium returns.

Reads each SAC work directory's ``state.json`` (written at every checkpoint, so a run still training can be
plotted) and draws, per environment, the evaluation return at every checkpoint with the mean action and with
sampled actions (the behaviour a dataset collected from that checkpoint records; the medium and expert checkpoints
are chosen on it), the medium target (:data:`primaldual.recipes.d4rl.MEDIUM_RETURN`), the chosen medium and expert
checkpoints so far, and a second axis in D4RL's normalised score. The title of each panel gives the SAC steps per
second of training (evaluations excluded) from the recorded training seconds.

Run::

    python benchmarks/sac_curves.py ~/.cache/primaldual/d4rl/sac/*-seed0 --out docs/figures/sac_curves.png

Hand-written on matplotlib (the ``bench`` extra): a few lines of plotting of the generator's own state files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work_dirs", nargs="+", help="SAC work directories (each with state.json)")
    p.add_argument("--out", default="sac_curves.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from primaldual.recipes.d4rl import MEDIUM_RETURN, select_checkpoints
    from primaldual.rl.evaluate import REF_MAX_SCORE, REF_MIN_SCORE

    runs = [json.loads((Path(d) / "state.json").read_text()) for d in args.work_dirs]
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.2), squeeze=False)
    for ax, state in zip(axes[0], runs):
        env, hist = state["env"], state["history"]
        steps = [h["step"] / 1000 for h in hist]
        ax.plot(steps, [h["return_mean"] for h in hist], "o-", ms=3, label="mean action")
        ax.plot(steps, [h["sampled_return_mean"] for h in hist], "s-", ms=3, label="sampled actions")
        ax.axhline(MEDIUM_RETURN[env], color="gray", ls="--", label=f"D4RL medium return ({MEDIUM_RETURN[env]:,.0f})")
        chosen = select_checkpoints(hist, env)
        for role, marker in (("medium", "v"), ("expert", "^")):
            e = chosen[role]
            ax.plot(e["step"] / 1000, e["sampled_return_mean"], marker, ms=10, color="k", mfc="none",
                    label=f"{role}{'' if state.get('finished') else ' so far'}: {e['step'] // 1000}k")  # fmt: skip
        last = hist[-1]
        rate = last["step"] / max(last.get("train_seconds") or 1e-9, 1e-9)
        ax.set_title(
            f"{state['env_id']}, seed {state['seed']}: {last['step'] // 1000}k of {state['sac_steps'] // 1000}k "
            f"steps, {rate:.0f} SAC steps/s, {last.get('train_seconds', 0) / 3600:.1f} h"
        )
        ax.set_xlabel("SAC steps (thousands)")
        ax.set_ylabel(f"evaluation return ({state['eval_episodes']} episodes)")
        lo, hi = REF_MIN_SCORE[env], REF_MAX_SCORE[env]
        sec = ax.secondary_yaxis("right", functions=(lambda r, lo=lo, hi=hi: 100 * (r - lo) / (hi - lo),
                                                      lambda s, lo=lo, hi=hi: lo + s * (hi - lo) / 100))  # fmt: skip
        sec.set_ylabel("D4RL normalised score")
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
