"""LRA configs: every task x model, reference settings from benchmarks.md, reduced variants labelled.

Read through ``load_config`` (the composition the CLI and ``bench lra`` use), checked against the reference table
of benchmarks.md, the one table restated here: it is the oracle the configs are tested against.
"""

from __future__ import annotations

import pytest

from primaldual.attention.registry import attention_options
from primaldual.bench.lra import MODELS, TASKS
from primaldual.train.compose import PACKAGE_CONFIGS
from primaldual.train.config import describe_config, list_configs, load_config

# benchmarks.md, section 2: task: (length, batch, steps, warm-up, PrimalFormer s/eta, Primal.+ s/eta)
REFERENCE = {
    "listops": (2048, 32, 5000, 1000, (20, 0.1), (30, 0.05)),
    "text": (4096, 32, 20000, 8000, (20, 0.05), (30, 0.1)),
    "retrieval": (4096, 32, 30000, 800, (30, 0.0), (20, 0.05)),
    "image": (1024, 256, 35000, 175, (30, 0.1), (30, 0.1)),
    "pathfinder": (1024, 256, 62400, 312, (30, 0.1), (20, 0.05)),
}


def _layers(m) -> tuple[list[str], list[dict]]:
    names = m.attention if isinstance(m.attention, list) else [m.attention] * m.depth
    opts = m.attention_options if isinstance(m.attention_options, list) else [m.attention_options] * m.depth
    return names, opts


def test_every_task_and_model_has_a_reference_and_a_reduced_config():
    names = set(list_configs("lra/"))
    assert names == {f"lra/{t}/{b}{m}" for t in REFERENCE for m in MODELS for b in ("", "reduced/")}
    assert list(TASKS) == list(REFERENCE)  # bench lra runs exactly the configured tasks


@pytest.mark.parametrize("task", sorted(REFERENCE))
@pytest.mark.parametrize("model", MODELS)
def test_reference_config(task, model):
    cfg = load_config(f"lra/{task}/{model}")
    length, batch, steps, warmup, pf, pp = REFERENCE[task]
    m, o = cfg.model, cfg.optim
    assert (m.dim, m.depth, m.num_heads, m.ffn_dim, m.dropout) == (64, 2, 2, 128, 0.1)
    assert m.norm_first and m.pooling == "mean" and m.positions == "learned"
    assert (o.name, o.lr, tuple(o.betas), o.eps, o.weight_decay) == ("adamw", 1e-4, (0.9, 0.999), 1e-6, 0.0)
    assert cfg.data.max_len == length and cfg.data.batch_size == batch and cfg.data.val_size is None
    assert cfg.trainer.max_steps == steps == cfg.schedule.total_steps and cfg.schedule.warmup_steps == warmup
    assert cfg.schedule.decay == "linear" and cfg.name == model
    names, opts = _layers(m)
    for name in names:
        attention_options(name)  # registered
    if model in ("primalformer", "primal_plus"):
        s, eta = pf if model == "primalformer" else pp
        primal = [x for x in opts if x]
        assert all((x["s"], x["eta"], x["max_len"]) == (s, eta, length) for x in primal)
        assert names == (["primal", "primal"] if model == "primalformer" else ["softmax", "primal"])
    if model.endswith("_sh"):  # 2 heads: the factors must pool at least one head, or SH is plain softmax
        assert max(m.attention_options["factors"]) > 1


@pytest.mark.parametrize("task", sorted(REFERENCE))
@pytest.mark.parametrize("model", MODELS)
def test_reduced_variants_are_labelled(task, model):
    cfg = load_config(f"lra/{task}/reduced/{model}")
    ref = load_config(f"lra/{task}/{model}")
    assert cfg.name == f"{model}_reduced" and cfg.data.val_size == 1000 and cfg.optim.lr == 1e-3
    assert cfg.trainer.max_steps < ref.trainer.max_steps and cfg.schedule.total_steps == cfg.trainer.max_steps
    assert cfg.model.attention == ref.model.attention and cfg.fingerprint() != ref.fingerprint()
    overlay = "lra/_budgets/reduced.yaml"
    assert overlay in describe_config(f"lra/{task}/reduced/{model}")
    assert "REDUCED" in (PACKAGE_CONFIGS / overlay).read_text().splitlines()[0]


@pytest.mark.parametrize("task", sorted(REFERENCE))
def test_bench_lra_reads_the_reference_configs(task):
    length, batch, _, _, pf, pp = REFERENCE[task]
    ref = load_config(f"lra/{task}/transformer")
    assert TASKS[task] == {
        "length": length,
        "vocab": ref.model.vocab_size,
        "classes": ref.model.num_classes,
        "batch": batch,
        "pf": pf,
        "pp": pp,
    }
