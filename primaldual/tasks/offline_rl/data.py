"""The offline-RL data module: D4RL-layout trajectories as windows for training, rollouts as the evaluation.

* **Which file**: ``data.name`` ``<env>-<kind>`` (e.g. ``hopper-medium``), read from ``data.root`` (a folder or the
  file itself) or the cache ``d4rl/<env>-<kind>`` (:func:`data_file`); a missing file is a one-line error naming
  ``primaldual data generate d4rl``. Its widths are checked against the environment's before any step.
* **Training batches**: windows of ``data.max_len`` = K timesteps from
  :class:`~primaldual.data.d4rl.TrajectoryDataset`, whose item ``i`` of epoch ``e`` is drawn from ``[seed, e, i]``.
  An epoch's items are taken in order, ``data.batch_size`` per batch and device: batch ``b`` of epoch ``e`` holds
  items ``[b * B, (b + 1) * B)`` (one process), so the batch of optimiser step ``s`` is a function of ``s`` alone
  and a resume continues the exact stream. Under DDP the ranks share each global batch of ``B * world`` items
  (:class:`~primaldual.train.datamodule.TrainerEpochSampler`, unshuffled: rank ``r`` takes items ``r, r + world,
  ...``), so a 2-process run with ``B`` sees the batches of a 1-process run with ``2 B``.
* **Evaluation**: the "val" and "test" loaders hold one placeholder item; the Lightning module's evaluation step
  runs the rollouts (:mod:`primaldual.tasks.offline_rl.training`).

The batches are built by :meth:`TrajectoryDataset.batch` (vectorised), not by collating items one by one: the
loader's sampler yields whole batches of indices, tagged with their epoch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ...data.cache import MissingDataError, dataset_dir
from ...train.config import ConfigError, RunConfig
from ...train.datamodule import TrainerEpochSampler

__all__ = ["RLDataModule", "behaviour_score", "data_file", "env_kind", "rl_data_dir"]


def rl_data_dir(cfg: RunConfig) -> Path:
    """``data.root``, else the cache ``d4rl/<data.name>``."""
    if cfg.data.root is not None:
        return Path(cfg.data.root).expanduser()
    return dataset_dir("d4rl") / cfg.data.name


def env_kind(name: str) -> tuple[str, str]:
    """``(env, kind)`` of a dataset name ``<env>-<kind>``; :class:`ConfigError` for an unknown environment."""
    from ...rl.evaluate import env_key

    env, _, kind = name.partition("-")
    try:
        return env_key(env), kind
    except (KeyError, ValueError):
        raise ConfigError(
            f"data.name: expected <env>-<kind> with env halfcheetah, hopper or walker2d, got {name!r}"
        ) from None


def data_file(cfg: RunConfig) -> Path:
    """The HDF5 file of ``data.name``: ``data.root`` itself when it is a file; else, in ``data.root`` (or the cache),
    the file named after the dataset (``<data.name>.hdf5``, D4RL's ``<data.name>-v2.hdf5``, or ``.h5``).

    Raises:
        MissingDataError: no such file (the message lists what the folder holds and how to generate the data).
        ConfigError: several files of that name (say which with ``data.root``).
    """
    env, kind = env_kind(cfg.data.name)
    root = rl_data_dir(cfg)
    if root.is_file():
        if root.suffix not in (".hdf5", ".h5"):
            raise ConfigError(f"data.root: {root} is a file but not HDF5 (.hdf5 / .h5)")
        return root
    files = sorted(p for p in root.glob("*") if p.suffix in (".hdf5", ".h5")) if root.is_dir() else []
    name = re.compile(rf"{re.escape(cfg.data.name)}(-v\d+)?")
    matches = [p for p in files if name.fullmatch(p.stem)]
    if len(matches) > 1:
        raise ConfigError(
            f"data.root: {root} holds several files of {cfg.data.name} ({', '.join(p.name for p in matches)}); "
            "point data.root at the one to train on"
        )
    if not matches:
        there = f" (it holds {', '.join(p.name for p in files)})" if files else ""
        raise MissingDataError(
            f"{root}: no D4RL data for {cfg.data.name}: expected {cfg.data.name}.hdf5{there}; generate it with "
            f"`primaldual data generate d4rl --env {env} --kind {kind or 'medium'}`, or point --data.root at the file"
        )
    return matches[0]


def read_metadata(path: Path) -> dict[str, Any]:
    """The generator's ``metadata.json`` beside the data (a JSON object); anything else is a
    :class:`~primaldual.data.d4rl.D4RLFormatError` naming the file."""
    from ...data.d4rl import D4RLFormatError

    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise D4RLFormatError(f"{path}: not a readable JSON file ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(meta, dict):
        raise D4RLFormatError(f"{path}: expected a JSON object, got a JSON {type(meta).__name__}")
    return meta


def behaviour_score(meta: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The behaviour policy's normalised score recorded by ``primaldual data generate d4rl`` (None if absent)."""
    b = meta.get("behaviour_policy") or {}
    entry = b.get(kind) if isinstance(b.get(kind), dict) else next((v for v in b.values() if isinstance(v, dict)), None)
    if not entry or "normalized_score_mean" not in entry:
        return None
    keys = ("normalized_score_mean", "normalized_score_std", "return_mean", "return_std", "episodes")
    return {k: entry[k] for k in keys if k in entry}


def _check_widths(env: str, state_dim: int, act_dim: int, path: Path) -> None:
    """Refuse data whose observation / action widths are not the environment's (before any training step)."""
    from ...rl.evaluate import env_id, make_env

    e = make_env(env)
    try:
        want = (int(e.observation_space.shape[0]), int(e.action_space.shape[0]))
    finally:
        e.close()
    if (state_dim, act_dim) != want:
        raise ConfigError(
            f"data.name: {path} has observations of width {state_dim} and actions of width {act_dim}, but "
            f"{env_id(env)} has {want[0]} and {want[1]}; the data was made for another environment"
        )


class _WindowBatches(Dataset):
    """Key ``(epoch, indices)`` -> the batch of those items of that epoch (a dict of ``(b, K, ...)`` tensors)."""

    def __init__(self, windows: Any) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, key: tuple[int, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        epoch, indices = key
        self.windows.set_epoch(epoch)
        return self.windows.batch(np.asarray(indices, dtype=np.int64))


class _EpochBatches(Sampler):
    """Whole batches of an unshuffled :class:`TrainerEpochSampler` (its resume skipping included), each tagged with
    the epoch it belongs to; the last partial batch of an epoch is dropped."""

    def __init__(self, items: TrainerEpochSampler, batch_size: int) -> None:
        self.items, self.batch_size = items, batch_size

    def __len__(self) -> int:
        return len(self.items) // self.batch_size

    def __iter__(self):
        order = list(iter(self.items))  # sets items.epoch (the trainer's) and skips the batches already trained on
        epoch, B = self.items.epoch, self.batch_size
        for b in range(len(order) // B):
            yield epoch, tuple(order[b * B : (b + 1) * B])


class RLDataModule(L.LightningDataModule):
    """D4RL-layout data of ``cfg.data`` for the Decision Transformer (see the module docstring).

    After ``setup``: ``windows`` (the :class:`~primaldual.data.d4rl.TrajectoryDataset`), ``env`` / ``kind``,
    ``path`` (the HDF5 file), ``meta`` (its ``metadata.json``, or ``{}``), ``state_dim`` / ``act_dim``,
    ``state_mean`` / ``state_std``, ``sizes`` and ``eval_splits``.
    """

    eval_splits = ["val"]

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.windows: Any = None

    def setup(self, stage: str | None = None) -> None:
        if self.windows is not None:
            return
        from ...data.d4rl import TrajectoryDataset, read_d4rl
        from ...rl.evaluate import require_rl

        require_rl("gymnasium", "h5py")
        cfg = self.cfg
        self.env, self.kind = env_kind(cfg.data.name)
        self.path = data_file(cfg)
        data = read_d4rl(self.path)
        meta_path = self.path.parent / "metadata.json"
        self.meta = read_metadata(meta_path) if meta_path.is_file() else {}
        _check_widths(self.env, data.state_dim, data.act_dim, self.path)
        self.windows = TrajectoryDataset(
            data, cfg.data.max_len, return_scale=cfg.rl.return_scale, max_ep_len=cfg.rl.max_ep_len, seed=cfg.seed
        )
        if len(self.windows) < cfg.data.batch_size:  # an epoch must hold one batch
            raise ConfigError(
                f"data.batch_size: {self.path} has {len(self.windows)} timesteps, fewer than one batch "
                f"({cfg.data.batch_size}); pass a smaller --data.batch_size or more data"
            )
        self.state_dim, self.act_dim = data.state_dim, data.act_dim
        self.state_mean, self.state_std = self.windows.state_mean, self.windows.state_std
        self.transitions = len(data)
        self.sizes = {"train": len(self.windows), "val": 0, "test": 0}

    def train_dataloader(self) -> DataLoader:
        t = self.trainer
        world, rank = (t.world_size, t.global_rank) if t is not None else (1, 0)
        B = self.cfg.data.batch_size
        accumulate = t.accumulate_grad_batches if t is not None else 1
        items = TrainerEpochSampler(
            self.windows, t, B, accumulate, num_replicas=world, rank=rank, shuffle=False, drop_last=True
        )
        return DataLoader(_WindowBatches(self.windows), batch_size=None, sampler=_EpochBatches(items, B))

    def _rollout_loader(self) -> DataLoader:
        return DataLoader([torch.zeros(1)], batch_size=None)  # one placeholder: the step runs the rollouts

    def val_dataloader(self) -> list[DataLoader]:
        return [self._rollout_loader()]

    def test_dataloader(self) -> DataLoader:
        return self._rollout_loader()

    def example_inputs(self) -> list[torch.Tensor]:
        """The model inputs of the first training batch (``trainer.compile`` checks the compiled model on them)."""
        from .training import dt_inputs

        return dt_inputs(self.windows.batch(np.arange(self.cfg.data.batch_size)))
