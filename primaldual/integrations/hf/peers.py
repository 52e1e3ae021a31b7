"""Hugging Face models as peers of ours: trained by the same harness, behind the interfaces of our models.

* :class:`HFGPT2LM` (``model.kind: hf_gpt2``, task ``lm``): ``transformers.GPT2LMHeadModel``, randomly initialised
  at our width, depth, heads, FFN width and context, behind :class:`~primaldual.models.CausalLM`'s
  ``forward(ids, mask) -> logits (B, N, V)``.
* :class:`HFDecisionTransformer` (``model.kind: hf_dt``, task ``offline_rl``): ``transformers.
  DecisionTransformerModel``, randomly initialised, behind :class:`~primaldual.models.DecisionTransformer`'s
  ``forward(states, actions, returns_to_go, timesteps, mask) -> actions (B, K, act_dim)`` and ``get_action``.
* :func:`gpt2_lm`: the same GPT-2, untrained and set up for ``generate`` (the baseline of ``primaldual bench
  generate``).

Both take our mask convention: ``mask (B, N)`` bool, True = real token (step); it becomes Hugging Face's
``attention_mask`` (1 = keep). The models are Hugging Face's own, with their own defaults where ours differ
(initialisation, activation, attention dropout): ``docs/training.md`` and ``docs/offline_rl.md`` list the
differences. Every contact with transformers goes through :mod:`primaldual.integrations.hf.compat`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...models.decision_transformer import ReturnConditionedPolicy
from ...options import check_bool, check_int, check_number
from .compat import DecisionTransformerConfig, DecisionTransformerModel, GPT2Config, GPT2LMHeadModel

__all__ = ["HFDecisionTransformer", "HFGPT2LM", "gpt2_lm", "gpt2_parameter_count"]

# sdpa is transformers' default where torch has it; named, so that a changed default does not change a run
_ATTN_IMPLEMENTATION = "sdpa"


def _check_sizes(dim: int, depth: int, num_heads: int, ffn_dim: int | None, dropout: float) -> None:
    check_int("dim", dim, low=1)
    check_int("depth", depth, low=1)
    check_int("num_heads", num_heads, low=1)
    check_int("ffn_dim", ffn_dim, low=1, allow_none=True)
    check_number("dropout", dropout, low=0.0, high=1.0, high_open=True)
    if dim % num_heads:
        raise ValueError(f"num_heads: {num_heads} heads do not divide dim {dim}")


def _gpt2_config(
    vocab_size: int,
    max_len: int,
    dim: int,
    depth: int,
    num_heads: int,
    ffn_dim: int | None,
    dropout: float,
    tie_embeddings: bool = True,
    **extra,
):
    """The ``GPT2Config`` of our sizes (one mapping for the trained peer and the generation baseline)."""
    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=max_len,
        n_embd=dim,
        n_layer=depth,
        n_head=num_heads,
        n_inner=ffn_dim,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        tie_word_embeddings=tie_embeddings,
        attn_implementation=_ATTN_IMPLEMENTATION,
        **{"bos_token_id": None, "eos_token_id": None, "use_cache": False, **extra},
    )


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
    """A random ``transformers.GPT2LMHeadModel`` for generation: eval mode, dropout off, ``use_cache=True``.

    The shape of a :class:`~primaldual.models.CausalLM` of the same sizes (the baseline of ``primaldual bench
    generate``); the last id is the end-of-sequence and padding id (``generate`` needs one).

    Args:
        vocab_size: token ids. max_len: positions (``n_positions``). dim, depth, num_heads: ``n_embd``, ``n_layer``,
            ``n_head``. ffn_dim: feed-forward width (default ``4 * dim``, GPT-2's). seed: the initialisation's seed.
    """
    check_int("vocab_size", vocab_size, low=2)
    check_int("max_len", max_len, low=1)
    _check_sizes(dim, depth, num_heads, ffn_dim, 0.0)
    eos = vocab_size - 1
    config = _gpt2_config(
        vocab_size, max_len, dim, depth, num_heads, ffn_dim, 0.0, bos_token_id=eos, eos_token_id=eos,
        pad_token_id=eos, use_cache=True,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model.eval()


class HFGPT2LM(nn.Module):
    """``transformers.GPT2LMHeadModel`` (random init) as a :class:`~primaldual.models.CausalLM` peer.

    Sizes map one to one: ``dim -> n_embd``, ``depth -> n_layer``, ``num_heads -> n_head``, ``ffn_dim -> n_inner``,
    ``max_len -> n_positions``, ``vocab_size -> vocab_size``, ``dropout -> resid_pdrop, embd_pdrop, attn_pdrop``,
    ``tie_embeddings -> tie_word_embeddings``. The rest is GPT-2's: learned positions, pre-LN blocks with a final
    LayerNorm, ``gelu_new`` FFN, attention-weight dropout, normal(0, 0.02) init with the residual projections
    scaled by ``1 / sqrt(2 * depth)``.

    Args:
        vocab_size: number of token ids. max_len: positions (longest context).
        dim, depth, num_heads, ffn_dim, dropout: decoder sizes, as :class:`~primaldual.models.CausalLM`.
        tie_embeddings: the output layer shares the token embedding's weight (GPT-2 does).
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        dim: int = 512,
        depth: int = 6,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        dropout: float = 0.1,
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, low=1)
        check_int("max_len", max_len, low=1)
        _check_sizes(dim, depth, num_heads, ffn_dim, dropout)
        check_bool("tie_embeddings", tie_embeddings)
        self.vocab_size, self.max_len, self.dim = vocab_size, max_len, dim
        config = _gpt2_config(vocab_size, max_len, dim, depth, num_heads, ffn_dim, dropout, tie_embeddings)
        self.model = GPT2LMHeadModel(config)

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """ids ``(B, N)`` int64; mask ``(B, N)`` bool (True = real token). Returns logits ``(B, N, vocab_size)``.

        Positions are the rank among the real tokens (``cumsum(mask) - 1``), as :class:`~primaldual.models.CausalLM`
        numbers them, so a left-padded sequence gets the positions it would have alone.
        """
        if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32) or ids.dim() != 2:
            raise ValueError(f"ids must be an int64 tensor of shape (B, N), got {getattr(ids, 'dtype', type(ids))}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"ids must hold ids in [0, {self.vocab_size}), got [{int(ids.min())}, {int(ids.max())}]")
        B, N = ids.shape
        if mask is None:
            positions = torch.arange(N, device=ids.device).expand(B, N)  # (B, N)
            attention_mask = None
        else:
            if mask.dtype != torch.bool or mask.shape != ids.shape:
                raise ValueError(f"mask must be a torch.bool tensor of shape {tuple(ids.shape)} (True = real token)")
            positions = (mask.long().cumsum(1) - 1).clamp_min(0)  # (B, N): rank among the real tokens
            attention_mask = mask.long()  # (B, N): Hugging Face's 1 = keep
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(
                f"sequence needs position {int(positions.max())} but the model has max_len={self.max_len} positions"
            )
        out = self.model(input_ids=ids.long(), attention_mask=attention_mask, position_ids=positions, use_cache=False)
        return out.logits  # (B, N, vocab_size)


def gpt2_parameter_count(vocab_size: int, max_len: int, dim: int, depth: int, ffn_dim: int, tie: bool = True) -> int:
    """The parameters of a GPT-2 LM of these sizes, counted from its architecture (not from a built model):
    token and position tables, per block two LayerNorms, the fused QKV and output projections and the two FFN
    layers (all with biases), the final LayerNorm, and the output layer unless tied."""
    block = (
        2 * 2 * dim + (dim * 3 * dim + 3 * dim) + (dim * dim + dim) + (dim * ffn_dim + ffn_dim) + (ffn_dim * dim + dim)
    )
    return vocab_size * dim + max_len * dim + depth * block + 2 * dim + (0 if tie else vocab_size * dim)


class HFDecisionTransformer(ReturnConditionedPolicy):
    """``transformers.DecisionTransformerModel`` (random init) as a :class:`~primaldual.models.DecisionTransformer`
    peer.

    ``DecisionTransformerConfig(state_dim, act_dim, hidden_size=dim, n_layer=depth, n_head=num_heads,
    n_inner=ffn_dim, max_ep_len, action_tanh, resid / embd / attn_pdrop = dropout, n_positions=3 * context)``;
    its activation is the DT's ReLU (ours: GELU unless ``activation="relu"``). Its GPT-2 gets position id 0 for
    every token (the timestep embedding is the only position signal, as in ours), so a left-padded window
    predicts at its real steps what the unpadded one does. Its state and return heads are built (and counted) but
    not trained: the loss is on actions only. Attention is SDPA, or the model's eager attention where the installed
    transformers refuses SDPA for it (``attn_implementation`` records which).

    Args:
        state_dim, act_dim: observation and action sizes.
        max_ep_len: size of the timestep table (timesteps in ``[0, max_ep_len)``).
        context: K, the most timesteps a forward takes and the window :meth:`get_action` keeps.
        dim, depth, num_heads, ffn_dim, dropout: transformer sizes (``ffn_dim`` None: ``4 * dim``).
        action_tanh: squash predicted actions to ``(-1, 1)``.
    """

    def __init__(
        self,
        state_dim: int,
        act_dim: int,
        *,
        max_ep_len: int = 1000,
        context: int = 20,
        dim: int = 128,
        depth: int = 3,
        num_heads: int = 1,
        ffn_dim: int | None = None,
        dropout: float = 0.1,
        action_tanh: bool = True,
    ) -> None:
        super().__init__()
        check_int("state_dim", state_dim, low=1)
        check_int("act_dim", act_dim, low=1)
        check_int("max_ep_len", max_ep_len, low=1)
        check_int("context", context, low=1)
        _check_sizes(dim, depth, num_heads, ffn_dim, dropout)
        check_bool("action_tanh", action_tanh)
        self.state_dim, self.act_dim, self.dim = state_dim, act_dim, dim
        self.max_ep_len, self.context = max_ep_len, context
        kwargs = dict(
            state_dim=state_dim,
            act_dim=act_dim,
            hidden_size=dim,
            max_ep_len=max_ep_len,
            action_tanh=action_tanh,
            n_positions=3 * context,
            n_layer=depth,
            n_head=num_heads,
            n_inner=ffn_dim if ffn_dim is not None else 4 * dim,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            bos_token_id=None,
            eos_token_id=None,
            use_cache=False,
        )
        try:
            self.model = DecisionTransformerModel(
                DecisionTransformerConfig(**kwargs, attn_implementation=_ATTN_IMPLEMENTATION)
            )
            self.attn_implementation = _ATTN_IMPLEMENTATION
        except ValueError as e:
            # transformers releases before about 5.20 refuse SDPA for this model: their explicit matrix computes
            # the same attention (the name is kept, so a run records which one it used)
            if "scaled_dot_product_attention" not in str(e):
                raise
            self.model = DecisionTransformerModel(DecisionTransformerConfig(**kwargs, attn_implementation="eager"))
            self.attn_implementation = "eager"

    def _reference_weight(self) -> Tensor:
        return self.model.embed_state.weight

    def forward(
        self,
        states: Tensor,
        actions: Tensor,
        returns_to_go: Tensor,
        timesteps: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """Predicted actions ``(B, K, act_dim)`` from ``states (B, K, state_dim)``, ``actions (B, K, act_dim)``,
        ``returns_to_go (B, K, 1)`` or ``(B, K)``, ``timesteps (B, K)`` int64 and ``mask (B, K)`` bool (True = real
        step); entry t sees ``R_1..R_t, s_1..s_t, a_1..a_{t-1}``. Predictions at padded steps are meaningless."""
        rtg = self._check(states, actions, returns_to_go, timesteps, mask)
        dtype = self.model.embed_state.weight.dtype
        B, K = states.shape[:2]
        keep = torch.ones(B, K, dtype=torch.long, device=states.device) if mask is None else mask.long()  # (B, K)
        out = self.model(
            states=states.to(dtype),
            actions=actions.to(dtype),
            returns_to_go=rtg.to(dtype),
            timesteps=timesteps.long(),
            attention_mask=keep,
            return_dict=True,
        )
        return out.action_preds  # (B, K, act_dim)
