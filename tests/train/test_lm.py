"""Causal language modelling on the harness (task ``lm``): fit, resume, summary, perplexity, schedule, generate, CLI
errors and the lm config family. Tiny corpora written in tmp_path (never the real cache), tiny models, few steps."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader

from primaldual.cli import main
from primaldual.data.lm import unigram_baseline
from primaldual.train.config import ConfigError, RunConfig, list_configs, load_config
from primaldual.train.module import lr_factor

from .helpers import fit_cmd, history_rows, kill_after_rows, run_here

SENTENCES = (
    "the kernel maps a page into memory and the driver reads the buffer .",
    "she said that the house was quiet in the evening and the garden was green .",
    "and god said let there be light and there was light upon the water .",
    "a module may register a device and the device may raise an interrupt .",
)
WORDS = [w for sentence in SENTENCES for w in sentence.split()]


def _text(n_lines: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n_lines):
        start = int(rng.integers(0, len(WORDS) - 12))
        lines.append(" ".join(WORDS[start : start + int(rng.integers(6, 12))]))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def english_dir(tmp_path_factory):
    """A tiny corpus in the layout `primaldual data fetch english` writes (the files load_english_lm reads)."""
    from primaldual.recipes.english import encode_lines, train_bpe_tokenizer

    d = tmp_path_factory.mktemp("data") / "english"
    d.mkdir()
    texts = {"train": _text(300, 0), "valid": _text(20, 1), "test": _text(20, 2)}
    tok = train_bpe_tokenizer(texts["train"].splitlines(keepends=True), vocab_size=300)
    tok.save(str(d / "tokenizer.json"))
    meta = {"tokenizer": {"file": "tokenizer.json", "type": "byte-level BPE (test)", "vocab_size": 300}, "splits": {}}
    for split, text in texts.items():
        data = text.encode()
        (d / f"{split}.txt").write_bytes(data)
        ids = encode_lines(tok, text).astype(np.uint16)
        np.save(d / f"{split}.u16.npy", ids, allow_pickle=False)
        meta["splits"][split] = {"bytes": len(data), "tokens": int(ids.size), "token_file": f"{split}.u16.npy"}
    (d / "metadata.json").write_text(json.dumps(meta))
    return d


def _lm_config(tmp_path, root, name="english", **changes) -> str:
    cfg = {
        "name": "tiny_lm",
        "task": "lm",
        "seed": 1,
        "data": {"name": name, "root": str(root), "max_len": 16, "batch_size": 4, "eval_batch_size": 8},
        "model": {
            "kind": "lm",
            "dim": 16,
            "depth": 2,
            "num_heads": 2,
            "ffn_dim": 32,
            "dropout": 0.1,
            "attention": ["softmax", "primal"],
            "attention_options": [None, {"s": 4, "eta": 0.1, "ksvd_reduction": "sample"}],
        },
        "optim": {"name": "adamw", "lr": 0.03, "betas": [0.9, 0.98], "weight_decay": 0.01},
        "schedule": {"warmup_steps": 4, "decay": "inverse_sqrt"},
        "trainer": {
            "max_steps": 24,
            "val_check_interval": 6,
            "accelerator": "cpu",
            "gradient_clip_val": 1.0,
            "enable_progress_bar": False,
        },
    }
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path = tmp_path / "tiny_lm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture(scope="module")
def english_run(tmp_path_factory, english_dir):
    """One finished tiny English run (shared by the summary and generate tests)."""
    tmp = tmp_path_factory.mktemp("run")
    run_dir = tmp / "run"
    run_here(fit_cmd(_lm_config(tmp, english_dir), run_dir, "--threads", "1"))
    return run_dir


def test_fit_writes_summary_with_perplexity_bpb_and_the_unigram_floor(english_run, english_dir):
    s = json.loads((english_run / "summary.json").read_text())
    assert s["task"] == "lm" and s["steps"] == 24 and s["evaluations"] == 4
    rows = history_rows(english_run)
    assert [int(r["step"]) for r in rows] == [6, 12, 18, 24]
    best = min(rows, key=lambda r: (float(r["val/loss"]), int(r["step"])))  # the lowest validation loss
    assert s["best_step"] == int(best["step"]) and s["val_loss"] == pytest.approx(float(best["val/loss"]), rel=1e-6)
    assert float(best["val/ppl"]) == pytest.approx(math.exp(float(best["val/loss"])), rel=1e-5)
    test = np.load(english_dir / "test.u16.npy")
    train = np.load(english_dir / "train.u16.npy")
    n_bytes = (english_dir / "test.txt").stat().st_size
    assert s["test_tokens"] == test.size - 1 and s["test_bytes"] == n_bytes
    assert s["test_ppl"] == pytest.approx(math.exp(s["test_loss"]), rel=1e-12)
    assert s["test_bpb"] == pytest.approx(s["test_loss"] * (test.size - 1) / n_bytes / math.log(2), rel=1e-12)
    floor = unigram_baseline(train, test[1:], 300, n_bytes)
    assert s["unigram_test_ppl"] == pytest.approx(floor["perplexity"], rel=1e-12)
    assert s["test_ppl_over_unigram"] == pytest.approx(s["test_ppl"] / floor["perplexity"], rel=1e-12)
    assert s["test_ppl"] < s["unigram_test_ppl"]  # the repetitive tiny corpus is learnt within 24 steps
    assert (english_run / "tokenizer.json").read_bytes() == (english_dir / "tokenizer.json").read_bytes()
    # the KSVD term beside the task loss (the last layer is primal, eta 0.1): J^2 of the last evaluated step
    assert s["ksvd_eta"] == 0.1 and s["ksvd_J2"] == pytest.approx(float(rows[-1]["train/ksvd_J2_step"]))
    assert s["ksvd_rms_J"] == pytest.approx(s["ksvd_J2"] ** 0.5) and s["ksvd_eta_J2"] == pytest.approx(
        0.1 * s["ksvd_J2"]
    )


def test_lm_resume_after_kill_matches_uninterrupted(tmp_path, english_dir, english_run):
    cfg = _lm_config(tmp_path, english_dir)
    killed = tmp_path / "killed"
    assert 1 <= kill_after_rows(fit_cmd(cfg, killed, "--threads", "1"), killed, 2) < 4
    assert not (killed / "summary.json").exists()
    assert "resuming from" in run_here(fit_cmd(cfg, killed, "--threads", "1")).stdout
    ref, got = (json.loads((d / "summary.json").read_text()) for d in (english_run, killed))
    assert got["test_loss"] == ref["test_loss"] and got["best_step"] == ref["best_step"]
    assert history_rows(killed) == history_rows(english_run)


def test_generate_prints_the_prompt_and_its_continuation(capsys, english_run):
    argv = ["generate", str(english_run), "--prompt", "the kernel", "--max-new-tokens", "6", "--threads", "1"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert first.startswith("the kernel") and len(first.strip()) > len("the kernel")
    assert main(argv) == 0 and capsys.readouterr().out == first  # seed 0 by default: the same text
    greedy = [*argv, "--temperature", "0", "--ckpt", "last"]
    assert main(greedy) == 0 and capsys.readouterr().out.startswith("the kernel")


def _one_error_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("primaldual generate: error: "), err
    return lines[0]


def test_generate_bad_input_is_one_error_line(capsys, tmp_path, english_run):
    run_dir = str(english_run)
    assert "not found" in _one_error_line(capsys, ["generate", str(tmp_path / "nope"), "--prompt", "the"])
    assert "empty" in _one_error_line(capsys, ["generate", run_dir, "--prompt", ""])
    assert "empty" in _one_error_line(capsys, ["generate", run_dir, "--prompt", "   "])
    line = _one_error_line(capsys, ["generate", run_dir, "--prompt", "the", "--max-new-tokens", "-3"])
    assert "--max-new-tokens" in line
    line = _one_error_line(capsys, ["generate", run_dir, "--prompt", "the kernel maps a page " * 4])
    assert "positions" in line and "16" in line
    line = _one_error_line(capsys, ["generate", run_dir, "--prompt", "the", "--max-new-tokens", "40"])
    assert "positions" in line
    assert "not found" in _one_error_line(
        capsys, ["generate", run_dir, "--prompt", "the", "--max-new-tokens", "4", "--ckpt", "x.ckpt"]
    )
    line = _one_error_line(capsys, ["generate", run_dir, "--prompt", "the", "--max-new-tokens", "4", "--top-k", "0"])
    assert "--top-k" in line
    line = _one_error_line(capsys, ["generate", run_dir, "--prompt", "the", "--device", "gpu:x"])
    assert "--device: expected a torch device" in line
    line = _one_error_line(capsys, ["generate", run_dir, "--prompt", "the", "--cuda-graph"])
    assert "--cuda-graph: only a constant-size decoding state" in line and "0 (kv_cache)" in line  # Primal.+


def test_missing_corpus_is_one_line_naming_the_fetch_command(capsys, tmp_path):
    cfg = _lm_config(tmp_path, tmp_path / "empty")
    rc = main(["fit", "--config", cfg, "--run-dir", str(tmp_path / "run")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "primaldual data fetch english" in err[0], err
    assert not (tmp_path / "run").exists()


def test_wikitext_fit_with_accumulation_and_word_generation(capsys, tmp_path):
    """A tiny folder in the WikiText layout through load_wikitext; 2 batches per update; dict.txt in the run."""
    root = tmp_path / "wt"
    root.mkdir()
    for split, (n, seed) in {"train": (120, 0), "valid": (12, 1), "test": (12, 2)}.items():
        (root / f"wiki.{split}.tokens").write_text(" = Title = \n\n" + _text(n, seed))
    cfg = _lm_config(
        tmp_path,
        root,
        name="wikitext-2",
        **{"trainer.max_steps": 4, "trainer.val_check_interval": 2, "trainer.accumulate_grad_batches": 2},
    )
    run_dir = tmp_path / "run"
    assert main(["fit", "--config", cfg, "--run-dir", str(run_dir), "--threads", "1"]) == 0
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["steps"] == 4 and [int(r["step"]) for r in history_rows(run_dir)] == [2, 4]
    assert s["data"]["dataset"] == "wikitext-2" and s["test_bytes"] == (root / "wiki.test.tokens").stat().st_size
    assert (run_dir / "dict.txt").is_file()
    capsys.readouterr()
    assert main(["generate", str(run_dir), "--prompt", "the kernel", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("the kernel")


class _FixedLogits(nn.Module):
    """logits[b, t] = table[ids[b, t]]: a model whose NLL can be written down by hand."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.table[ids]


def test_perplexity_is_exp_of_summed_nll_over_token_count():
    import lightning as L

    from primaldual.tasks.lm.training import LanguageModelModule
    from primaldual.train.config import OptimConfig

    # next-token probabilities: after 0 -> (1/2, 1/4, 1/4); after 1 -> (1/8, 3/4, 1/8); after 2 -> uniform
    probs = torch.tensor([[0.5, 0.25, 0.25], [0.125, 0.75, 0.125], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    model = _FixedLogits(probs.log().float())
    samples = [  # (ids, targets); -100 = not a target
        (torch.tensor([0, 1, 2]), torch.tensor([1, 1, 0])),  # -log(1/4) - log(3/4) - log(1/3)
        (torch.tensor([1, 0, 0]), torch.tensor([0, 0, 2])),  # -log(1/8) - log(1/2) - log(1/4)
        (torch.tensor([2, 0, 0]), torch.tensor([2, -100, -100])),  # -log(1/3); a padded last chunk
    ]
    nll = -sum(math.log(p) for p in (1 / 4, 3 / 4, 1 / 3, 1 / 8, 1 / 2, 1 / 4, 1 / 3))
    loss = nll / 7  # 7 target tokens; the mean of the two batch means would be (6 terms / 6 + 1 term / 1) / 2
    module = LanguageModelModule(model, OptimConfig(), split_bytes={"test": 10}, split_targets={"test": 7})
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    res = trainer.test(module, DataLoader(samples, batch_size=2), verbose=False)[0]
    assert module.results["test"]["tokens"] == 7
    assert module.results["test"]["loss"] == pytest.approx(loss, rel=1e-6)
    assert res["test/ppl"] == pytest.approx(math.exp(loss), rel=1e-6)
    assert res["test/bpb"] == pytest.approx(loss * 7 / 10 / math.log(2), rel=1e-6)
    # by hand: the product of the 7 probabilities is 3 / 9216 = 1 / 3072, so the perplexity is 3072 ** (1 / 7)
    assert res["test/ppl"] == pytest.approx(3072 ** (1 / 7), rel=1e-6)
    assert res["test/ppl"] == pytest.approx(3.1492, abs=1e-4)
    mean_of_batch_means = (-math.log(1 / 3072) + math.log(1 / 3)) / 6 / 2 - math.log(1 / 3) / 2
    assert abs(res["test/ppl"] - math.exp(mean_of_batch_means)) > 0.05  # 3.0861: not what is reported


def test_inverse_sqrt_schedule():
    f = [lr_factor(s, warmup=4, decay="inverse_sqrt", total=0) for s in (0, 1, 2, 3, 7, 15, 63, 399)]
    assert f == pytest.approx([0.25, 0.5, 0.75, 1.0, math.sqrt(0.5), 0.5, 0.25, 0.1])
    cfg = RunConfig().to_dict()
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_config(None, ["--schedule.decay", "inverse_sqrt"])
    assert load_config(None, ["--schedule.decay", "inverse_sqrt", "--schedule.warmup_steps", "3"]).schedule.decay
    assert cfg["schedule"]["decay"] == "constant"  # the default (and so every existing fingerprint) is unchanged


def test_lm_configs_compose_with_the_reference_and_reduced_settings():
    models = ("primal_plus", "primalformer", "transformer")
    budgets = ("", "reduced/", "medium/", "ctx256/", "ctx1024/", "ctx4096/")
    expected = [f"lm/{c}/{b}{m}" for c in ("english", "wikitext103") for b in budgets for m in models]
    peers = [f"lm/{c}/{b}hf_gpt2" for c in ("english", "wikitext103") for b in budgets]  # Hugging Face's
    assert list_configs("lm/") == sorted(expected + peers)
    fingerprints = set()
    for name in expected:
        cfg = load_config(name)
        fingerprints.add(cfg.fingerprint())
        m, o, t = cfg.model, cfg.optim, cfg.trainer
        assert cfg.task == "lm" and cfg.protocol == "heldout" and m.resolved_kind("lm") == "lm"
        assert (o.name, o.betas, o.weight_decay, cfg.schedule.decay) == ("adamw", [0.9, 0.98], 0.01, "inverse_sqrt")
        primal = {"s": 30, "eta": 0.1, "ksvd_reduction": "sample"}
        depth = m.depth
        if name.endswith("primal_plus"):
            assert m.attention == ["softmax"] * (depth - 1) + ["primal"] and m.attention_options[-1] == primal
        elif name.endswith("primalformer"):
            assert m.attention == ["primal"] * depth and m.attention_options == [primal] * depth
        else:
            assert m.attention == "softmax"
        if "/reduced/" in name:
            assert (m.dim, depth, m.num_heads, m.ffn_dim, cfg.data.max_len) == (128, 4, 4, 512, 256)
            assert cfg.name.endswith("_reduced") and t.accumulate_grad_batches == 1
        elif "/medium/" in name:  # 4,096 tokens per update, 3,000 updates at width 256
            assert (m.dim, depth, m.num_heads, m.ffn_dim, cfg.data.max_len, cfg.data.batch_size) == (
                256, 4, 4, 1024, 256, 16,
            )  # fmt: skip
            assert (o.lr, t.max_steps, t.accumulate_grad_batches) == (1e-3, 3000, 1) and cfg.name.endswith("_medium")
        elif "/ctx" in name:  # the context study: equal tokens per update (8,192) and equal updates (1,000)
            assert (m.dim, depth, m.num_heads, m.ffn_dim) == (128, 4, 4, 512)
            assert cfg.data.batch_size * cfg.data.max_len == 8192 and t.max_steps == 1000
            assert cfg.name.endswith(f"_ctx{cfg.data.max_len}")
        else:  # benchmarks.md section 6
            assert (m.dim, depth, m.num_heads, m.ffn_dim, m.dropout, cfg.data.max_len) == (512, 6, 8, 2048, 0.1, 512)
            assert (o.lr, cfg.schedule.warmup_steps, t.max_steps) == (1e-3, 6000, 150000)
            assert (cfg.data.batch_size * cfg.data.max_len, t.accumulate_grad_batches) == (2048, 16)
    assert len(fingerprints) == len(expected)
    assert load_config("lm/wikitext103/transformer").data.name == "wikitext-103"


def test_lm_config_errors():
    with pytest.raises(ConfigError, match="data.name: task 'lm' takes one of"):
        load_config("lm/english/reduced/transformer", ["--data.name", "listops"])
    with pytest.raises(ConfigError, match="data.max_len"):
        load_config("lm/english/reduced/transformer", ["--data.max_len", "null"])
    with pytest.raises(ConfigError, match="linear_bn"):  # not causal: checked when the config loads
        load_config("lm/english/reduced/transformer", ["--model.attention", "linear_bn"])
    with pytest.raises(ConfigError, match="trainer.accumulate_grad_batches"):
        load_config("lm/english/reduced/transformer", ["--trainer.accumulate_grad_batches", "0"])
    with pytest.raises(ConfigError, match="paper"):
        load_config("lm/english/reduced/transformer", ["--protocol", "paper"])


def test_seeds_table_reports_test_perplexity_for_language_models():
    from primaldual.train.seeds import format_table

    rows = [
        {"task": "lm", "dataset": "english", "name": "transformer_reduced", "protocol": "heldout", "test_ppl": p}
        for p in (200.0, 220.0)
    ]
    table = format_table(rows)
    assert table.startswith("Test perplexity on english") and "| transformer_reduced | 210.00 +- 14.14 (n=2) |" in table
    assert "lowest validation loss" in table


def test_accumulation_cuts_each_epoch_to_whole_updates():
    from primaldual.train.datamodule import TrainerEpochSampler

    kw = {"num_replicas": 1, "rank": 0, "shuffle": True, "seed": 0}
    plain = TrainerEpochSampler(list(range(10)), None, 2, **kw)
    cut = TrainerEpochSampler(list(range(10)), None, 2, 2, **kw)  # 2 batches of 2 per update: 8 of 10 samples
    assert len(plain) == 10 and len(cut) == 8
    assert list(cut) == list(plain)[:8]


def test_export_writes_a_transformers_directory_that_loads_and_generates_as_the_run(english_run, tmp_path, capsys):
    """``primaldual export RUN --format hf`` (issue 46, item 18): AutoModelForCausalLM / AutoTokenizer load it, the
    logits are the run's, HF greedy generate equals ours; the output directory is never someone else's."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from primaldual.cli import main
    from primaldual.tasks.lm.training import load_run_lm

    out = tmp_path / "exported"
    assert main(["export", str(english_run), "--format", "hf", "--out", str(out)]) == 0
    ours, _, tok = load_run_lm(english_run)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    prompt = "the kernel of the"
    assert hf_tok(prompt)["input_ids"] == tok.encode(prompt)
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ours(ids), rtol=0, atol=1e-6)
    new = ours.max_len - ids.shape[1]  # the tiny run has 16 positions
    assert new >= 3
    mine, _ = ours.generate(ids, max_new_tokens=new, temperature=0)
    assert torch.equal(model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0), mine)
    capsys.readouterr()
    assert main(["export", str(english_run), "--format", "hf", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", str(english_run), "--format", "hf", "--out", str(out), "--force"]) == 0
    mine_dir = tmp_path / "mine"
    mine_dir.mkdir()
    (mine_dir / "notes.txt").write_text("keep")
    assert main(["export", str(english_run), "--format", "hf", "--out", str(mine_dir), "--force"]) == 2
    assert "did not write" in capsys.readouterr().err and (mine_dir / "notes.txt").read_text() == "keep"
