"""Files a user can point at are never unpickled: a crafted checkpoint or ``.npy`` whose unpickling would run code
is refused by every entry point (``fit`` resume, ``test``, ``validate``, ``analyze``, the Pathfinder readers) with
one error line and exit code 2, and its payload never runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from primaldual.cli import main
from primaldual.train.callbacks import AtomicCheckpointIO
from primaldual.train.checkpoints import CheckpointError, load_checkpoint
from primaldual.train.config import dump_config, load_config

ROOT = Path(__file__).resolve().parents[1]


class Payload:
    """Unpickling this object writes ``marker``: the side effect a malicious file would have."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('payload ran')",))


def _crafted_ckpt(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "epoch": 0, "payload": Payload(marker)}, path)
    return path


def _crafted_npy(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.array([Payload(marker), "x"], dtype=object), allow_pickle=True)
    return path


def _refused(capsys, argv: list[str], prog: str) -> str:
    rc = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"{prog}: error: "), err
    return err[0]


@pytest.fixture
def marker(tmp_path):
    m = tmp_path / "payload_ran"
    yield m
    assert not m.exists(), "the crafted file's code ran"


@pytest.fixture
def run_dir(tmp_path, tiny_config):
    """A run directory whose config.yaml is the tiny config's (as `primaldual fit` writes it)."""
    cfg_path = tiny_config(**{"trainer.max_epochs": 1})
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(dump_config(load_config(cfg_path)))
    return cfg_path, d


def test_the_payload_is_live(tmp_path):
    """Control: an unsafe load of the crafted files does run the payload (so the refusals below mean something)."""
    m = tmp_path / "ran"
    path = _crafted_ckpt(tmp_path / "evil.ckpt", m)
    torch.load(path, weights_only=False)
    assert m.read_text() == "payload ran"
    m.unlink()
    np.load(_crafted_npy(tmp_path / "evil.npy", m), allow_pickle=True)
    assert m.exists()


def test_checkpoint_loaders_refuse(tmp_path, marker):
    path = _crafted_ckpt(tmp_path / "evil.ckpt", marker)
    with pytest.raises(CheckpointError, match="refused to load.*exec"):
        load_checkpoint(path)
    # Lightning's own loads (resume, test, validate) go through the checkpoint IO plugin: safe whatever it asks
    with pytest.raises(CheckpointError, match="refused to load"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)


def test_fit_resume_refuses(capsys, run_dir, marker):
    cfg_path, d = run_dir
    _crafted_ckpt(d / "checkpoints" / "last.ckpt", marker)
    line = _refused(capsys, ["fit", "--config", str(cfg_path), "--run-dir", str(d)], "primaldual fit")
    assert "last.ckpt: refused to load" in line and "--fresh" in line
    _crafted_ckpt(d / "checkpoints" / "last.prev.ckpt", marker)  # the fallback is read safely too
    line = _refused(capsys, ["fit", "--config", str(cfg_path), "--run-dir", str(d)], "primaldual fit")
    assert "refused to load" in line and "previous checkpoint is unusable too" in line


@pytest.mark.parametrize("sub", ["test", "validate"])
def test_test_and_validate_refuse(capsys, tmp_path, run_dir, marker, sub):
    cfg_path, d = run_dir
    evil = _crafted_ckpt(tmp_path / "evil.ckpt", marker)
    line = _refused(capsys, [sub, "--config", str(cfg_path), "--ckpt", str(evil)], f"primaldual {sub}")
    assert "refused to load" in line
    _crafted_ckpt(d / "checkpoints" / "best.ckpt", marker)
    line = _refused(capsys, [sub, "--run-dir", str(d)], f"primaldual {sub}")  # the run's own config.yaml
    assert "best.ckpt: refused to load" in line


def test_analyze_refuses(capsys, tmp_path, run_dir, marker):
    _, d = run_dir
    _crafted_ckpt(d / "checkpoints" / "best.ckpt", marker)
    assert "refused to load" in _refused(capsys, ["analyze", str(d)], "primaldual analyze")
    evil = _crafted_ckpt(tmp_path / "other.ckpt", marker)
    assert "refused to load" in _refused(capsys, ["analyze", str(d), "--ckpt", str(evil)], "primaldual analyze")


def test_corrupt_checkpoints_are_one_line_errors(capsys, tmp_path, run_dir):
    cfg_path, d = run_dir
    for name, data in (("empty.ckpt", b""), ("garbage.ckpt", b"not a checkpoint" * 8)):
        (tmp_path / name).write_bytes(data)
        line = _refused(capsys, ["test", "--config", str(cfg_path), "--ckpt", str(tmp_path / name)], "primaldual test")
        assert f"{name}: " in line and ("not a readable checkpoint" in line or "corrupt or foreign" in line)


def _pathfinder_config(tiny_config, root: Path) -> Path:
    base = {
        "name": "tiny_pf",
        "task": "lra_pathfinder",
        "data": {"name": "pathfinder32_L14", "root": str(root), "batch_size": 4},
        "model": {"dim": 8, "depth": 1, "num_heads": 2, "ffn_dim": 8, "attention": "softmax"},
        "optim": {"name": "adamw", "lr": 1e-3},
        "trainer": {"max_steps": 2, "accelerator": "cpu", "enable_progress_bar": False},
    }
    return tiny_config(base=base)


def test_pathfinder_release_metadata_refused(capsys, tmp_path, tiny_config, marker):
    from primaldual.data.pathfinder import PathfinderDataset, read_pathfinder_release

    root = tmp_path / "curv_contour_length_14"
    _crafted_npy(root / "metadata" / "0.npy", marker)
    with pytest.raises(ValueError, match=r"0\.npy: refused to load: it holds pickled Python objects"):
        read_pathfinder_release(root)
    with pytest.raises(ValueError, match="refused to load"):
        PathfinderDataset(root, "train")
    cfg = _pathfinder_config(tiny_config, root)
    line = _refused(capsys, ["fit", "--config", str(cfg), "--run-dir", str(tmp_path / "run")], "primaldual fit")
    assert "0.npy: refused to load" in line
    assert not (tmp_path / "run").exists()


def test_pathfinder_generated_layout_refused(capsys, tmp_path, tiny_config, marker):
    from primaldual.data.pathfinder import PathfinderDataset

    root = tmp_path / "pf"
    _crafted_npy(root / "train_images.npy", marker)
    np.save(root / "train_labels.npy", np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match=r"train_images\.npy: refused to load"):
        PathfinderDataset(root, "train")
    cfg = _pathfinder_config(tiny_config, root)
    line = _refused(capsys, ["fit", "--config", str(cfg), "--run-dir", str(tmp_path / "run")], "primaldual fit")
    assert "train_images.npy: refused to load" in line


def test_release_metadata_as_text_lines(tmp_path):
    """The LRA release's metadata/<k>.npy files are text lines ('dir file _ label ...'), read without numpy."""
    from PIL import Image

    from primaldual.data.pathfinder import read_pathfinder_release

    root = tmp_path / "release"
    (root / "metadata").mkdir(parents=True)
    (root / "imgs" / "0").mkdir(parents=True)
    img = np.arange(32 * 32, dtype=np.uint8).reshape(32, 32)
    for n in range(2):
        Image.fromarray(img).save(root / "imgs" / "0" / f"sample_{n}.png")
    (root / "metadata" / "0.npy").write_text("imgs/0 sample_0.png 0 1 0.5 2\nimgs/0 sample_1.png 0 0 0.5 2\n")
    x, y = read_pathfinder_release(root)
    assert x.shape == (2, 32, 32) and np.array_equal(x[0], img) and y.tolist() == [1, 0]


def test_no_unsafe_load_flags_in_the_package():
    """No ``weights_only=False`` load or ``allow_pickle=True`` anywhere in primaldual/ or benchmarks/.

    ``trainer.save_checkpoint(path, weights_only=False)`` is a *save* option (keep the optimiser and loop state),
    not a load, and is the one form allowed.
    """
    offenders = []
    for folder in ("primaldual", "benchmarks"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            for i, line in enumerate(f.read_text().splitlines(), 1):
                if re.search(r"allow_pickle\s*=\s*True", line):
                    offenders.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
                if re.search(r"weights_only\s*=\s*False", line) and "save_checkpoint(" not in line:
                    offenders.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
