"""Converting a model built on ``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` (``convert_torch``): what the
hooks read is the teacher's own attention (layouts, norms, padding, causal masks, the fused fast path), the teacher
initialisation and stage 1, a resumed stage 1, and what is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from primaldual import collect_aux_loss
from primaldual.attention.primal import PrimalAttention
from primaldual.convert import layer_losses
from primaldual.convert.torch_nn import _reader, convert_torch, find_attention, torch_attention_io


class Net(nn.Module):
    """A user's classifier or causal LM on ``nn.TransformerEncoder``: ``(B, N, F)`` features -> ``(B, N, 3)``."""

    def __init__(self, *, batch_first: bool = True, norm_first: bool = False, causal: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(5, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=batch_first, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=batch_first and not norm_first)
        self.head = nn.Linear(32, 3)
        self.batch_first, self.causal = batch_first, causal

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(x)
        h = h if self.batch_first else h.transpose(0, 1)  # (B, N, C) -> (N, B, C)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=x.dtype) if self.causal else None
        h = self.encoder(h, mask=mask, src_key_padding_mask=padding, is_causal=self.causal)
        h = h if self.batch_first else h.transpose(0, 1)  # (N, B, C) -> (B, N, C)
        return self.head(h)


def _net(seed: int = 0, **kw) -> Net:
    torch.manual_seed(seed)
    return Net(**kw).double().eval()


def _batch(seed: int, padding: str | None = "bool", B: int = 4) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, 10, 5, generator=g, dtype=torch.float64)
    if padding is None:
        return (x,)
    pad = torch.zeros(B, 10, dtype=torch.bool)
    pad[0, 7:] = pad[2, 4:] = True  # True = padding, PyTorch's convention
    return x, pad if padding == "bool" else torch.zeros(4, 10, dtype=torch.float64).masked_fill(pad, float("-inf"))


@pytest.mark.parametrize("padding", [None, "bool", "float"])
@pytest.mark.parametrize(("batch_first", "norm_first"), [(True, False), (False, True), (True, True)])
def test_the_recorded_attention_is_the_teachers_own(batch_first, norm_first, padding):
    """x and y read by the hooks, with the key mask each layer got: the teacher's layer rebuilt as a primaldual
    softmax layer maps x to y. An eval-mode encoder with its nested-tensor fast path on still calls the hooks."""
    teacher = _net(batch_first=batch_first, norm_first=norm_first)
    batch = _batch(1, padding)
    io = torch_attention_io(teacher, batch, [0, 1])
    reader = _reader("encoder", False)
    for i, (x, y, key, causal) in enumerate(io):
        assert x.shape == y.shape == (4, 10, 32) and causal is False
        assert (key is None) == (padding is None)
        if key is not None:
            assert key.dtype == torch.bool and int(key.sum()) == 40 - 3 - 6
        torch.testing.assert_close(reader.teacher_layer(teacher, i)(x, key), y)
    assert torch.backends.mha.get_fastpath_enabled() and not teacher.training  # both restored


def test_a_causal_lm_and_a_decoders_self_attention_are_read_causal():
    lm = _net(causal=True)
    ((x, y, key, causal),) = torch_attention_io(lm, _batch(2, None), [1])
    assert causal and key is None
    torch.testing.assert_close(_reader("encoder", True).teacher_layer(lm, 1)(x), y)

    torch.manual_seed(0)
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(32, 4, 64, batch_first=True), 2).double().eval()
    tgt, memory = torch.randn(2, 6, 32, dtype=torch.float64), torch.randn(2, 9, 32, dtype=torch.float64)
    batch = {"tgt": tgt, "memory": memory, "tgt_mask": nn.Transformer.generate_square_subsequent_mask(6)}
    ((x, y, _, causal),) = torch_attention_io(decoder, batch, [0])
    assert causal and torch.equal(x, tgt)
    torch.testing.assert_close(_reader("", True).teacher_layer(decoder, 0)(x), y)
    model, report = convert_torch(decoder, "hybrid", "all", batches=[batch] * 3, steps=2, window=4, sinks=1, s=4)
    assert len(report["history"]) == 2 and model(**batch).shape == (2, 6, 32)


class Block(nn.Module):
    """A pre-norm block of a user's own, around an ``nn.MultiheadAttention``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(32), nn.MultiheadAttention(32, 4, batch_first=True)
        self.mlp = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.attn(h, h, h, key_padding_mask=padding, need_weights=False)[0]
        return x + self.mlp(x)


class Pooled(nn.Module):
    """Two such blocks, then attention pooling: a learnt query cross-attends to the tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.blocks = nn.Linear(5, 32), nn.ModuleList([Block(), Block()])
        self.query, self.pool = nn.Parameter(torch.randn(1, 1, 32)), nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, padding)
        return self.pool(self.query.expand(len(h), -1, -1), h, h, key_padding_mask=padding)[0][:, 0]


def test_a_model_of_its_own_blocks_converts_its_self_attention():
    torch.manual_seed(0)
    teacher = Pooled().double().eval()
    assert find_attention(teacher) == (["blocks.0.attn", "blocks.1.attn", "pool"], False)
    assert find_attention(teacher, "blocks") == (["blocks.0.attn", "blocks.1.attn"], False)
    batches = [_batch(30, B=32)] + [_batch(31 + i) for i in range(3)]
    with pytest.raises(ValueError, match=r"layer 2 \(pool\) was called with keys or values other than its queries"):
        convert_torch(teacher, "primal", "all", batches=batches, s=6, max_len=10)
    reader = _reader("blocks", False)
    for i, (x, y, key, _) in enumerate(torch_attention_io(teacher, _batch(5), [0, 1], stack="blocks")):
        torch.testing.assert_close(reader.teacher_layer(teacher, i)(x, key), y)
    model, report = convert_torch(teacher, "primal", "all", stack="blocks", batches=batches, steps=3, s=6,
                                  max_len=10)  # fmt: skip
    assert [type(b.attn).__name__ for b in model.blocks] == ["MultiheadSelfAttention"] * 2
    assert isinstance(model.pool, nn.MultiheadAttention) and len(report["history"]) == 2
    assert find_attention(model, "blocks")[0] == find_attention(teacher, "blocks")[0]  # the same indices after

    layers = nn.ModuleList([nn.TransformerDecoderLayer(32, 4, 64, batch_first=True) for _ in range(2)])
    assert find_attention(layers) == (["0.self_attn", "1.self_attn"], False)  # without the cross-attention
    assert model(*_batch(5)).shape == (4, 32)


@pytest.mark.parametrize("causal", [False, True])
def test_the_teacher_initialisation_and_stage_1(causal):
    """J = 0 at the initialisation; held out, the students start far closer to the teacher than the primal layer's
    own initialisation does; stage 1 trains; the teacher is left as it was; the copy trains end to end."""
    teacher = _net(causal=causal)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    batches = [_batch(10, B=32)] + [_batch(11 + i) for i in range(5)]  # a calibration batch, then stage 1's
    opts = {"s": 6} if causal else {"s": 6, "max_len": 10}
    model, report = convert_torch(teacher, "primal", "all", causal=causal, batches=batches, steps=5, log_every=1,
                                  **opts)  # fmt: skip
    assert report["layers"] == [0, 1] and len(report["history"]) == 5
    assert all(abs(report["init"][i]["J"]) < 1e-6 and report["init"][i]["rebuild_error"] < 1e-5 for i in (0, 1))
    assert all(isinstance(m.self_attn.attn, PrimalAttention) for m in model.encoder.layers)
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())

    reader = _reader("encoder", causal)
    held = reader.io(teacher, _batch(99, B=16), None, [0, 1])
    fitted, _ = convert_torch(teacher, "primal", "all", causal=causal, batches=batches[:1], **opts)
    random, _ = convert_torch(teacher, "primal", "all", causal=causal, init="random", **opts)
    with torch.no_grad():
        ours, theirs = (layer_losses(reader.students(m, [0, 1]), held, None) for m in (fitted, random))
    assert bool((ours < theirs).all() and (ours < 1).all()), (ours, theirs)

    again, _ = convert_torch(teacher, "primal", "all", causal=causal, init="random", **opts)  # how it reloads
    again.load_state_dict(model.state_dict())
    x, pad = _batch(5)
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x, pad), model.eval()(x, pad))
    model.train()
    loss = model(x, pad).square().mean() + collect_aux_loss(model)
    loss.backward()
    assert model.encoder.layers[0].self_attn.attn.w_e.grad is not None


def test_a_stage_1_resumed_from_its_checkpoint_ends_where_an_uninterrupted_one_does():
    """Even where the batches are drawn from torch's own generator: the batches already used are drawn again
    before the checkpoint's random state comes back."""
    teacher = _net()

    def stream(n: int):
        torch.manual_seed(123)
        for i in range(n):  # a calibration batch of 12 series (8 n / p = 10), then stage 1's of 4
            yield (torch.randn(12 if i == 0 else 4, 10, 5, dtype=torch.float64),)

    opts = {"steps": 6, "log_every": 2, "s": 4, "max_len": 10}
    straight, a = convert_torch(teacher, "primal", -1, batches=stream(7), **opts)
    saved: list[dict] = []
    with pytest.raises(ValueError, match="batches: ran out before stage-1 update 4 of 6"):  # a "crash"
        convert_torch(teacher, "primal", -1, batches=stream(4), on_checkpoint=saved.append, **opts)
    resumed, b = convert_torch(teacher, "primal", -1, batches=stream(7), resume=saved[0], **opts)
    assert saved[0]["step"] == 2 and a["history"] == b["history"]
    for (k, v), w in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(v, w, msg=k)
    again, c = convert_torch(teacher, "primal", -1, batches=stream(7), resume=saved[0], **opts)
    assert c["history"] == a["history"]  # the checkpoint dict was not changed by the first resume
    with pytest.raises(ValueError, match="resume: the checkpoint is at stage-1 update 2; steps must be above it, "
                       "got 0"):  # fmt: skip
        convert_torch(teacher, "primal", -1, batches=stream(7), resume=saved[0], s=4, max_len=10)
    with pytest.raises(ValueError, match="resume: the checkpoint was made with init='teacher', this call has "
                       "init='random'"):  # fmt: skip
        convert_torch(teacher, "primal", -1, batches=stream(7), resume=saved[0], init="random", **opts)
    with pytest.raises(
        ValueError, match=r"resume: .* options such as s or max_len\): .*concat.weight is \(8, 8\) there, \(8, 6\) here"
    ):
        convert_torch(teacher, "primal", -1, batches=stream(7), resume=saved[0], **{**opts, "s": 3})
    with pytest.raises(ValueError, match=r"resume: expected a stage-1 checkpoint .* it lacks \['history', 'init'"):
        convert_torch(teacher, "primal", -1, batches=stream(7), resume={"step": 1}, **opts)
    # the learning rate is this call's, not the checkpoint's
    seen: list[float] = []
    convert_torch(teacher, "primal", -1, batches=stream(7), resume=saved[0], lr=0.5,
                  on_checkpoint=lambda c: seen.append(c["optimizer"]["param_groups"][0]["lr"]), **opts)  # fmt: skip
    assert seen == [0.5]


def test_the_copy_and_the_teacher_keep_their_modes_and_trainable_flags():
    """The stand-ins take the mode of the modules they replace and keep it after stage 1; a teacher with parts in
    eval and parts in training is left so; parameters frozen in the teacher stay frozen in the copy."""
    teacher = _net()
    teacher.embed.requires_grad_(False)
    model, _ = convert_torch(teacher, "primal", "all", batches=[_batch(1, B=16), _batch(2)], steps=1, s=4, max_len=10)
    assert not any(m.training for m in model.modules())
    assert not model.embed.weight.requires_grad and model.head.weight.requires_grad
    assert model.encoder.layers[0].self_attn.attn.w_e.requires_grad
    teacher.encoder.layers[1].self_attn.requires_grad_(False)  # a frozen attention's projections stay frozen
    model, _ = convert_torch(teacher, "primal", "all", init="random", s=4, max_len=10)
    frozen, trained = model.encoder.layers[1].self_attn.attn, model.encoder.layers[0].self_attn.attn
    assert not any(p.requires_grad for p in (*frozen.qk.parameters(), *frozen.proj.parameters()))
    assert frozen.w_e.requires_grad and trained.qk.weight.requires_grad and trained.proj.weight.requires_grad
    teacher.train()
    teacher.embed.eval()
    teacher.head = Folding(32, 3).double()
    weight = teacher.head.weight.detach().clone()
    torch_attention_io(teacher, _batch(3), [0])
    assert teacher.training and teacher.encoder.training and not teacher.embed.training
    assert teacher.head.training and torch.equal(teacher.head.weight, weight)  # its own train() ran on the way back


class Folding(nn.Linear):
    """A layer whose ``train()`` does more than set the flag: it folds an update into its weight in eval mode and
    takes it out for training, as LoRA layers do."""

    def train(self, mode: bool = True) -> Folding:
        if mode != self.training:
            with torch.no_grad():
                self.weight += -1.0 if mode else 1.0
        return super().train(mode)


def test_what_is_refused():
    teacher = _net()
    batches = [_batch(0)] * 3
    with pytest.raises(ValueError, match=r"2 nn.TransformerEncoder / nn.TransformerDecoder stacks \('encoder', "
                       r"'decoder'\); name the one"):  # fmt: skip
        find_attention(nn.Transformer(16, 2, 1, 1, 32))
    assert find_attention(nn.Transformer(16, 2, 1, 1, 32), "decoder") == (
        ["decoder.layers.0.self_attn"], True)  # fmt: skip
    with pytest.raises(ValueError, match="stack: Net has no submodule 'body'"):
        convert_torch(teacher, stack="body")
    with pytest.raises(ValueError, match="Linear holds no nn.MultiheadAttention"):
        convert_torch(teacher, stack="head")
    with pytest.raises(TypeError, match="causal must be a bool or None, got 'false'"):
        convert_torch(teacher, causal="false")
    with pytest.raises(ValueError, match="student 'hybrid' is causal only"):
        convert_torch(teacher, "hybrid")
    with pytest.raises(ValueError, match="batches: needed for the teacher initialisation"):
        convert_torch(teacher, s=4, max_len=10)
    with pytest.raises(ValueError, match=r"causal: layer 1 of the teacher was called bidirectional, but the students "
                       r"are built with causal=True; pass causal=False"):  # fmt: skip
        convert_torch(teacher, causal=True, batches=batches, s=4)
    with pytest.raises(TypeError, match="batches: each batch is what the model is called with"):
        convert_torch(teacher, batches=[7], s=4, max_len=10)
    with pytest.raises(TypeError, match="batches: an iterable of batches .* got Tensor; wrap a single batch as"):
        convert_torch(teacher, batches=_batch(0)[0], s=4, max_len=10)
    with pytest.raises(TypeError, match="batches: an iterable of batches .* got tuple; wrap a single batch as"):
        convert_torch(teacher, batches=_batch(0), s=4, max_len=10)
    with pytest.raises(ValueError, match="batches: empty; the first batch calibrates the teacher initialisation"):
        convert_torch(teacher, batches=[], s=4, max_len=10)
    with pytest.raises(ValueError, match="log_every must be an int >= 1, got 0"):
        convert_torch(teacher, batches=batches, steps=1, log_every=0, s=4, max_len=10)
    with pytest.raises(IndexError, match="layer index 2 is out of range"):
        convert_torch(teacher, layers=2)


def test_the_docs_example_runs():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "conversion.md").read_text()
    code = next(c for c in re.findall(r"```python\n(.*?)```", doc, re.S) if "convert_torch" in c)
    scope: dict = {}
    exec(compile(code, "docs/conversion.md", "exec"), scope)
    assert abs(scope["report"]["init"][5]["J"]) < 1e-5 and len(scope["report"]["history"]) == 3


class InPlace(nn.Module):
    """Blocks that add the residual into the attention output in place (``a += x``), a memory-saving idiom."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(16) for _ in range(2)])
        self.attns = nn.ModuleList([nn.MultiheadAttention(16, 2, batch_first=True) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, attn in zip(self.norms, self.attns):
            h = norm(x)
            a = attn(h, h, h, need_weights=False)[0]
            a += x
            x = a
        return x


def test_an_output_the_model_changes_in_place_afterwards_is_recorded_as_it_was():
    torch.manual_seed(0)
    teacher = InPlace().double().eval()
    x = torch.randn(4, 12, 16, dtype=torch.float64)
    for i, (xr, y, _, _) in enumerate(torch_attention_io(teacher, (x,), [0, 1])):
        with torch.no_grad():
            torch.testing.assert_close(_reader(None, False).teacher_layer(teacher, i)(xr), y)
    _, report = convert_torch(teacher, "primal", "all", batches=[(torch.randn(32, 12, 16, dtype=torch.float64),)],
                              s=4, max_len=12)  # fmt: skip
    assert all(report["init"][i]["rebuild_error"] < 1e-12 for i in (0, 1))


def test_stage_1_leaves_no_gradients_and_stops_at_a_loss_that_is_not_finite():
    teacher = _net()
    batches = [_batch(10, B=32)] + [_batch(11 + i) for i in range(2)]
    model, _ = convert_torch(teacher, "primal", -1, batches=batches, steps=2, s=6, max_len=10)
    assert all(p.grad is None for p in model.parameters())  # stage 2's first backward starts from zero
    torch.manual_seed(0)
    half = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2).half().eval()
    batches = [(torch.randn(32, 10, 64, dtype=torch.float16),)] + [(torch.randn(4, 10, 64).half(),)] * 3
    with pytest.raises(ValueError, match=r"stage 1: the loss at update \d is nan: float16 students"):
        convert_torch(half, "primal", -1, batches=batches, steps=3, s=8, max_len=10)


class SeqFirst(nn.Module):
    """A sequence-first ``nn.MultiheadAttention`` called on three views of the batch-first tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.transpose(0, 1)  # (B, N, C) -> (N, B, C)
        return x + self.attn(t, x.transpose(0, 1), x.transpose(0, 1), need_weights=False)[0].transpose(0, 1)


def test_self_attention_called_on_views_of_one_tensor_converts():
    torch.manual_seed(0)
    teacher = SeqFirst().double().eval()
    model, report = convert_torch(teacher, "primal", -1, batches=[torch.randn(24, 10, 16, dtype=torch.float64)],
                                  s=4, max_len=10)  # fmt: skip
    assert report["init"][0]["rebuild_error"] < 1e-12
    assert model(torch.randn(2, 10, 16, dtype=torch.float64)).shape == (2, 10, 16)


def test_one_batch_written_as_a_list_is_named():
    x, padding = _batch(1, B=16)
    with pytest.raises(TypeError, match=r"wrap a single batch as \[batch\]"):
        convert_torch(_net(), "primal", -1, batches=[x, padding], s=4, max_len=10)


def test_stage_1_trains_the_students_without_their_dropout():
    """The targets are recorded without dropout: a hybrid whose window covers the sequence (the teacher exactly) and
    whose teacher attention had dropout 0.1 keeps a stage-1 error of 0."""
    teacher = _net(causal=True)
    batches = [_batch(10, B=16)] + [_batch(11 + i) for i in range(3)]
    model, report = convert_torch(teacher, "hybrid", "all", causal=True, batches=batches, steps=3, log_every=1,
                                  window=10, sinks=0, s=4)  # fmt: skip
    assert model.encoder.layers[0].self_attn.attn.attn_drop == 0.1
    assert all(row["loss"] < 1e-12 for row in report["history"]), report["history"]


def test_a_layer_without_an_equivalent_is_named_by_its_path():
    teacher = _net()
    teacher.encoder.layers[0].self_attn = nn.MultiheadAttention(32, 4, add_bias_kv=True, batch_first=True).double()
    with pytest.raises(ValueError, match=r"nn.MultiheadAttention \(layer 0 \(encoder.layers.0.self_attn\)\) with "
                                         "add_bias_kv"):  # fmt: skip
        convert_torch(teacher, "primal", "all", init="random", s=4, max_len=10)
