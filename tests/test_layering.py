"""Package layering: the core imports torch and numpy only, and no module reaches into another's private names."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "primaldual"
# optional extras (train, data, bench, theory): never imported by `import primaldual`
HEAVY = {
    "lightning",
    "pytorch_lightning",
    "jsonargparse",
    "yaml",
    "matplotlib",
    "tqdm",
    "PIL",
    "scipy",
    "clarabel",
    "transformers",
    "accelerate",
    "timm",
    "torchvision",
    "tokenizers",
    "h5py",
    "gymnasium",
    "stable_baselines3",
}
HARNESS = (
    "primaldual.train",
    "primaldual.tasks",
    "primaldual.data",
    "primaldual.recipes",
    "primaldual.bench",
    "primaldual.analysis",
    "primaldual.cli",
)


def _modules_after(statement: str) -> list[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_import_primaldual_loads_no_training_data_or_plotting_dependency():
    mods = _modules_after("import primaldual")
    # what torch itself pulls in when installed (torch.hub imports tqdm if present) is not ours
    own = {m.split(".")[0] for m in mods} - {m.split(".")[0] for m in _modules_after("import torch, numpy")}
    assert not own & HEAVY, sorted(own & HEAVY)
    assert not [m for m in mods if m.startswith(HARNESS)]


def _private_imports(path: Path) -> list[str]:
    """``from <our module> import _name`` statements in ``path`` (relative imports or ``primaldual.*``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        ours = node.level > 0 or (node.module or "").split(".")[0] == "primaldual"
        for alias in node.names:
            if ours and alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {alias.name}")
    return found


def test_no_module_imports_a_private_name_from_another():
    offenders = [hit for f in sorted(PACKAGE.rglob("*.py")) for hit in _private_imports(f)]
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)
