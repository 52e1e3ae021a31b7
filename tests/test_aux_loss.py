"""The auxiliary-loss contract: every call contributes, collection averages and clears, nothing is counted twice."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import primaldual as pd
from primaldual.aux_loss import aux_loss_terms, clear_aux_loss
from primaldual.models import RetrievalClassifier
from tests.conftest import rel_err

DIM, HEADS, N = 16, 2, 11
PRIMAL = {"s": 3, "rank_multi": 2, "eta": 0.3}


def _tokens(seed: int, b: int = 3, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 20, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[-1, n - 3 :] = False
    return tokens.masked_fill(~mask, 0), mask


def test_every_call_contributes_and_collect_averages_them():
    torch.manual_seed(0)
    layer = pd.build_attention("primal", DIM, HEADS, **PRIMAL)
    x1, x2 = torch.randn(2, N, DIM), torch.randn(2, N, DIM)
    layer(x1)
    layer(x2)
    t1, t2 = layer.peek_aux_losses()
    assert not torch.equal(t1, t2)
    assert torch.allclose(pd.collect_aux_loss(layer), 0.3 * (t1 + t2) / 2)
    assert pd.collect_aux_loss(layer) is None  # cleared


def test_siamese_retrieval_model_keeps_both_towers_terms():
    """The LRA two-tower model encodes both documents with one shared encoder: both KSVD terms count."""
    torch.manual_seed(0)
    model = RetrievalClassifier(
        20,
        N,
        dim=DIM,
        depth=2,
        num_heads=HEADS,
        ffn_dim=32,
        attention=["softmax", "primal"],
        attention_options=[None, PRIMAL],
    ).double()
    model.eval()  # no dropout, so each tower's forward is reproducible; gradients stay on
    (a, ma), (b, mb) = _tokens(1), _tokens(2)
    model(a, b, ma, mb)
    (term_ab,) = aux_loss_terms(model, clear=False)["ksvd"][:1]
    assert len(aux_loss_terms(model, clear=False)["ksvd"]) == 2  # one per tower
    both = pd.collect_aux_loss(model)
    model.encoder(a, ma)
    tower_a = pd.collect_aux_loss(model)
    model.encoder(b, mb)
    tower_b = pd.collect_aux_loss(model)
    assert term_ab[0] == "encoder.encoder.blocks.1.attn"
    assert rel_err(both, (tower_a + tower_b) / 2) < 1e-14
    assert rel_err(tower_a, tower_b) > 1e-6  # the towers' terms differ, so dropping one would show


def test_no_grad_records_nothing_eval_mode_records():
    torch.manual_seed(0)
    enc = pd.Encoder(DIM, 2, HEADS, attention="primal", attention_options=PRIMAL)
    x = torch.randn(2, N, DIM)
    with torch.no_grad():
        enc(x)
    with torch.inference_mode():
        enc(x)
    assert pd.collect_aux_loss(enc) is None
    enc.eval()
    enc(x)
    assert len(aux_loss_terms(enc)["ksvd"]) == 2
    enc(x)
    clear_aux_loss(enc)
    assert pd.collect_aux_loss(enc) is None


@pytest.mark.parametrize("attention", [["primal", "primal"], ["softmax", "primal"]])
def test_activation_checkpointing_counts_each_term_once(attention):
    """Non-reentrant checkpointing recomputes forwards inside backward; those recomputations record nothing."""
    torch.manual_seed(0)
    options = [PRIMAL if a == "primal" else None for a in attention]
    enc = pd.Encoder(DIM, 2, HEADS, attention=attention, attention_options=options, dropout=0.0).double()
    x = torch.randn(2, N, DIM, dtype=torch.float64)

    def run(ckpt: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h = x
        for block in enc.blocks:
            h = checkpoint(block, h, use_reentrant=False) if ckpt else block(h)
        aux = pd.collect_aux_loss(enc)
        loss = h.square().mean() + aux
        grads = torch.autograd.grad(loss, list(enc.parameters()), allow_unused=True)
        assert aux_loss_terms(enc) == {}  # backward (and its recomputation) left no term behind
        return aux.detach(), [g for g in grads if g is not None]

    aux_plain, g_plain = run(False)
    aux_ckpt, g_ckpt = run(True)
    assert rel_err(aux_ckpt, aux_plain) < 1e-14
    for a, b in zip(g_ckpt, g_plain):
        assert rel_err(a, b) < 1e-12


@pytest.mark.slow
def test_full_graph_compile_matches_eager_with_aux_loss():
    """An Encoder with primal and Attention-BN layers compiles with fullgraph=True, aux loss included."""
    torch.manual_seed(0)
    enc = pd.Encoder(
        DIM,
        3,
        HEADS,
        attention=["softmax_bn", "primal", "primal"],
        attention_options=[None, PRIMAL, PRIMAL],
        dropout=0.0,
    )
    x = torch.randn(3, N, DIM)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, 7:] = False

    def step(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        out = model(x, mask)
        aux = pd.collect_aux_loss(enc)
        grads = torch.autograd.grad(out.square().mean() + aux, list(enc.parameters()))
        return out.detach(), aux.detach(), list(grads)

    out_e, aux_e, g_e = step(enc)
    compiled = torch.compile(enc, fullgraph=True, dynamic=False)
    for _ in range(2):  # the second call runs the cached graph
        out_c, aux_c, g_c = step(compiled)
        assert rel_err(out_c, out_e) < 1e-5
        assert rel_err(aux_c, aux_e) < 1e-5
        # float32: compare all gradients as one vector (some, e.g. key biases under BN, are ~0 by symmetry)
        assert rel_err(torch.cat([g.flatten() for g in g_c]), torch.cat([g.flatten() for g in g_e])) < 1e-5


def test_even_positions_match_linspace_without_host_sync():
    """The token sampling reproduces torch.linspace's integer rounding on the device, for mixed lengths."""
    from primaldual.functional.primal import even_positions

    g = torch.Generator().manual_seed(0)
    lengths = torch.cat([torch.tensor([0, 1, 2, 3]), torch.randint(1, 5000, (200,), generator=g)])
    for n in (1, 2, 7, 150, 151, 400):
        got = even_positions(lengths, n)
        for row, length in zip(got, lengths.tolist()):
            ref = torch.linspace(0, max(length - 1, 0), n, dtype=torch.long)
            assert torch.equal(row, ref), (length, n)
    assert torch.equal(even_positions(torch.tensor([3]), 151)[0], torch.linspace(0, 2, 151, dtype=torch.long))


@pytest.mark.parametrize("name,opts", [("softmax", {"attn_drop": 0.1}), ("softmax_bn", {}), ("linear", {})])
def test_layers_trace_with_symbolic_sizes_in_training_mode(name, opts):
    """``dynamic=True`` turns the per-call float options (a dropout probability, a BN epsilon) symbolic: the checks
    that read their values stay in the eager calls, and the graph traces whole (``backend="eager"``: tracing only)."""
    torch._dynamo.reset()
    layer = pd.build_attention(name, 12, 3, **opts).train()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="eager")
    for n in (9, 17):
        compiled(torch.randn(2, n, 12)).sum().backward()
