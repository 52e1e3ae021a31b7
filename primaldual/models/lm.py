"""Decoder-only language model on the shared encoder, with incremental generation.

``CausalLM`` is token embedding + positions -> causal pre-LN blocks of :class:`~primaldual.Encoder` (final norm)
-> output layer tied to the embedding. The attention of each layer is a registry name, so Transformer
(``"softmax"``), Primal.+Trans. (``["softmax"] * 5 + ["primal"]``, the last layer causal primal), PrimalFormer (all
``"primal"``), linear, causal Attention-BN and Attention-SH language models are configurations.

Padding: ``mask`` ``(B, N)`` bool, True = real token. Positions count real tokens only (``cumsum(mask) - 1``), so a
left-padded prompt gets the positions it would have alone. :meth:`CausalLM.generate` left-aligns prompts of
different lengths, runs them in one forward (:meth:`CausalLM.prefill`, which also returns each layer's decoding
state) and then decodes one token at a time through those states (a KV cache for softmax, a constant-size state
for primal and linear; see ``Capabilities.decoding``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..encoder import Encoder
from ..options import check_bool, check_choice, check_int, check_number
from .graphed import GraphedStep, check_graphable
from .init import INITS, gpt2_init_

__all__ = ["GREEDY_BELOW", "CausalLM", "LMState", "sinusoidal_table"]


class LMState(NamedTuple):
    """Decoding state of a :class:`CausalLM`.

    Attributes:
        layers: one decoding state per block (see each attention's ``init_state``).
        count: ``(B,)`` int64 real tokens seen per sequence (the next real token's position).
    """

    layers: list[Any]
    count: Tensor


class CausalLM(nn.Module):
    """Decoder-only language model; the attention of each layer by registry name (all must support causal).

    Args:
        vocab_size: number of token ids.
        max_len: longest context (positions table size for ``positions="learned"``).
        dim, depth, num_heads, ffn_dim, dropout: decoder sizes.
        attention, attention_options: per-layer registry names / options, as :class:`~primaldual.Encoder`.
        positions: ``"learned"`` (a ``(max_len, dim)`` table) or ``"sinusoidal"`` (fixed; still capped at max_len).
        tie_embeddings: output layer shares the token embedding's weight (the reference LM does).
        init: ``"pytorch"`` (the token embedding N(0, 1 / dim), each other module its default) or ``"gpt2"``
            (GPT-2's, :func:`~primaldual.models.init.gpt2_init_`; the embedding is still scaled by sqrt(dim)).
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
        attention: str | Sequence[str] = "softmax",
        attention_options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        positions: Literal["learned", "sinusoidal"] = "learned",
        tie_embeddings: bool = True,
        init: Literal["pytorch", "gpt2"] = "pytorch",
    ) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, low=1)
        check_choice("init", init, INITS)
        check_int("max_len", max_len, low=1)
        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"positions must be 'learned' or 'sinusoidal', got {positions!r}")
        self.vocab_size, self.max_len, self.dim = vocab_size, max_len, dim
        self.embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embed.weight, std=dim**-0.5)
        self.positions = positions
        if positions == "learned":
            self.pos = nn.Parameter(torch.zeros(max_len, dim))
            nn.init.trunc_normal_(self.pos, std=0.02)
        else:
            self.register_buffer("pos", sinusoidal_table(max_len, dim), persistent=False)
        self.drop = nn.Dropout(dropout)
        self.decoder = Encoder(
            dim, depth, num_heads, attention, attention_options, ffn_dim=ffn_dim, dropout=dropout, causal=True
        )
        self.head = None if tie_embeddings else nn.Linear(dim, vocab_size, bias=False)
        self.init = init
        if init == "gpt2":
            gpt2_init_(self, self.decoder.blocks, depth)

    # ------------------------------------------------------------------------------------------------
    def _embed(self, ids: Tensor, positions: Tensor, check: bool = True) -> Tensor:
        if check and positions.numel() and int(positions.max()) >= self.max_len:  # one check per call, at entry
            raise ValueError(
                f"sequence needs position {int(positions.max())} but the model has max_len={self.max_len} positions"
            )
        return self.drop(self.embed(ids) * math.sqrt(self.dim) + self.pos[positions])

    def _logits(self, h: Tensor) -> Tensor:
        return F.linear(h, self.embed.weight) if self.head is None else self.head(h)

    def _check_ids(self, ids: Tensor, name: str = "ids") -> None:
        if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be an int64 tensor of token ids, got {getattr(ids, 'dtype', type(ids))}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(
                f"{name} must hold ids in [0, {self.vocab_size}), got [{int(ids.min())}, {int(ids.max())}]"
            )

    def _positions(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        """Checks ``ids`` ``(B, N)`` and ``mask``; the ``(B, N)`` position of each token (its rank among the real ones)."""
        self._check_ids(ids)
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (B, N), got {tuple(ids.shape)}")
        B, N = ids.shape
        if mask is None:
            return torch.arange(N, device=ids.device).expand(B, N)  # (B, N)
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != ids.shape:
            got = f"{mask.dtype}, {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(
                f"mask must be a torch.bool tensor of shape {tuple(ids.shape)} (True = real token), got {got}"
            )
        return (mask.long().cumsum(1) - 1).clamp_min(0)  # (B, N): rank among the real tokens

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """ids ``(B, N)`` int64; mask ``(B, N)`` bool (True = real token). Returns logits ``(B, N, vocab_size)``."""
        positions = self._positions(ids, mask)
        h = self.decoder(self._embed(ids, positions), mask)  # (B, N, dim)
        return self._logits(h)

    def prefill(self, ids: Tensor, mask: Tensor | None = None, *, last_only: bool = False) -> tuple[Tensor, LMState]:
        """Run the prompts in one forward and return the decoding state after them (every layer causal).

        Args:
            ids: ``(B, N)`` int64 prompts; mask: ``(B, N)`` bool (True = real token, None: no padding). Padding may
                sit anywhere; every prompt needs one real token.
            last_only: return only the next-token logits ``(B, vocab_size)``, those at each prompt's last real
                token (what generation needs: the ``(B, N, vocab_size)`` logits of a long prompt are large).

        Returns:
            ``(logits, state)``: logits ``(B, N, vocab_size)`` equal to :meth:`forward`'s (``(B, vocab_size)`` with
            ``last_only``), and the state that ``N`` calls of :meth:`step` from :meth:`init_state` leave, for
            :meth:`step` to continue.
        """
        check_bool("last_only", last_only)
        positions = self._positions(ids, mask)
        B, N = ids.shape
        if mask is not None and not bool(mask.any(1).all()):
            raise ValueError("every prompt needs at least one real token (a row of mask is all False)")
        h, layers = self.decoder.prefill(self._embed(ids, positions), mask)  # (B, N, dim)
        count = ids.new_full((B,), N, dtype=torch.long) if mask is None else mask.sum(1)  # (B,)
        if last_only:
            steps = torch.arange(N, device=ids.device)
            last = steps[-1:].expand(B) if mask is None else (mask * steps).amax(1)  # (B,) last real position
            h = h[torch.arange(B, device=ids.device), last]  # (B, dim)
        return self._logits(h), LMState(layers, count)

    # ------------------------------------------------------------------------------------------------
    def init_state(self, batch: int) -> LMState:
        """An empty decoding state for ``batch`` sequences."""
        ref = self.embed.weight
        layers = self.decoder.init_state(batch, device=ref.device)  # each layer its dtype (float32 sums for half)
        return LMState(layers, torch.zeros(batch, dtype=torch.long, device=ref.device))

    def step(self, ids_t: Tensor, state: LMState, mask_t: Tensor | None = None) -> tuple[Tensor, LMState]:
        """Decode one token per sequence: ``ids_t`` ``(B,)``; returns logits ``(B, vocab_size)`` and the new state,
        equal to :meth:`forward`'s logits at that position."""
        self._check_ids(ids_t, "ids_t")
        B = ids_t.shape[0]
        real = torch.ones(B, dtype=torch.bool, device=ids_t.device) if mask_t is None else mask_t
        return self._advance(ids_t, state, real, check=True)

    def unchecked_step(self, ids_t: Tensor, state: LMState, real: Tensor) -> tuple[Tensor, LMState]:
        """:meth:`step` without its checks of the ids and positions (``real`` ``(B,)`` bool, required): no value
        leaves the device, so a CUDA graph can capture it (``primaldual bench decode --cuda-graph``). The caller
        vouches for the ids (e.g. the model's own argmax) and for positions below ``max_len``."""
        return self._advance(ids_t, state, real, check=False)

    def _advance(self, ids_t: Tensor, state: LMState, real: Tensor, check: bool) -> tuple[Tensor, LMState]:
        positions = (state.count + real.long() - 1).clamp_min(0)  # (B,) as cumsum(mask) - 1 in forward
        h, layers = self.decoder.step(self._embed(ids_t, positions, check), state.layers, real)
        return self._logits(h), LMState(layers, state.count + real.long())

    @torch.no_grad()
    def generate(
        self,
        ids: Tensor,
        mask: Tensor | None = None,
        max_new_tokens: int = 32,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        eos_id: int | None = None,
        seed: int | None = None,
        cuda_graph: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Continue each prompt by up to ``max_new_tokens`` tokens (eval mode, no gradients).

        Args:
            ids: ``(B, N)`` prompts; mask: ``(B, N)`` bool (True = real token; prompts of different lengths may be
                padded on either side; they are left-aligned first). Every prompt needs one real token.
            temperature: 0 is greedy (argmax); otherwise sample from ``softmax(logits / temperature)``. Below
                :data:`GREEDY_BELOW` (about 1.2e-38, float32's smallest normal number) it is greedy too.
            top_k: sample among the ``top_k`` most likely tokens only.
            eos_id: a sequence that produced it stops (later positions are padding, mask False, id ``eos_id``).
            seed: seeds a private generator (sampling does not touch the global RNG).
            cuda_graph: replay each decoding step from a CUDA graph (:class:`~primaldual.models.graphed.GraphedStep`,
                captured once after the prompt): one launch per token instead of tens per layer, the same tokens.
                Needs a CUDA device and a constant-size state in every layer (primal, linear); otherwise a
                ValueError.

        Returns:
            ``(ids, mask)`` of shape ``(B, N + max_new_tokens)``, prompts left-padded.
        """
        self._check_ids(ids)
        check_int("max_new_tokens", max_new_tokens, low=0)
        check_number("temperature", temperature, low=0.0)
        check_int("top_k", top_k, low=1, allow_none=True)
        check_int("eos_id", eos_id, low=0, high=self.vocab_size - 1, allow_none=True)
        check_int("seed", seed, low=0, high=2**64 - 1, allow_none=True)  # what torch.Generator takes
        check_bool("cuda_graph", cuda_graph)
        if cuda_graph:
            check_graphable(self, ids.device)
        B, N = ids.shape
        mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask
        if mask.dtype != torch.bool or mask.shape != ids.shape:
            raise ValueError(f"mask must be a torch.bool tensor of shape {tuple(ids.shape)} (True = real token)")
        if B == 0:  # no prompts: no continuations
            return ids.new_zeros(0, N + max_new_tokens), mask.new_zeros(0, N + max_new_tokens)
        if not bool(mask.any(1).all()):
            raise ValueError("every prompt needs at least one real token (a row of mask is all False)")
        if int(mask.sum(1).max()) + max_new_tokens > self.max_len:
            raise ValueError(
                f"prompt length + max_new_tokens = {int(mask.sum(1).max()) + max_new_tokens} exceeds the model's "
                f"max_len={self.max_len} positions"
            )
        order = torch.sort(mask.int(), dim=1, stable=True).indices  # (B, N): pads first, then the prompt in order
        ids, mask = ids.gather(1, order), mask.gather(1, order)
        gen = None if seed is None else torch.Generator(device=ids.device).manual_seed(seed)
        was_training = self.training
        self.eval()
        try:
            logits, state = self.prefill(ids, mask, last_only=True)  # (B, V): the prompts in one forward
            # the last token's step is never sampled from: a single new token needs no graph
            graphed = GraphedStep(self, state) if cuda_graph and max_new_tokens > 1 else None
            out_ids, out_mask = [ids], [mask]
            alive = torch.ones(B, dtype=torch.bool, device=ids.device)
            for _ in range(max_new_tokens):
                nxt = _sample(logits, temperature, top_k, gen)  # (B,)
                if eos_id is not None:
                    nxt = torch.where(alive, nxt, torch.full_like(nxt, eos_id))
                out_ids.append(nxt[:, None])
                out_mask.append(alive[:, None].clone())
                if graphed is not None:
                    logits = graphed(nxt, alive)  # the graph's buffer: read by _sample before the next replay
                else:
                    logits, state = self.step(nxt, state, alive)
                if eos_id is not None:
                    alive = alive & (nxt != eos_id)
        finally:
            self.train(was_training)
        return torch.cat(out_ids, 1), torch.cat(out_mask, 1)


#: temperatures below this (float32's smallest normal number, about 1.2e-38) sample greedily: the division by them
#: leaves float32 (1e-50 is 0 there, and 0 / 0 is NaN), and the sample they stand for is the argmax anyway
GREEDY_BELOW = float(torch.finfo(torch.float32).tiny)


def _sample(logits: Tensor, temperature: float, top_k: int | None, gen: torch.Generator | None) -> Tensor:
    """Next token per row from ``logits`` ``(B, V)``: argmax at temperature 0 (and below :data:`GREEDY_BELOW`), else a
    (top-k) softmax sample. Non-finite logits (a model with NaN weights) are an error, greedy decoding included."""
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(
            "generate: the model's next-token logits hold NaN or Inf; its weights or inputs are not finite"
        )
    if temperature < GREEDY_BELOW:
        return logits.argmax(-1)
    # max subtracted first: a tiny temperature scales to -inf / 0, not inf - inf (the sample tends to the argmax)
    logits = logits.float()
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]


def sinusoidal_table(n: int, dim: int) -> Tensor:
    """The fixed ``(n, dim)`` sin / cos table of Vaswani et al."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]  # (n, 1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))  # (dim/2,)
    table = torch.zeros(n, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table
