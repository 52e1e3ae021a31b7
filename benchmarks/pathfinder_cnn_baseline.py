"""Data check: can a small CNN learn our Pathfinder split, where the attention models stay at chance?

The attention models of the ``lra/pathfinder/reduced/<model>`` configs sit at 50% for many steps on the generated
Pathfinder-32 data. That alone cannot tell a hard task from broken data (labels unrelated to the pictures).
A convolutional network has the locality prior the task rewards, so it learns Pathfinder in a few hundred
steps if the labels follow the pictures. This script trains one on the same split the attention models use
(``PathfinderDataset``: generated data or the LRA release) and reports test accuracy as it trains.

It is a check on the data, not an LRA baseline: LRA forbids convolutions, and no paper reports this model.
The training loop is a few lines of plain PyTorch (no Lightning) because the model, the data and the
schedule are fixed and nothing here is reused.

Model: six 3x3 conv + BatchNorm + ReLU blocks (32, 32, pool, 64, 64, pool, 64, 64), global max-pool, a
linear layer; Adam lr 1e-3, batches drawn uniformly with replacement. Images ``(B, 1, S, S)`` in [0, 1].

Usage::

    python benchmarks/pathfinder_cnn_baseline.py                     # 1000 steps, test every 250
    python benchmarks/pathfinder_cnn_baseline.py --root /data/lra_release/pathfinder32/curv_contour_length_14 \\
        --steps 2000 --out runs/pathfinder_cnn.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from torch import Tensor, nn

from primaldual.data.pathfinder import PathfinderDataset
from primaldual.utils.io import atomic_write_text


def images(ds: PathfinderDataset) -> tuple[Tensor, Tensor]:
    """``(M, 1, S, S)`` float images in [0, 1] and ``(M,)`` int64 labels of a split."""
    flat = torch.from_numpy(ds.images)  # (M, S*S) uint8 pixel tokens
    side = int(round(flat.shape[1] ** 0.5))
    if side * side != flat.shape[1]:
        raise ValueError(f"Pathfinder images: expected square images, got {flat.shape[1]} pixels")
    x = flat.float().div(255).reshape(-1, 1, side, side)  # (M, 1, S, S)
    return x, torch.from_numpy(ds.labels).long()


def cnn() -> nn.Sequential:
    def block(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU())

    return nn.Sequential(
        block(1, 32), block(32, 32), nn.MaxPool2d(2),
        block(32, 64), block(64, 64), nn.MaxPool2d(2),
        block(64, 64), block(64, 64),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(64, 2),
    )  # fmt: skip


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor, batch: int = 500) -> float:
    model.eval()
    correct = sum(
        (model(x[i : i + batch]).argmax(-1) == y[i : i + batch]).sum().item() for i in range(0, len(x), batch)
    )
    model.train()
    return correct / len(x)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=None, help="Pathfinder directory (default: the generated cache)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write the figures as JSON here (atomically)")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "eval_every", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train, test = PathfinderDataset(args.root, "train"), PathfinderDataset(args.root, "test")
    x, y = images(train)
    xt, yt = images(test)
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    curve, start = [], time.perf_counter()
    print(f"train {len(x)} ({train.info['source']}), test {len(xt)}, test positives {yt.float().mean():.3f}")
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, len(x), (args.batch_size,))
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            row = {"step": step, "train_loss": loss.item(), "test_acc": accuracy(model, xt, yt)}
            row["seconds"] = time.perf_counter() - start
            curve.append(row)
            print(f"step {step:>5}  loss {row['train_loss']:.3f}  test acc {100 * row['test_acc']:.2f}%", flush=True)
    record = {
        "benchmark": "pathfinder_cnn_baseline",
        "source": train.info["source"],
        "settings": vars(args),
        "curve": curve,
        "torch": torch.__version__,
        "machine": platform.platform(),
    }
    if args.out:
        atomic_write_text(args.out, json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
