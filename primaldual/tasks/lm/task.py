"""Task ``lm``: causal language modelling (step-based; the lowest validation loss selects the checkpoint).

Data, Lightning module, results and generation: :mod:`primaldual.tasks.lm.training`. Models: ``model.kind: lm``,
:class:`~primaldual.models.CausalLM` (pre-LN, every attention layer causal); ``hf_gpt2``, Hugging Face's
``GPT2LMHeadModel`` at the same sizes (:class:`~primaldual.integrations.hf.peers.HFGPT2LM`, the ``hf`` extra), a
peer to compare with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ...options import check_bool
from ...train.config import ConfigError, RunConfig
from ..base import Task, data_info, register_task
from ..checks import (
    InitKey,
    TiedEmbeddingsKey,
    TokenModelKeys,
    ValSizeKey,
    check_init,
    check_token_model,
    check_val_size,
    peer_attention,
)
from ..protocols import LM_HELDOUT, Protocol

__all__ = ["LM_DATASETS", "LanguageModelTask"]

# data.name values: the obtainable English corpus, or WikiText files the user provides (data.root)
LM_DATASETS: tuple[str, ...] = ("english", "wikitext-103", "wikitext-2")


@register_task("lm")
class LanguageModelTask(Task):
    model_kinds = ("lm", "hf_gpt2")
    causal = True
    metrics = ("loss", "ppl")
    config = {"data": (ValSizeKey,), "model": (TokenModelKeys, TiedEmbeddingsKey, InitKey)}

    def check(self, cfg: RunConfig) -> None:
        d, m = cfg.data, cfg.model
        if d.name not in LM_DATASETS:
            raise ConfigError(f"data.name: task 'lm' takes one of {LM_DATASETS}, got {d.name!r}")
        if d.max_len is None:
            raise ConfigError("data.max_len: task 'lm' needs the tokens per sample (e.g. 512)")
        check_val_size(d)
        check_token_model(m)
        check_bool("model.tie_embeddings", m.tie_embeddings)
        check_init(m)
        if not m.norm_first:
            raise ConfigError("model.norm_first: the causal LM (model.kind 'lm') is pre-LN; set it to true")
        if m.resolved_kind(self.name) == "hf_gpt2":
            peer_attention(m, "Hugging Face's GPT2LMHeadModel")
            if m.positions != "learned":
                raise ConfigError(
                    f"model.positions: model.kind 'hf_gpt2' is GPT-2, whose positions are a learned table (wpe); "
                    f"set it to 'learned' (got {m.positions!r})"
                )
            if m.init != "pytorch":
                raise ConfigError(
                    f"model.init: model.kind 'hf_gpt2' is initialised by transformers (GPT-2's own scheme); leave "
                    f"model.init at 'pytorch' (got {m.init!r})"
                )

    table_title = "Test perplexity"

    def table_value(self, summary: dict[str, Any]) -> float:
        return summary["test_ppl"]

    def protocol(self, name: str) -> Protocol:
        return LM_HELDOUT

    def datamodule(self, cfg: RunConfig) -> Any:
        from .training import LMDataModule

        return LMDataModule(cfg.data, cfg.seed)

    def model(self, cfg: RunConfig, dm: Any) -> nn.Module:
        from .training import build_lm

        return build_lm(cfg, dm.vocab_size)

    def module(self, cfg: RunConfig, dm: Any) -> Any:
        from .training import LanguageModelModule

        total = cfg.trainer.max_steps if cfg.step_based else None
        return LanguageModelModule(
            self.model(cfg, dm), cfg.optim, cfg.schedule, total, dm.split_bytes, dm.split_targets
        )

    def on_run_dir(self, cfg: RunConfig, dm: Any, run_dir: Path) -> None:
        dm.save_tokenizer(run_dir)  # primaldual generate needs only the run directory

    def results(
        self, cfg: RunConfig, dm: Any, module: Any, protocol: Protocol, best: dict[str, Any], test: dict | None
    ) -> dict[str, Any]:
        from .training import lm_results

        exact = getattr(module, "results", {}).get("test")  # summed in float64, not the logged mean
        return {"data": data_info(dm), **lm_results(dm, exact if exact is not None else test, best)}

    def report(self, cfg: RunConfig, summary: dict[str, Any], protocol: Protocol) -> str:
        from .training import lm_report

        return lm_report(cfg, summary, protocol.label)
