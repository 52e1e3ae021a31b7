"""Offline RL data in the D4RL HDF5 layout: a checked reader, trajectories, returns-to-go and context windows.

**File layout** (the D4RL release's, and what ``primaldual data generate d4rl`` writes): one HDF5 file with the
datasets ``observations (N, obs_dim)``, ``actions (N, act_dim)``, ``rewards (N,)``, ``terminals (N,)``,
``timeouts (N,)`` (required), ``next_observations (N, obs_dim)`` and a group ``infos/`` (optional). Row i is
the transition (s_i, a_i, r_i, s_{i+1}); ``terminals[i]`` marks a true episode end (the agent fell), ``timeouts[i]``
an episode cut by a time limit.

**Checks** (:func:`read_d4rl`): every required key present, float observations / actions / rewards of the right
rank, boolean or 0/1 terminals / timeouts, one length N for all, ``next_observations`` the shape of
``observations``, and no NaN / infinity in a float array. Each failure is one :class:`D4RLFormatError`
(a ``ValueError``) whose one-line message names the file and the key; a missing file is a
:class:`~primaldual.data.cache.MissingDataError`. HDF5 holds no pickled objects, so reading never runs code
from the file.

**Trajectories** (:func:`split_trajectories`): cut after every row with ``terminals`` or ``timeouts`` set; rows
after the last cut (an episode still running when the data ended) form a final trajectory of their own by default
(``drop_tail=False``). The Decision Transformer's conversion script (``gym/data/download_d4rl_datasets.py``)
drops that tail; ``drop_tail=True`` does the same.

**Returns-to-go** ``R_t = sum_{t' >= t} r_t'`` within a trajectory (undiscounted, as the DT uses them).

**State statistics** (:func:`state_stats`): mean and standard deviation over every observation row of the file
(``std + 1e-6``, as the DT), used to normalise states in training and in rollouts.

**Context windows** (:class:`TrajectoryDataset`): a timestep is drawn uniformly over all timesteps of the dataset
(the DT draws a trajectory with probability proportional to its length, then a step uniformly in it: the same
distribution) and a window of ``context`` K steps is cut around it; windows shorter than K are **left-padded**
(zeros, mask False, timestep 0), as the DT code pads. ``anchor="start"`` (default, the DT code's rule): the drawn
step starts the window, so short windows occur at trajectory ends; ``anchor="end"``: it ends the window, so short
windows occur at trajectory starts, as a rollout's first K - 1 steps see them. Item ``i`` of epoch ``e`` is drawn
from ``numpy.random.default_rng([seed, e, i])``: the same for a given seed whatever the batch size or number of
workers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..options import check_choice, check_int, check_number
from .cache import MissingDataError

__all__ = [
    "OPTIONAL_KEYS",
    "REQUIRED_KEYS",
    "D4RLData",
    "D4RLFormatError",
    "Trajectory",
    "TrajectoryDataset",
    "find_d4rl_file",
    "read_d4rl",
    "returns_to_go",
    "split_trajectories",
    "state_stats",
]

REQUIRED_KEYS: tuple[str, ...] = ("observations", "actions", "rewards", "terminals", "timeouts")
OPTIONAL_KEYS: tuple[str, ...] = ("next_observations", "infos")
HINT = (
    "place a D4RL HDF5 file there (e.g. hopper-medium-v2.hdf5 from the D4RL release) or generate one with "
    "`primaldual data generate d4rl --env hopper --kind medium`"
)


class D4RLFormatError(ValueError):
    """A D4RL file that is unreadable or malformed; the message names the file and the key."""


@dataclass
class D4RLData:
    """The arrays of one D4RL file (row i = transition i).

    Attributes:
        observations: ``(N, obs_dim)`` float32. actions: ``(N, act_dim)`` float32. rewards: ``(N,)`` float32.
        terminals, timeouts: ``(N,)`` bool. next_observations: ``(N, obs_dim)`` float32 or None.
        infos: the ``infos/`` datasets (arrays of N rows), possibly empty.
        attrs: the file's root attributes (generated files: ``metadata_json`` holds the generation metadata).
        path: the file read.
    """

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    timeouts: np.ndarray
    next_observations: np.ndarray | None = None
    infos: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def state_dim(self) -> int:
        return int(self.observations.shape[1])

    @property
    def act_dim(self) -> int:
        return int(self.actions.shape[1])

    @property
    def metadata(self) -> dict[str, Any]:
        """The generation metadata of a file written by the generator (``{}`` for other files)."""
        raw = self.attrs.get("metadata_json")
        if not isinstance(raw, str):
            return {}
        try:
            meta = json.loads(raw)
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            raise D4RLFormatError(f"{self.path}: the 'metadata_json' attribute is not a JSON object")
        return meta


@dataclass
class Trajectory:
    """One trajectory (episode or episode part): ``observations (T, obs_dim)``, ``actions (T, act_dim)``,
    ``rewards (T,)``, ``terminals (T,)``; ``start`` is its first row in the file."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    start: int

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def ret(self) -> float:
        """The trajectory's return (sum of rewards)."""
        return float(self.rewards.sum(dtype=np.float64))


def find_d4rl_file(path: str | os.PathLike) -> Path:
    """``path`` if it is a file; for a directory, its one ``*.hdf5`` / ``*.h5`` file.

    Raises:
        MissingDataError: nothing there, or a directory without an HDF5 file.
        D4RLFormatError: a directory with several HDF5 files (name the file).
    """
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        found = sorted([*p.glob("*.hdf5"), *p.glob("*.h5")])
        if len(found) == 1:
            return found[0]
        if not found:
            raise MissingDataError(f"{p}: no .hdf5 file in this directory; {HINT}")
        names = ", ".join(f.name for f in found)
        raise D4RLFormatError(f"{p}: several HDF5 files ({names}); pass the file itself")
    raise MissingDataError(f"{p}: no such file or directory; {HINT}")


def _import_h5py():
    try:
        import h5py
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "h5py is not installed: pip install h5py (it is in the rl extra: pip install -e '.[rl]')"
        ) from None
    return h5py


def _array(f: Any, path: Path, key: str) -> np.ndarray:
    import h5py

    obj = f.get(key)
    if obj is None:
        raise D4RLFormatError(f"{path}: missing key '{key}' (a D4RL file has {', '.join(REQUIRED_KEYS)})")
    if not isinstance(obj, h5py.Dataset):
        raise D4RLFormatError(f"{path}: '{key}' is an HDF5 group, expected a dataset")
    if obj.dtype.kind not in "fiub":
        raise D4RLFormatError(f"{path}: '{key}' has dtype {obj.dtype}, expected numbers")
    # the shape is the file's claim, not its size on disk (a chunked dataset of fill values is tiny): checked
    # before anything is allocated, against the memory the array and its float32 copy would take
    need = int(obj.size) * (obj.dtype.itemsize + 4)
    if need > (have := _physical_memory()):
        raise D4RLFormatError(
            f"{path}: '{key}' declares shape {tuple(obj.shape)} ({need / 2**30:.1f} GiB to read), more than this "
            f"machine's memory ({have / 2**30:.1f} GiB)"
        )
    return obj[()]


def _physical_memory() -> int:
    """The machine's memory in bytes (``2**62`` where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 2**62


def _float(a: np.ndarray, path: Path, key: str, ndim: int) -> np.ndarray:
    if a.dtype.kind != "f":
        raise D4RLFormatError(f"{path}: '{key}' has dtype {a.dtype}, expected floating point")
    if a.ndim != ndim:
        want = "(N,)" if ndim == 1 else "(N, dim)"
        raise D4RLFormatError(f"{path}: '{key}' has shape {a.shape}, expected {want}")
    if ndim == 2 and a.shape[1] == 0:
        raise D4RLFormatError(f"{path}: '{key}' has shape {a.shape}: no columns")
    with np.errstate(over="ignore"):  # checked on the float32 values the model sees: 1e39 is inf there
        out = np.ascontiguousarray(a, dtype=np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        what = (
            "NaN values"
            if np.isnan(a).any()
            else "infinite values"
            if not np.isfinite(a).all()
            else "values beyond float32's range"
        )
        raise D4RLFormatError(f"{path}: '{key}' holds {what} ({int(bad.sum())}, first at row {row})")
    return out


def _column(a: np.ndarray) -> np.ndarray:
    """``(N, 1)`` -> ``(N,)`` (some writers store per-row scalars as a column); anything else unchanged."""
    return a[:, 0] if a.ndim == 2 and a.shape[1] == 1 else a


def _flag(a: np.ndarray, path: Path, key: str) -> np.ndarray:
    a = _column(a)
    if a.ndim != 1:
        raise D4RLFormatError(f"{path}: '{key}' has shape {a.shape}, expected (N,)")
    if a.dtype.kind != "b" and not np.isin(a, (0, 1)).all():
        raise D4RLFormatError(f"{path}: '{key}' must hold booleans or 0 / 1, got values outside {{0, 1}}")
    return a.astype(bool)


def read_d4rl(path: str | os.PathLike) -> D4RLData:
    """Read and check a D4RL HDF5 file (or the one HDF5 file of a directory).

    Args:
        path: the ``.hdf5`` file, or a directory holding exactly one.

    Returns:
        :class:`D4RLData` (float arrays as float32, flags as bool).

    Raises:
        MissingDataError: no such file (the message says how to get one).
        D4RLFormatError: not an HDF5 file, a missing key, a wrong dtype or shape, a length mismatch, NaN / inf.
    """
    h5py = _import_h5py()
    path = find_d4rl_file(path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise D4RLFormatError(f"{path}: not a readable HDF5 file ({str(e).splitlines()[0]})") from None
    with f:
        raw = {key: _array(f, path, key) for key in REQUIRED_KEYS}
        nxt = _array(f, path, "next_observations") if "next_observations" in f else None
        infos: dict[str, np.ndarray] = {}
        group = f.get("infos")
        if isinstance(group, h5py.Group):
            for name, obj in group.items():
                if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "fiub":
                    infos[name] = obj[()]
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    data = D4RLData(
        observations=_float(raw["observations"], path, "observations", 2),
        actions=_float(raw["actions"], path, "actions", 2),
        rewards=_float(_column(raw["rewards"]), path, "rewards", 1),
        terminals=_flag(raw["terminals"], path, "terminals"),
        timeouts=_flag(raw["timeouts"], path, "timeouts"),
        next_observations=None if nxt is None else _float(nxt, path, "next_observations", 2),
        infos=infos,
        attrs=attrs,
        path=path,
    )
    if np.abs(data.rewards.astype(np.float64)).sum() >= np.finfo(np.float32).max:  # returns-to-go sum rewards
        raise D4RLFormatError(f"{path}: 'rewards' are so large that returns-to-go overflow float32")
    n = len(data.observations)
    for key in ("actions", "rewards", "terminals", "timeouts", "next_observations"):
        a = getattr(data, key)
        if a is not None and len(a) != n:
            raise D4RLFormatError(f"{path}: '{key}' has {len(a)} rows but 'observations' has {n}")
    for key, a in infos.items():
        if len(a) != n:
            raise D4RLFormatError(f"{path}: 'infos/{key}' has {len(a)} rows but 'observations' has {n}")
    if data.next_observations is not None and data.next_observations.shape != data.observations.shape:
        raise D4RLFormatError(
            f"{path}: 'next_observations' has shape {data.next_observations.shape} but 'observations' has "
            f"{data.observations.shape}"
        )
    if n == 0:
        raise D4RLFormatError(f"{path}: 'observations' is empty")
    return data


def split_trajectories(data: D4RLData, *, drop_tail: bool = False) -> list[Trajectory]:
    """Cut the rows into trajectories after every row with ``terminals`` or ``timeouts`` set.

    Args:
        data: from :func:`read_d4rl`.
        drop_tail: drop the rows after the last cut (an unfinished episode), as the DT's conversion script does;
            by default they form a final trajectory.

    Returns:
        The trajectories in file order (views into ``data``'s arrays).
    """
    ends = np.flatnonzero(data.terminals | data.timeouts) + 1  # exclusive ends
    n = len(data)
    bounds = ends.tolist()
    if not drop_tail and (not bounds or bounds[-1] != n):
        bounds.append(n)
    out, start = [], 0
    for end in bounds:
        out.append(
            Trajectory(
                data.observations[start:end],
                data.actions[start:end],
                data.rewards[start:end],
                data.terminals[start:end],
                start,
            )
        )
        start = end
    return out


def returns_to_go(rewards: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """``R_t = sum_{t' >= t} gamma^(t' - t) r_t'`` of one trajectory's ``rewards (T,)`` (float64 accumulation)."""
    r = np.asarray(rewards, dtype=np.float64)
    if gamma == 1.0:
        return np.cumsum(r[::-1])[::-1].astype(np.float32)
    out = np.zeros_like(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out.astype(np.float32)


def state_stats(observations: np.ndarray, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension ``(mean, std + eps)`` over all rows of ``observations`` (float32), as the DT normalises."""
    obs = np.asarray(observations, dtype=np.float64)
    return obs.mean(0).astype(np.float32), (obs.std(0) + eps).astype(np.float32)


class TrajectoryDataset(Dataset):
    """Context windows of K timesteps for Decision Transformer training.

    Items are dicts of tensors: ``states (K, obs_dim)`` float32 normalised with the dataset statistics,
    ``actions (K, act_dim)``, ``rewards (K, 1)``, ``returns_to_go (K, 1)`` divided by ``return_scale``,
    ``timesteps (K,)`` int64 (each step's index in its trajectory, capped at ``max_ep_len - 1``), ``mask (K,)``
    bool (True = real step); padding on the left with zeros. The model's forward takes
    ``(states, actions, returns_to_go, timesteps, mask)``; the action loss is over the real steps.

    Args:
        data: a :class:`D4RLData` or a path for :func:`read_d4rl`.
        context: K.
        return_scale: returns-to-go are divided by it (1000 for the MuJoCo tasks).
        max_ep_len: timesteps are capped at ``max_ep_len - 1`` (the model's timestep table).
        num_samples: the epoch length (default: the number of timesteps).
        seed: item ``i`` of epoch ``e`` comes from ``numpy.random.default_rng([seed, e, i])``.
        anchor: ``"start"`` (DT code: the drawn step starts the window) or ``"end"`` (it ends it).
        drop_tail: see :func:`split_trajectories`.
        state_mean, state_std: override the statistics (default: :func:`state_stats` of all observations).
    """

    def __init__(
        self,
        data: D4RLData | str | os.PathLike,
        context: int = 20,
        *,
        return_scale: float = 1000.0,
        max_ep_len: int = 1000,
        num_samples: int | None = None,
        seed: int = 0,
        anchor: str = "start",
        drop_tail: bool = False,
        state_mean: np.ndarray | None = None,
        state_std: np.ndarray | None = None,
    ) -> None:
        check_int("context", context, low=1)
        check_number("return_scale", return_scale, low=0.0, low_open=True)
        check_int("max_ep_len", max_ep_len, low=1)
        check_int("num_samples", num_samples, low=1, allow_none=True)
        check_int("seed", seed, low=0)
        check_choice("anchor", anchor, ("start", "end"))
        self.data = data if isinstance(data, D4RLData) else read_d4rl(data)
        self.trajectories = split_trajectories(self.data, drop_tail=drop_tail)
        if not self.trajectories:
            raise ValueError(
                f"{self.data.path}: no trajectory (no row has terminals or timeouts set, and drop_tail=True)"
            )
        self.context, self.return_scale, self.max_ep_len = context, float(return_scale), max_ep_len
        self.seed, self.anchor, self.epoch = seed, anchor, 0
        mean, std = state_stats(self.data.observations)
        self.state_mean = mean if state_mean is None else np.asarray(state_mean, dtype=np.float32)
        self.state_std = std if state_std is None else np.asarray(state_std, dtype=np.float32)
        lengths = np.array([len(t) for t in self.trajectories], dtype=np.int64)
        self.lengths = lengths
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])  # (num_traj + 1,)
        self.num_timesteps = int(self.offsets[-1])
        self.num_samples = num_samples or self.num_timesteps
        self._rtg = [returns_to_go(t.rewards) for t in self.trajectories]
        self._flat_cache: dict[str, np.ndarray] | None = None  # see _flat
        returns = np.array([t.ret for t in self.trajectories])
        self.info: dict[str, Any] = {
            "path": str(self.data.path) if self.data.path else None,
            "trajectories": len(self.trajectories),
            "timesteps": self.num_timesteps,
            "return_mean": float(returns.mean()),
            "return_std": float(returns.std()),
            "return_max": float(returns.max()),
            "return_min": float(returns.min()),
            "context": context,
            "return_scale": self.return_scale,
            "anchor": anchor,
            "drop_tail": drop_tail,
            "source": self.data.metadata.get("label", "user-provided D4RL-format file"),
        }

    @property
    def state_dim(self) -> int:
        return self.data.state_dim

    @property
    def act_dim(self) -> int:
        return self.data.act_dim

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Draw a fresh set of windows (items depend on ``(seed, epoch, index)``)."""
        self.epoch = check_int("epoch", epoch, low=0)

    def locate(self, step: int) -> tuple[int, int]:
        """``(trajectory index, position in it)`` of global timestep ``step`` in ``[0, num_timesteps)``."""
        j = int(np.searchsorted(self.offsets, step, side="right")) - 1
        return j, int(step - self.offsets[j])

    def window(self, traj: int, pos: int) -> dict[str, torch.Tensor]:
        """The window of trajectory ``traj`` anchored at position ``pos`` (see ``anchor``), left-padded to K."""
        t = self.trajectories[traj]
        K = self.context
        lo, hi = (pos, min(pos + K, len(t))) if self.anchor == "start" else (max(0, pos - K + 1), pos + 1)
        pad = K - (hi - lo)
        states = np.zeros((K, self.state_dim), dtype=np.float32)
        states[pad:] = (t.observations[lo:hi] - self.state_mean) / self.state_std
        actions = np.zeros((K, self.act_dim), dtype=np.float32)
        actions[pad:] = t.actions[lo:hi]
        rewards = np.zeros((K, 1), dtype=np.float32)
        rewards[pad:, 0] = t.rewards[lo:hi]
        rtg = np.zeros((K, 1), dtype=np.float32)
        rtg[pad:, 0] = self._rtg[traj][lo:hi] / self.return_scale
        timesteps = np.zeros(K, dtype=np.int64)
        timesteps[pad:] = np.minimum(np.arange(lo, hi), self.max_ep_len - 1)
        mask = np.zeros(K, dtype=bool)
        mask[pad:] = True
        return {
            "states": torch.from_numpy(states),
            "actions": torch.from_numpy(actions),
            "rewards": torch.from_numpy(rewards),
            "returns_to_go": torch.from_numpy(rtg),
            "timesteps": torch.from_numpy(timesteps),
            "mask": torch.from_numpy(mask),
        }

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range [0, {self.num_samples})")
        rng = np.random.default_rng([self.seed, self.epoch, int(index)])
        # uniform over all timesteps = a trajectory with probability len / total, then a uniform step in it
        return self.window(*self.locate(int(rng.integers(self.num_timesteps))))

    def batch(self, indices: list[int] | np.ndarray) -> dict[str, torch.Tensor]:
        """Items ``indices`` stacked into a batch (``(B, K, ...)`` tensors), equal to stacking ``self[i]``.

        The windows are gathered at once from flat copies of the trajectories (built on first use) instead of item by
        item: one fancy-indexing pass per field, about a tenth of the time of stacking 64 items.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            raise ValueError("indices: expected at least one item index")
        bad = idx[(idx < 0) | (idx >= self.num_samples)]
        if bad.size:
            raise IndexError(f"index {int(bad[0])} out of range [0, {self.num_samples})")
        steps = np.array(
            [np.random.default_rng([self.seed, self.epoch, int(i)]).integers(self.num_timesteps) for i in idx]
        )  # (B,) global timesteps, the draws of __getitem__
        flat = self._flat()
        traj = np.searchsorted(self.offsets, steps, side="right") - 1  # (B,)
        start, end = self.offsets[traj], self.offsets[traj + 1]  # (B,) flat rows of each trajectory
        K = self.context
        if self.anchor == "start":
            lo, hi = steps, np.minimum(steps + K, end)
        else:
            lo, hi = np.maximum(start, steps - K + 1), steps + 1
        pad = K - (hi - lo)  # (B,)
        col = np.arange(K)[None, :]  # (1, K)
        real = col >= pad[:, None]  # (B, K): left padding
        rows = np.where(real, lo[:, None] + col - pad[:, None], 0)  # (B, K) flat rows (0 where padded)
        t = np.where(real, np.minimum(rows - start[:, None], self.max_ep_len - 1), 0)  # (B, K) timesteps

        def take(a: np.ndarray) -> torch.Tensor:
            out = a[rows]  # (B, K, ...)
            out[~real] = 0
            return torch.from_numpy(out)

        return {
            "states": take(flat["states"]),
            "actions": take(flat["actions"]),
            "rewards": take(flat["rewards"]),
            "returns_to_go": take(flat["returns_to_go"]),
            "timesteps": torch.from_numpy(t.astype(np.int64)),
            "mask": torch.from_numpy(real),
        }

    def _flat(self) -> dict[str, np.ndarray]:
        """The trajectories concatenated in :attr:`offsets` order: normalised states ``(T, obs_dim)``, actions
        ``(T, act_dim)``, rewards and scaled returns-to-go ``(T, 1)`` (float32, as :meth:`window` computes them)."""
        if self._flat_cache is None:
            tr = self.trajectories
            self._flat_cache = {
                "states": np.concatenate([(t.observations - self.state_mean) / self.state_std for t in tr]).astype(
                    np.float32, copy=False
                ),
                "actions": np.concatenate([t.actions for t in tr]).astype(np.float32, copy=False),
                "rewards": np.concatenate([t.rewards for t in tr]).astype(np.float32, copy=False)[:, None],
                "returns_to_go": np.concatenate([r / self.return_scale for r in self._rtg]).astype(
                    np.float32, copy=False
                )[:, None],
            }
        return self._flat_cache
