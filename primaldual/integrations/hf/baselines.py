"""Randomly initialised Hugging Face models to compare primaldual's own models with (no download).

:func:`gpt2_lm` is the GPT-2 language model of the same shape as a :class:`~primaldual.models.CausalLM` (learned
positions, pre-LN blocks, GELU feed-forward, output layer tied to the embedding), for the generation benchmark
(``primaldual bench generate``).
"""

from __future__ import annotations

from torch import nn

__all__ = ["gpt2_lm"]


def gpt2_lm(
    vocab_size: int,
    max_len: int,
    *,
    dim: int,
    depth: int,
    num_heads: int,
    ffn_dim: int | None = None,
    seed: int = 0,
) -> nn.Module:
    """A random ``transformers.GPT2LMHeadModel`` in eval mode, dropout off, ``use_cache=True``.

    Args:
        vocab_size: token ids; the last id is the end-of-sequence and padding id (``generate`` needs one).
        max_len: positions (``n_positions``). dim, depth, num_heads: ``n_embd``, ``n_layer``, ``n_head``.
        ffn_dim: feed-forward width (default ``4 * dim``, GPT-2's). seed: the initialisation's seed.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=max_len,
        n_embd=dim,
        n_layer=depth,
        n_head=num_heads,
        n_inner=ffn_dim,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=vocab_size - 1,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 1,
        use_cache=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model.eval()
