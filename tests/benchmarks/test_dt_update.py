"""benchmarks/dt_update.py on a tiny D4RL-layout file: the loop as before and today's float32 loop are timed side by
side, and the reproduction of the old loop computes what today's does (same batch, same predictions)."""

from __future__ import annotations

import pytest
import torch

from tests.rl.test_train import hopper_dir  # noqa: F401  (a fixture)

from .scripts import load_script

pytest.importorskip("h5py")


def test_dt_update_times_the_loop_before_and_now(hopper_dir, capsys):  # noqa: F811
    data = str(hopper_dir / "hopper-medium.hdf5")
    args = ["--data", data, "--steps", "1", "--rounds", "2", "--warmup", "1", "--variants", "float32 (before),float32"]
    assert load_script("dt_update").main(args) == 0
    out = capsys.readouterr().out
    assert "| float32 (before) |" in out and "| float32 |" in out and "speed-up over float32 (before)" in out


def test_the_reproduced_old_loop_equals_todays(hopper_dir):  # noqa: F811
    from primaldual.data.d4rl import TrajectoryDataset, read_d4rl
    from primaldual.tasks.offline_rl.training import build_dt, dt_inputs
    from primaldual.train.config import load_config

    bench = load_script("dt_update")
    data = read_d4rl(hopper_dir / "hopper-medium.hdf5")
    cfg = load_config("rl/hopper-medium/dt", [*bench.REDUCED, "--data.root", str(hopper_dir), "--data.max_len", "5"])
    ds = TrajectoryDataset(data, 5, seed=0)
    old, new = bench._batch_before(ds, 3, 8, 10), bench._batch(ds, 3, 8, 10)
    assert all(torch.equal(old[k], new[k]) for k in new)
    torch.manual_seed(0)
    model = build_dt(cfg, 11, 3).eval()
    want = model(*dt_inputs(new))
    bench._as_before(model)
    assert torch.allclose(model(*dt_inputs(old)), want, atol=1e-6)
