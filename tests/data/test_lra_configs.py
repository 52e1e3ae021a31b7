"""LRA configs: every task x model, reference settings from benchmarks.md, reduced variants labelled."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from primaldual.attention.registry import attention_options

ROOT = Path(__file__).resolve().parents[2] / "configs" / "lra"
MODELS = (
    "transformer",
    "primalformer",
    "primal_plus",
    "softmax_bn",
    "softmax_sh",
    "softmax_bn_sh",
    "linear",
    "linear_bn",
)
# task: (length, batch, steps, warm-up, PrimalFormer s/eta, Primal.+ s/eta)
REFERENCE = {
    "listops": (2048, 32, 5000, 1000, (20, 0.1), (30, 0.05)),
    "text": (4096, 32, 20000, 8000, (20, 0.05), (30, 0.1)),
    "retrieval": (4096, 32, 30000, 800, (30, 0.0), (20, 0.05)),
    "image": (1024, 256, 35000, 175, (30, 0.1), (30, 0.1)),
    "pathfinder": (1024, 256, 62400, 312, (30, 0.1), (20, 0.05)),
}


@pytest.mark.parametrize("task", sorted(REFERENCE))
@pytest.mark.parametrize("model", MODELS)
def test_reference_config(task, model):
    path = ROOT / task / f"{model}.yaml"
    cfg = yaml.safe_load(path.read_text())
    length, batch, steps, warmup, pf, pp = REFERENCE[task]
    m, o = cfg["model"], cfg["optim"]
    assert (m["dim"], m["depth"], m["num_heads"], m["ffn_dim"], m["dropout"]) == (64, 2, 2, 128, 0.1)
    assert m["norm_first"] and m["pooling"] == "mean" and m["positions"] == "learned"
    assert (o["name"], o["lr"], o["eps"], o["weight_decay"]) == ("adamw", 1e-4, 1e-6, 0.0)
    assert cfg["data"]["max_len"] == length and cfg["data"]["batch_size"] == batch
    assert cfg["trainer"]["max_steps"] == steps and cfg["schedule"]["warmup_steps"] == warmup
    names = m["attention"] if isinstance(m["attention"], list) else [m["attention"]] * 2
    for name in names:
        attention_options(name)  # registered
    if model in ("primalformer", "primal_plus"):
        s, eta = pf if model == "primalformer" else pp
        opts = [x for x in m["attention_options"] if x]
        assert all((x["s"], x["eta"]) == (s, eta) for x in opts)
        assert names == (["primal", "primal"] if model == "primalformer" else ["softmax", "primal"])
    if model.endswith("_sh"):  # 2 heads: the factors must pool at least one head, or SH is plain softmax
        assert max(m["attention_options"]["factors"]) > 1


@pytest.mark.parametrize("task", sorted(REFERENCE))
def test_reduced_variants_are_labelled(task):
    for model in MODELS:
        path = ROOT / task / "reduced" / f"{model}.yaml"
        text = path.read_text()
        cfg = yaml.safe_load(text)
        assert "REDUCED" in text.splitlines()[1] and cfg["name"] == f"{model}_reduced"
        assert cfg["trainer"]["max_steps"] < REFERENCE[task][2]
