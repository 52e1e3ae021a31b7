"""The Decision Transformer (Chen et al., NeurIPS 2021) on the shared causal :class:`~primaldual.Encoder`.

A trajectory window of K timesteps becomes 3K tokens ``(R_1, s_1, a_1, R_2, s_2, a_2, ...)``: the return-to-go,
state and action of each step through their own linear embedding, plus a learned embedding of the step's
timestep (its index in the episode) added to all three; then a LayerNorm and dropout on the embeddings, causal
pre-LN blocks of the shared encoder (with a final norm), and the action of step t predicted from the output at
the state token ``s_t`` through ``Linear -> tanh``. The state token sees ``R_1..R_t``, ``s_1..s_t`` and
``a_1..a_{t-1}``, never ``a_t`` or anything later. There is no positional embedding beyond the timestep
embedding (as in the DT code, whose GPT-2 position table is unused), so a left-padded window gives at its real
steps exactly the predictions of the unpadded one.

Two choices follow the peers rather than one fixed recipe. ``init="pytorch"`` keeps PyTorch's default
initialisation of every module (the DT code's embeddings and heads); ``init="gpt2"`` draws every linear and
embedding weight from N(0, 0.02) with zero biases, and the two residual output projections of each block (the
attention's ``proj`` and the FFN's second linear) from N(0, 0.02 / sqrt(2 depth)), as Hugging Face's
``DecisionTransformerModel`` does. ``activation`` is the FFN's (``"gelu"``; the DT's GPT-2 uses ``"relu"``) and
``attn_drop`` the dropout on attention weights (GPT-2's ``attn_pdrop``); ``ffn_drop`` the dropout on the FFN's
hidden units (None: ``dropout``; GPT-2 has none there). With ``init="gpt2", activation="relu", attn_drop=dropout,
ffn_drop=0`` the model is Hugging Face's, weight for weight (tested by copying its weights across).

The attention of each layer is a registry name, so the Decision Transformer (``"softmax"``) and Primal.+DT
(``["softmax"] * (depth - 1) + ["primal"]``, the last layer causal Primal-Attention with its KSVD term) are
configurations::

    DecisionTransformer(11, 3, dim=256, depth=3, num_heads=4,
                        **primal_plus(3, s=64, eta=0.05, ksvd_reduction="sample"))

The KSVD term is then ``primaldual.collect_aux_loss(model)`` after each training forward.

Inputs: ``states (B, K, state_dim)`` (normalised), ``actions (B, K, act_dim)``, ``returns_to_go (B, K, 1)`` or
``(B, K)`` (scaled), ``timesteps (B, K)`` int64 in ``[0, max_ep_len)``, ``mask (B, K)`` bool, True = real step
(padding on the left, as :class:`~primaldual.data.d4rl.TrajectoryDataset` and :meth:`get_action` pad).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..encoder import Encoder
from ..options import check_bool, check_choice, check_int, check_number
from .init import INITS, gpt2_init_

__all__ = ["INITS", "DecisionTransformer", "ReturnConditionedPolicy"]


class ReturnConditionedPolicy(nn.Module):
    """What every Decision Transformer here shares (ours and the Hugging Face peer): the input checks of
    ``forward`` and :meth:`get_action` for rollouts. A subclass sets ``state_dim``, ``act_dim``, ``context`` and
    ``max_ep_len``, implements ``forward(states, actions, returns_to_go, timesteps, mask)`` and names the weight whose
    device and dtype inputs are moved to (:meth:`_reference_weight`)."""

    state_dim: int
    act_dim: int
    context: int
    max_ep_len: int

    def _reference_weight(self) -> Tensor:
        raise NotImplementedError

    def _check(self, states: Tensor, actions: Tensor, rtg: Tensor, timesteps: Tensor, mask: Tensor | None) -> Tensor:
        """Validate the inputs; returns ``returns_to_go`` as ``(B, K, 1)``."""
        if not isinstance(states, Tensor) or states.dim() != 3 or states.shape[-1] != self.state_dim:
            raise ValueError(
                f"states must have shape (B, K, {self.state_dim}), got {tuple(getattr(states, 'shape', ()))}"
            )
        nb, nk = states.shape[:2]
        if nk > self.context:
            raise ValueError(f"got {nk} timesteps but the model's context is {self.context}")
        if actions.shape != (nb, nk, self.act_dim):
            raise ValueError(f"actions must have shape {(nb, nk, self.act_dim)}, got {tuple(actions.shape)}")
        if rtg.dim() == 2:
            rtg = rtg[..., None]
        if rtg.shape != (nb, nk, 1):
            raise ValueError(f"returns_to_go must have shape {(nb, nk, 1)} or {(nb, nk)}, got {tuple(rtg.shape)}")
        if timesteps.shape != (nb, nk) or timesteps.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"timesteps must be an int64 tensor of shape {(nb, nk)}, got {timesteps.dtype} {tuple(timesteps.shape)}"
            )
        if timesteps.numel() and (int(timesteps.min()) < 0 or int(timesteps.max()) >= self.max_ep_len):
            raise ValueError(
                f"timesteps must be in [0, {self.max_ep_len}) (max_ep_len), got "
                f"[{int(timesteps.min())}, {int(timesteps.max())}]"
            )
        if mask is not None and (mask.dtype != torch.bool or mask.shape != (nb, nk)):
            raise ValueError(f"mask must be a torch.bool tensor of shape {(nb, nk)} (True = real step)")
        return rtg

    @torch.no_grad()
    def get_action(self, states: Tensor, actions: Tensor, returns_to_go: Tensor, timesteps: Tensor) -> Tensor:
        """The action for the latest step of one or a batch of histories (for rollouts).

        Args:
            states: ``(T, state_dim)`` or ``(B, T, state_dim)`` normalised states up to the current one.
            actions: ``(T, act_dim)`` / ``(B, T, act_dim)``; the last entry (the action to choose) is a placeholder.
            returns_to_go: ``(T,)``, ``(T, 1)``, ``(B, T)`` or ``(B, T, 1)``, scaled.
            timesteps: ``(T,)`` / ``(B, T)`` int64.

        Returns:
            ``(act_dim,)`` or ``(B, act_dim)``: the prediction at the last step, from the last ``context`` steps,
            left-padded to ``context`` (padded steps masked out). Runs in the model's current mode: call
            ``eval()`` first for deterministic actions (:func:`~primaldual.rl.evaluate_policy` does).
        """
        single = states.dim() == 2
        if single:
            states, actions, timesteps = states[None], actions[None], timesteps[None]
            returns_to_go = returns_to_go[None]
        if returns_to_go.dim() == 2:
            returns_to_go = returns_to_go[..., None]
        K = self.context
        states, actions, returns_to_go, timesteps = (x[:, -K:] for x in (states, actions, returns_to_go, timesteps))
        B, T = states.shape[:2]
        pad = K - T
        ref = self._reference_weight()
        mask = torch.ones(B, K, dtype=torch.bool, device=ref.device)
        if pad > 0:
            mask[:, :pad] = False

            def left(x: Tensor) -> Tensor:
                return torch.cat([x.new_zeros((B, pad, *x.shape[2:])), x], 1)

            states, actions, returns_to_go, timesteps = (left(x) for x in (states, actions, returns_to_go, timesteps))
        pred = self(
            states.to(ref.device, ref.dtype),
            actions.to(ref.device, ref.dtype),
            returns_to_go.to(ref.device, ref.dtype),
            timesteps.to(ref.device).long(),
            mask,
        )[:, -1]
        return pred[0] if single else pred


class DecisionTransformer(ReturnConditionedPolicy):
    """Return-conditioned policy over (return-to-go, state, action) token triples.

    Args:
        state_dim, act_dim: observation and action sizes.
        max_ep_len: size of the timestep embedding table (timesteps are in ``[0, max_ep_len)``).
        context: K, the most timesteps a forward takes and the window :meth:`get_action` keeps.
        dim, depth, num_heads, ffn_dim, dropout: transformer sizes (``ffn_dim`` default ``4 * dim``); dropout acts
            on the embeddings, after attention and in the feed-forward.
        attention, attention_options: per-layer registry names / options, as :class:`~primaldual.Encoder`
            (every layer must support ``causal=True``); or pass a plan: ``**primal_plus(depth, s=..., eta=0.05,
            ksvd_reduction="sample")``.
        action_tanh: squash predicted actions to ``(-1, 1)`` (the MuJoCo action range), as the DT does.
        activation: the FFN's, ``"gelu"`` or ``"relu"``. attn_drop: dropout on the attention weights (softmax
            layers; a primal layer has no attention matrix and refuses it). ffn_drop: dropout on the FFN's hidden
            units (None: ``dropout``).
        init: ``"gpt2"`` (N(0, 0.02), residual projections scaled by ``1 / sqrt(2 depth)``, zero biases; a primal
            layer's own projection matrices keep their initialisation) or ``"pytorch"`` (each module's default).
            GPT-2's is the default: on hopper-medium it fits the actions better (docs/results.md, "A peer").
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
        attention: str | Sequence[str] = "softmax",
        attention_options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        action_tanh: bool = True,
        activation: str = "gelu",
        attn_drop: float = 0.0,
        ffn_drop: float | None = None,
        init: str = "gpt2",
    ) -> None:
        super().__init__()
        check_int("state_dim", state_dim, low=1)
        check_int("act_dim", act_dim, low=1)
        check_int("max_ep_len", max_ep_len, low=1)
        check_int("context", context, low=1)
        check_int("dim", dim, low=1)
        check_int("ffn_dim", ffn_dim, low=1, allow_none=True)
        check_number("dropout", dropout, low=0.0, high=1.0, high_open=True)
        check_bool("action_tanh", action_tanh)
        check_number("attn_drop", attn_drop, low=0.0, high=1.0, high_open=True)
        check_choice("init", init, INITS)
        self.state_dim, self.act_dim, self.dim = state_dim, act_dim, dim
        self.max_ep_len, self.context = max_ep_len, context
        self.embed_timestep = nn.Embedding(max_ep_len, dim)
        self.embed_return = nn.Linear(1, dim)
        self.embed_state = nn.Linear(state_dim, dim)
        self.embed_action = nn.Linear(act_dim, dim)
        self.embed_ln = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)
        self.encoder = Encoder(
            dim,
            depth,
            num_heads,
            attention,
            attention_options,
            ffn_dim=ffn_dim or 4 * dim,
            dropout=dropout,
            attn_drop=attn_drop,
            causal=True,
            activation=activation,
            ffn_drop=ffn_drop,
        )
        self.predict_action = nn.Sequential(nn.Linear(dim, act_dim), nn.Tanh() if action_tanh else nn.Identity())
        self.init = init
        if init == "gpt2":
            self._init_gpt2(depth)

    def _init_gpt2(self, depth: int) -> None:
        """GPT-2's initialisation (:func:`~primaldual.models.init.gpt2_init_`)."""
        gpt2_init_(self, self.encoder.blocks, depth)

    @property
    def attention_names(self) -> list[str]:
        return self.encoder.attention_names

    def _reference_weight(self) -> Tensor:
        return self.embed_state.weight

    def forward(
        self,
        states: Tensor,
        actions: Tensor,
        returns_to_go: Tensor,
        timesteps: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """Predicted actions ``(B, K, act_dim)``; entry t is predicted from ``R_1..R_t, s_1..s_t, a_1..a_{t-1}``.

        Predictions at padded steps (mask False) are meaningless and must be left out of the loss.
        """
        rtg = self._check(states, actions, returns_to_go, timesteps, mask)
        B, K = states.shape[:2]
        dtype = self.embed_state.weight.dtype
        time = self.embed_timestep(timesteps.long())  # (B, K, dim)
        tokens = torch.stack(
            (
                self.embed_return(rtg.to(dtype)) + time,
                self.embed_state(states.to(dtype)) + time,
                self.embed_action(actions.to(dtype)) + time,
            ),
            dim=2,
        ).reshape(B, 3 * K, self.dim)  # (R_1, s_1, a_1, R_2, ...)
        tokens = self.drop(self.embed_ln(tokens))
        token_mask = None if mask is None else mask.repeat_interleave(3, dim=1)  # (B, 3K)
        # only the state tokens s_t (positions 1, 4, 7, ...) are read: the last block's FFN skips the other two thirds
        h = self.encoder(tokens, token_mask, positions=slice(1, None, 3))  # (B, K, dim)
        return self.predict_action(h)
