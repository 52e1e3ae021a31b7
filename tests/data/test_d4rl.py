"""D4RL-format data: the checked reader (files written here in the exact D4RL key layout, and malformed ones),
trajectories, returns-to-go, context windows. The generator's tests are in tests/recipes/test_d4rl.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

h5py = pytest.importorskip("h5py")

from primaldual.data.cache import MissingDataError  # noqa: E402
from primaldual.data.d4rl import (  # noqa: E402
    D4RLFormatError,
    TrajectoryDataset,
    read_d4rl,
    returns_to_go,
    split_trajectories,
    state_stats,
)

ROOT = Path(__file__).resolve().parents[2]
SD, AD = 4, 2
# three episodes: 5 steps ending in a terminal, 6 steps cut by a timeout, then a 3-step unfinished tail
LENGTHS, ENDS = (5, 6, 3), ("terminal", "timeout", None)


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = sum(LENGTHS)
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    pos = 0
    for length, end in zip(LENGTHS, ENDS):
        pos += length
        if end == "terminal":
            terminals[pos - 1] = True
        elif end == "timeout":
            timeouts[pos - 1] = True
    obs = rng.normal(size=(n, SD)).astype(np.float32)
    return {
        "observations": obs,
        "actions": rng.uniform(-1, 1, size=(n, AD)).astype(np.float32),
        "rewards": np.arange(1, n + 1, dtype=np.float32),
        "terminals": terminals,
        "timeouts": timeouts,
        "next_observations": np.roll(obs, -1, 0),
        "infos/qpos": rng.normal(size=(n, 3)).astype(np.float32),
    }


def _write(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
        f.create_dataset("metadata/algorithm", data="SAC")  # D4RL files carry such groups: ignored
    return path


@pytest.fixture
def d4rl_file(tmp_path) -> Path:
    return _write(tmp_path / "hopper-test-v2.hdf5", _arrays())


def test_read(d4rl_file):
    a = _arrays()
    d = read_d4rl(d4rl_file)
    assert len(d) == 14 and d.state_dim == SD and d.act_dim == AD
    np.testing.assert_array_equal(d.observations, a["observations"])
    np.testing.assert_array_equal(d.next_observations, a["next_observations"])
    assert d.terminals.dtype == bool and d.rewards.dtype == np.float32
    assert set(d.infos) == {"qpos"} and d.metadata == {}
    assert read_d4rl(d4rl_file.parent).path == d4rl_file  # a directory with one HDF5 file
    # without the optional keys
    b = {k: v for k, v in a.items() if k in ("observations", "actions", "rewards", "terminals", "timeouts")}
    b["terminals"] = b["terminals"].astype(np.float32)  # 0 / 1 floats, as some releases store them
    b["rewards"] = b["rewards"][:, None]  # (N, 1) columns are accepted
    d = read_d4rl(_write(d4rl_file.parent / "minimal" / "x.hdf5", b))
    assert d.next_observations is None and d.infos == {} and d.terminals.dtype == bool and d.rewards.shape == (14,)


def test_trajectories_and_returns_to_go(d4rl_file):
    d = read_d4rl(d4rl_file)
    trajs = split_trajectories(d)
    assert [len(t) for t in trajs] == [5, 6, 3]  # the unfinished tail is kept
    assert [t.start for t in trajs] == [0, 5, 11]
    assert [len(t) for t in split_trajectories(d, drop_tail=True)] == [5, 6]  # as the DT conversion script
    np.testing.assert_allclose(returns_to_go(trajs[0].rewards), [15, 14, 12, 9, 5])
    np.testing.assert_allclose(returns_to_go(np.array([1.0, 1.0, 1.0]), gamma=0.5), [1.75, 1.5, 1.0])
    mean, std = state_stats(d.observations)
    np.testing.assert_allclose(mean, d.observations.mean(0), rtol=1e-5)
    np.testing.assert_allclose(std, d.observations.std(0) + 1e-6, rtol=1e-5)


def test_windows(d4rl_file):
    K = 4
    ds = TrajectoryDataset(d4rl_file, K, return_scale=10.0, seed=3)
    assert len(ds) == 14 and ds.info["trajectories"] == 3
    mean, std = ds.state_mean, ds.state_std
    d = ds.data
    # anchor "start" (the DT code): a window from step 4 of the second trajectory runs off its end: 2 real steps
    w = ds.window(1, 4)
    assert w["mask"].tolist() == [False, False, True, True]
    np.testing.assert_allclose(w["states"][2:].numpy(), (d.observations[9:11] - mean) / std, rtol=1e-5)
    assert torch.all(w["states"][:2] == 0) and torch.all(w["actions"][:2] == 0)
    assert w["timesteps"].tolist() == [0, 0, 4, 5]
    np.testing.assert_allclose(w["returns_to_go"][:, 0].numpy(), [0, 0, (10 + 11) / 10, 11 / 10])
    np.testing.assert_allclose(w["rewards"][:, 0].numpy(), [0, 0, 10, 11])
    # anchor "end": the drawn step ends the window; trajectory starts are left-padded
    ds_end = TrajectoryDataset(d4rl_file, K, return_scale=10.0, anchor="end")
    w = ds_end.window(0, 1)
    assert w["mask"].tolist() == [False, False, True, True] and w["timesteps"].tolist() == [0, 0, 0, 1]
    np.testing.assert_allclose(w["returns_to_go"][2:, 0].numpy(), [1.5, 1.4])
    w = ds_end.window(1, 5)
    assert w["mask"].all() and w["timesteps"].tolist() == [2, 3, 4, 5]
    # max_ep_len caps the timesteps
    assert TrajectoryDataset(d4rl_file, K, max_ep_len=3).window(1, 0)["timesteps"].tolist() == [0, 1, 2, 2]
    # items: deterministic for a seed, fresh per epoch, batched
    item = ds[5]
    assert all(torch.equal(item[k], TrajectoryDataset(d4rl_file, K, return_scale=10.0, seed=3)[5][k]) for k in item)
    batch = ds.batch(range(8))
    assert batch["states"].shape == (8, K, SD) and batch["mask"].dtype == torch.bool
    other = TrajectoryDataset(d4rl_file, K, return_scale=10.0, seed=4).batch(range(8))
    assert not torch.equal(batch["states"], other["states"])
    ds.set_epoch(1)
    assert not torch.equal(ds.batch(range(8))["states"], batch["states"])
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    assert next(iter(loader))["returns_to_go"].shape == (4, K, 1)


@pytest.mark.parametrize("anchor", ["start", "end"])
@pytest.mark.parametrize("K, max_ep_len", [(4, 1000), (3, 2), (9, 1000)])
def test_batch_equals_stacked_items(d4rl_file, anchor, K, max_ep_len):
    """batch() gathers all windows at once: exactly the items stacked, padded windows, runs off the end, capped
    timesteps and any index order included; bad indices are refused by name."""
    ds = TrajectoryDataset(d4rl_file, K, return_scale=10.0, seed=2, anchor=anchor, max_ep_len=max_ep_len)
    ds.set_epoch(3)
    idx = [13, 0, 5, 5, 7, 1, 12, 2, 9, 3]
    got = ds.batch(idx)
    items = [ds[i] for i in idx]
    for key in items[0]:
        want = torch.stack([it[key] for it in items])
        assert got[key].dtype == want.dtype and torch.equal(got[key], want), key
    with pytest.raises(IndexError, match="index 14 out of range"):
        ds.batch([0, 14])
    with pytest.raises(ValueError, match="at least one"):
        ds.batch([])


def test_sampling_proportional_to_length(d4rl_file):
    ds = TrajectoryDataset(d4rl_file, 4, num_samples=6000, seed=0)
    counts = np.zeros(3)
    for i in range(len(ds)):
        rng = np.random.default_rng([0, 0, i])
        counts[ds.locate(int(rng.integers(ds.num_timesteps)))[0]] += 1
    np.testing.assert_allclose(counts / counts.sum(), np.array(LENGTHS) / 14, atol=0.02)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: a.pop("timeouts"), r"missing key 'timeouts'"),
        (lambda a: a.pop("observations"), r"missing key 'observations'"),
        (lambda a: a.update(actions=a["actions"][:-1]), r"'actions' has 13 rows but 'observations' has 14"),
        (lambda a: a.update(rewards=a["rewards"][:-2]), r"'rewards' has 12 rows but 'observations' has 14"),
        (lambda a: a.update(terminals=a["terminals"][:-1]), r"'terminals' has 13 rows"),
        (
            lambda a: a["observations"].__setitem__((3, 1), np.nan),
            r"'observations' holds NaN values \(1, first at row 3\)",
        ),
        (lambda a: a["rewards"].__setitem__(7, np.inf), r"'rewards' holds infinite values"),
        (lambda a: a.update(actions=a["actions"][:, 0]), r"'actions' has shape \(14,\), expected \(N, dim\)"),
        (lambda a: a.update(rewards=np.ones((14, 3), np.float32)), r"'rewards' has shape \(14, 3\), expected \(N,\)"),
        (lambda a: a.update(observations=a["observations"].astype(np.int64)), r"'observations' has dtype int64"),
        (lambda a: a.update(terminals=np.full(14, 2)), r"'terminals' must hold booleans or 0 / 1"),
        (lambda a: a.update(next_observations=a["next_observations"][:, :2]), r"'next_observations' has shape"),
        (lambda a: a.update(rewards=np.array([b"x"] * 14)), r"'rewards' has dtype \|S1, expected numbers"),
    ],
)
def test_malformed_files(tmp_path, change, match):
    a = _arrays()
    change(a)
    path = _write(tmp_path / "bad.hdf5", a)
    with pytest.raises(D4RLFormatError, match=match) as e:
        read_d4rl(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and isinstance(e.value, ValueError)


def test_missing_and_unreadable(tmp_path):
    with pytest.raises(MissingDataError, match="no such file.*primaldual data generate d4rl"):
        read_d4rl(tmp_path / "nope.hdf5")
    with pytest.raises(MissingDataError, match="no .hdf5 file in this directory"):
        read_d4rl(tmp_path)
    (tmp_path / "junk.hdf5").write_bytes(b"not hdf5 at all" * 10)
    with pytest.raises(D4RLFormatError, match="not a readable HDF5 file") as e:
        read_d4rl(tmp_path / "junk.hdf5")
    assert "\n" not in str(e.value)
    _write(tmp_path / "other.h5", _arrays())
    with pytest.raises(D4RLFormatError, match="several HDF5 files"):
        read_d4rl(tmp_path)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "observations",
            lambda a: np.where(np.arange(a.size).reshape(a.shape) == 5, 1e39, a),
            "beyond float32's range",
        ),
        ("rewards", lambda a: np.full(a.shape, 3e38), "returns-to-go overflow float32"),
        ("observations", lambda a: np.zeros((len(a), 0)), r"shape \(14, 0\): no columns"),
    ],
)
def test_values_are_checked_as_the_model_sees_them(tmp_path, key, value, expected):
    """Values are checked after the float32 cast (1e39 is inf there), returns-to-go must stay finite, and an
    observation width of 0 is a format error, not a RuntimeError later."""
    arrays = _arrays()
    arrays[key] = value(arrays[key].astype(np.float64))
    with pytest.raises(D4RLFormatError, match=expected):
        read_d4rl(_write(tmp_path / "bad.hdf5", arrays))
