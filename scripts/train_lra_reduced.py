"""Reduced-step LRA-style training on CPU with the harness's public API (SequenceClassifier, ClassificationModule).

A stop-gap until ``primaldual fit`` accepts LRA tasks: it trains the LRA token classifier (embedding 64, 2 layers,
2 heads x 32, FFN 128, dropout 0.1, pre-LN, learned positions, mean pooling) on a dataset of
:mod:`primaldual.data`, with AdamW (eps 1e-6, weight decay 0) and linear warm-up then linear decay, selects the
best-validation checkpoint, evaluates it once on test, and prints the majority-class baseline beside it.

Example (what the issue-6 note reports)::

    python scripts/train_lra_reduced.py --task listops --model primalformer --steps 1500 --warmup 150 \
        --batch 32 --lr 1e-3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Subset

from primaldual.models import SequenceClassifier
from primaldual.primalformer import primal_plus, primalformer
from primaldual.train.config import OptimConfig
from primaldual.train.module import ClassificationModule

# PrimalFormer / Primal.+ s and eta per task (benchmarks.md); the image stand-in uses the Image row.
PRIMAL = {"listops": ((20, 0.1), (30, 0.05)), "image": ((30, 0.1), (30, 0.1)), "pathfinder": ((30, 0.1), (20, 0.05))}


def datasets(task: str, args: argparse.Namespace):
    if task == "listops":
        from primaldual.data.listops import ListOpsDataset

        make = lambda s: ListOpsDataset(split=s, tokenisation=args.tokenisation, max_len=args.max_len or 2000)  # noqa: E731
        return make("train"), make("val"), make("test"), 16, 10, args.max_len or 2000
    if task == "image":
        from primaldual.data.images import FashionMNIST1024

        return FashionMNIST1024("train"), FashionMNIST1024("val"), FashionMNIST1024("test"), 256, 10, 1024
    if task == "pathfinder":
        from primaldual.data.pathfinder import PathfinderDataset

        return (
            PathfinderDataset(split="train"),
            PathfinderDataset(split="val"),
            PathfinderDataset(split="test"),
            256,
            2,
            1024,
        )
    raise SystemExit(f"unknown task {task!r}")


class WarmupDecayModule(ClassificationModule):
    """AdamW (betas 0.9/0.999, eps 1e-6) with linear warm-up then linear decay to 0, stepped every batch."""

    def __init__(self, model, optim: OptimConfig, steps: int, warmup: int) -> None:
        super().__init__(model, optim, ["val"])
        self.steps, self.warmup = steps, warmup

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.optim.lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)

        def factor(step: int) -> float:
            if step < self.warmup:
                return (step + 1) / self.warmup
            return max(0.0, (self.steps - step) / max(1, self.steps - self.warmup))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(PRIMAL), required=True)
    ap.add_argument("--model", default="primalformer", help="primalformer, primal_plus, or any registered attention")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--val-size", type=int, default=2000, help="validation examples used for model selection")
    ap.add_argument("--tokenisation", default="brackets", choices=["brackets", "no_brackets"])
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--max-minutes", type=float, default=None, help="wall-clock cap on training (then test the best checkpoint)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/lra_reduced")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    L.seed_everything(args.seed, workers=True)
    train, val, test, vocab, classes, max_len = datasets(args.task, args)
    if len(val) > args.val_size:
        val = Subset(val, np.random.default_rng(0).choice(len(val), args.val_size, replace=False).tolist())
    (s, eta), (s_plus, eta_plus) = PRIMAL[args.task]
    if args.model == "primalformer":
        plan = primalformer(2, s=s, eta=eta, ksvd_reduction="global")
    elif args.model == "primal_plus":
        plan = primal_plus(2, s=s_plus, eta=eta_plus, ksvd_reduction="global")
    elif args.model == "transformer":
        plan = {"attention": "softmax", "attention_options": None}
    else:
        plan = {"attention": args.model, "attention_options": None}
    model = SequenceClassifier(
        vocab, classes, max_len, dim=64, depth=2, num_heads=2, ffn_dim=128, dropout=0.1, pooling="mean", **plan
    )
    module = WarmupDecayModule(model, OptimConfig(name="adamw", lr=args.lr, weight_decay=0.0), args.steps, args.warmup)

    run_dir = Path(args.out) / f"{args.task}_{args.model}_s{args.steps}_seed{args.seed}"
    ckpt = ModelCheckpoint(
        dirpath=run_dir / "checkpoints", monitor="val/acc", mode="max", save_top_k=1, filename="best"
    )
    trainer = L.Trainer(
        max_steps=args.steps,
        val_check_interval=args.eval_every,
        check_val_every_n_epoch=None,
        accelerator="cpu",
        logger=CSVLogger(run_dir, name="", version=""),
        callbacks=[ckpt],
        log_every_n_steps=25,
        enable_progress_bar=True,
        num_sanity_val_steps=0,
        max_time={"minutes": args.max_minutes} if args.max_minutes else None,
    )
    loader = lambda ds, sh: DataLoader(ds, batch_size=args.batch if sh else 256, shuffle=sh, num_workers=0)  # noqa: E731
    t0 = time.perf_counter()
    trainer.fit(module, loader(train, True), loader(val, False))
    train_s = time.perf_counter() - t0
    res = trainer.test(module, loader(test, False), ckpt_path="best", verbose=False)[0]

    train_labels = np.asarray(train.labels)
    test_labels = np.asarray(test.labels)
    majority = int(np.bincount(train_labels).argmax())
    out = {
        "task": args.task,
        "dataset": getattr(test, "info", {}),
        "model": args.model,
        "plan": {k: v for k, v in plan.items()},
        "reduced": True,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "lr": args.lr,
        "seed": args.seed,
        "threads": args.threads,
        "train_seconds": round(train_s, 1),
        "steps_done": int(trainer.global_step),
        "best_val_acc": float(ckpt.best_model_score) if ckpt.best_model_score is not None else math.nan,
        "test_acc": float(res["test/acc"]),
        "majority_class": majority,
        "majority_test_acc": float((test_labels == majority).mean()),
    }
    (run_dir / "result.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
