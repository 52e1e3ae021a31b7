"""Converting hand-written attention modules (``convert_modules``): nanoGPT's causal ``CausalSelfAttention`` (one fused
``c_attn``) and a bidirectional block with three projections; what their weights do not show is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from primaldual import collect_aux_loss
from primaldual.convert import convert_modules, layer_losses
from primaldual.convert.modules import ModuleAttention, find_modules, layer_from_module, modules_attention_io


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: ``c_attn`` gives q, k, v side by side, SDPA with ``is_causal=True``, ``c_proj``."""

    def __init__(self, dim: int, heads: int, bias: bool = True) -> None:
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim, bias=bias), nn.Linear(dim, dim, bias=bias)
        self.resid_dropout = nn.Dropout(0.1)
        self.n_head, self.n_embd = heads, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, 2))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, attn: nn.Module, dim: int) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(dim), attn, nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's model layout: ``transformer.h[i].attn``, called on token ids."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4, depth: int = 3, length: int = 24) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, dim),
                "wpe": nn.Embedding(length, dim),
                "h": nn.ModuleList([Block(CausalSelfAttention(dim, heads), dim) for _ in range(depth)]),
                "ln_f": nn.LayerNorm(dim),
            }
        )
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)


class Attention(nn.Module):
    """A bidirectional attention with three bias-free projections, a head width of its own and an output
    ``Sequential`` (the layout of lucidrains' ViTs, without their inner norm)."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.scale = heads, head_dim**-0.5
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, inner, bias=False) for _ in range(3))
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        q, k, v = (f(x).view(B, N, self.heads, -1).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        w = (q @ k.transpose(-1, -2) * self.scale).softmax(-1)  # (B, H, N, N)
        return self.to_out((w @ v).transpose(1, 2).reshape(B, N, -1))  # (B, N, C)


class Encoder(nn.Module):
    def __init__(self, dim: int = 24, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(5, dim)
        self.layers = nn.ModuleList([Block(Attention(dim, 4, 8), dim) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return x.mean(1)


NANO = {"modules": "transformer.h.*.attn", "qkv": "c_attn", "proj": "c_proj", "causal": True}
LUCID = {"modules": "layers.*.attn", "qkv": ("to_q", "to_k", "to_v"), "proj": "to_out.0", "causal": False}


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT().double().eval()


def _ids(seed: int, B: int = 8) -> torch.Tensor:
    return torch.randint(0, 50, (B, 24), generator=torch.Generator().manual_seed(seed))


def test_the_rebuilt_layers_are_the_modules_own():
    gpt, enc = _gpt(), Encoder().double()
    assert find_modules(gpt, NANO["modules"]) == [f"transformer.h.{i}.attn" for i in range(3)]
    for model, layout, batch in ((gpt, NANO, _ids(0)), (enc, LUCID, torch.randn(4, 9, 5, dtype=torch.float64))):
        paths = find_modules(model, layout["modules"])
        io = modules_attention_io(model, batch, [0, 1], paths)
        for path, (x, y, key) in zip(paths, io):
            assert key is None
            opts = {k: v for k, v in layout.items() if k != "modules"}
            layer = layer_from_module(model.get_submodule(path), "softmax", **opts).eval()
            torch.testing.assert_close(layer(x), y)
    assert enc.training  # the recording forward ran in eval mode and gave the mode back


def test_nanogpt_converts_with_the_teacher_initialisation_and_stage_1():
    teacher = _gpt()
    batches = [_ids(1, B=16)] + [_ids(2 + i) for i in range(4)]
    model, report = convert_modules(teacher, "primal", -1, batches=batches, steps=4, log_every=2, s=8, **NANO)
    assert report["layers"] == [2] and [h["step"] for h in report["history"]] == [1, 2, 4]
    assert abs(report["init"][2]["J"]) < 1e-6 and report["init"][2]["rebuild_error"] < 1e-12
    assert isinstance(model.transformer.h[2].attn, ModuleAttention) and not model.training
    assert isinstance(teacher.transformer.h[2].attn, CausalSelfAttention)  # the teacher is left as it was
    held = modules_attention_io(teacher, _ids(99), [2], find_modules(teacher, NANO["modules"]))
    held = [(x, y, None, key) for x, y, key in held]
    random, _ = convert_modules(teacher, "primal", -1, init="random", s=8, **NANO)
    students = [m.transformer.h[2].attn.attn for m in (model, random)]
    with torch.no_grad():
        ours, theirs = (layer_losses([s], held, None) for s in students)
    assert bool((ours < theirs).all()), (ours, theirs)
    random.load_state_dict(model.state_dict())  # a saved conversion reloads into a fresh swap
    with torch.no_grad():
        torch.testing.assert_close(random(_ids(5)), model(_ids(5)))
        # causal: a later token changes no earlier output
        ids = _ids(6)
        changed = ids.clone()
        changed[:, 12:] = (changed[:, 12:] + 1) % 50
        torch.testing.assert_close(model(ids)[:, :12], model(changed)[:, :12])


def test_a_hybrid_whose_window_covers_the_sequence_gives_the_teachers_logits():
    teacher = _gpt()
    model, report = convert_modules(teacher, "hybrid", "all", batches=[_ids(1, B=16)], window=24, sinks=0, s=8, **NANO)
    with torch.no_grad():
        torch.testing.assert_close(model(_ids(7)), teacher(_ids(7)))


def test_a_bidirectional_model_with_three_projections_converts():
    torch.manual_seed(0)
    teacher = Encoder().double()
    x = torch.randn(32, 9, 5, dtype=torch.float64)
    model, report = convert_modules(
        teacher, "primal", "all", batches=[x, x[:8]], steps=1, s=6, data_dependent=False, **LUCID
    )  # data-dependent weights need a head width of dim / heads
    assert all(report["init"][i]["rebuild_error"] < 1e-12 for i in (0, 1)) and model.training
    out = model(torch.randn(3, 9, 5, dtype=torch.float64))
    (out.sum() + collect_aux_loss(model)).backward()  # Lambda enters through the KSVD term only
    assert out.shape == (3, 24) and all(p.grad is not None for p in model.layers[0].attn.parameters())


def test_what_the_weights_do_not_show_is_refused():
    teacher = _gpt()
    batches = [_ids(1, B=16)]
    with pytest.raises(ValueError, match="layer 2: the teacher's attention rebuilt from its weights is"):
        convert_modules(teacher, "primal", -1, batches=batches, s=8, **{**NANO, "causal": False}, max_len=24)
    hidden = _gpt()
    scaled = Scaled(32, 4).double()
    scaled.load_state_dict(hidden.transformer.h[1].attn.state_dict())
    hidden.transformer.h[1].attn = scaled
    with pytest.raises(ValueError, match="layer 1: the teacher's attention rebuilt"):
        convert_modules(hidden, "primal", 1, batches=batches, s=8, **NANO)


class Scaled(CausalSelfAttention):
    """nanoGPT's attention with its input scaled inside (as a norm would be): nothing its weights show."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(2 * x)


def test_bad_arguments_and_calls_are_named():
    teacher = _gpt()
    with pytest.raises(ValueError, match="modules: no submodule of GPT matches 'blocks.*.attn'"):
        convert_modules(teacher, init="random", **{**NANO, "modules": "blocks.*.attn"})
    with pytest.raises(TypeError, match="causal must be a bool"):
        convert_modules(teacher, init="random", **{**NANO, "causal": "true"})
    with pytest.raises(TypeError, match="qkv: 'ln_1' is a LayerNorm, expected an nn.Linear"):
        convert_modules(teacher, init="random", **{**NANO, "modules": "transformer.h.*", "qkv": "ln_1"}, heads=4)
    with pytest.raises(ValueError, match="heads: Block has none of the attributes"):
        convert_modules(teacher, init="random", **{**NANO, "modules": "transformer.h.*", "qkv": "mlp.0"})
    with pytest.raises(ValueError, match="the query projection's 32 outputs do not split into 5 heads"):
        convert_modules(teacher, init="random", heads=5, **NANO)
    with pytest.raises(ValueError, match="heads: CausalSelfAttention.c_proj is Linear"):
        convert_modules(teacher, init="random", heads="c_proj", **NANO)
    with pytest.raises(ValueError, match="qkv: 'c_proj' has 32 outputs, not three"):
        convert_modules(teacher, init="random", **{**NANO, "qkv": "c_proj"})
    with pytest.raises(ValueError, match="student 'hybrid' is causal only"):
        convert_modules(Encoder(), "hybrid", **LUCID)
    model, _ = convert_modules(teacher, init="random", s=8, **NANO)
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    with pytest.raises(TypeError, match="takes the tokens alone"):
        model.transformer.h[2].attn(x, x[..., 0] > 0)
    torch.testing.assert_close(model.transformer.h[2].attn(x, attn_mask=None), model.transformer.h[2].attn(x))
    with pytest.raises(ValueError, match=r"layer 2 \(transformer.h.2.attn\) is already converted"):
        convert_modules(model, init="random", s=8, **NANO)
    called = Encoder().double()
    masked = Masked(24, 4, 8).double()
    masked.load_state_dict(called.layers[1].attn.state_dict())
    called.layers[1].attn = masked
    called.layers[1].forward = lambda x, layer=called.layers[1]: x + layer.attn(layer.ln_1(x), x[..., 0] > 0)
    with pytest.raises(ValueError, match=r"layer 1 \(layers.1.attn\) was called with argument 2 beside its tokens"):
        convert_modules(
            called,
            "primal",
            1,
            batches=[torch.randn(16, 9, 5, dtype=torch.float64)],
            s=6,
            data_dependent=False,
            **LUCID,
        )


class Masked(Attention):
    """A module that also takes a mask: not one ``convert_modules`` reads."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x)


class WhisperLike(Attention):
    """Three projections, the key's without a bias (Whisper's layout), called with ``attn_mask=None``."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__(dim, heads, head_dim)
        inner = heads * head_dim
        self.to_q, self.to_v = nn.Linear(dim, inner), nn.Linear(dim, inner)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x)


def test_a_key_without_a_bias_and_a_mask_given_as_none_convert():
    torch.manual_seed(0)
    teacher = Encoder().double()
    for layer in teacher.layers:
        layer.attn = WhisperLike(24, 4, 8).double()
        layer.forward = lambda x, layer=layer: x + layer.attn(layer.ln_1(x), attn_mask=None)
    x = torch.randn(32, 9, 5, dtype=torch.float64)
    model, report = convert_modules(teacher, "primal", "all", batches=[x], s=6, data_dependent=False, **LUCID)
    assert all(report["init"][i]["rebuild_error"] < 1e-12 for i in (0, 1))


class PaddedAttention(Attention):
    """``Attention`` that masks padded keys, its mask in one of the three conventions of ``convert_modules``."""

    def __init__(self, dim: int, heads: int, head_dim: int, kind: str) -> None:
        super().__init__(dim, heads, head_dim)
        self.kind = kind

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, N, _ = x.shape
        q, k, v = (f(x).view(B, N, self.heads, -1).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        s = q @ k.transpose(-1, -2) * self.scale  # (B, H, N, N)
        if mask is not None:
            allowed = {"keep": lambda m: m[:, None, None, :], "pad": lambda m: ~m[:, None, None, :],
                       "attend": lambda m: m}[self.kind](mask)  # fmt: skip
            s = s.masked_fill(~allowed, -1e9)  # (a padded query's empty row then averages: no NaN)
        return self.to_out((s.softmax(-1) @ v).transpose(1, 2).reshape(B, N, -1))  # (B, N, C)


class PaddedEncoder(Encoder):
    def __init__(self, kind: str) -> None:
        super().__init__()
        for layer in self.layers:
            layer.attn = PaddedAttention(24, 4, 8, kind)
        self.kind = kind

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        mask = {"keep": keep, "pad": ~keep, "attend": keep[:, None, None, :] & keep[:, None, :, None]}[self.kind]
        h = self.embed(x)
        for layer in self.layers:
            h = h + layer.attn(layer.ln_1(h), mask)  # the mask passed by position
            h = h + layer.mlp(layer.ln_2(h))
        return (h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)


def _padded_batch(seed: int, B: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    keep = torch.ones(B, 9, dtype=torch.bool)
    keep[::2, 6:] = False  # right padding in every other sequence
    return torch.randn(B, 9, 5, generator=g, dtype=torch.float64), keep


@pytest.mark.parametrize("kind", ["keep", "pad", "attend"])
def test_modules_called_with_a_padding_mask_convert(kind):
    """A mask read in each convention: the teacher check passes (the rebuilt layer masks the same keys), stage 1
    runs, and the converted model's outputs at real tokens do not depend on what the padding holds."""
    torch.manual_seed(0)
    teacher = PaddedEncoder(kind).double().eval()
    assert hasattr(teacher.layers[0], "ln_1") and hasattr(teacher.layers[0], "mlp")
    batches = [_padded_batch(0)] + [_padded_batch(1 + i, B=8) for i in range(2)]
    opts = {**LUCID, "mask": "mask", "mask_kind": kind, "data_dependent": False}
    model, report = convert_modules(teacher, "primal", "all", batches=batches, steps=2, s=6, **opts)
    assert all(report["init"][i]["rebuild_error"] < 1e-12 for i in (0, 1))
    x, keep = _padded_batch(9, B=4)
    noisy = x.clone()
    noisy[~keep] = 100.0
    with torch.no_grad():
        torch.testing.assert_close(model(noisy, keep), model(x, keep))
    assert "mask='mask'" in repr(model.layers[0].attn)


def test_mask_arguments_are_checked():
    teacher = PaddedEncoder("keep").double()
    batch = [_padded_batch(0)]
    LUCID = {**globals()["LUCID"], "data_dependent": False}  # noqa: N806
    with pytest.raises(ValueError, match=r"was called with argument 2 beside its tokens.*a mask is named with mask="):
        convert_modules(teacher, "primal", "all", batches=batch, s=6, **LUCID)
    with pytest.raises(ValueError, match=r"mask: PaddedAttention.forward has no parameter 'attn_mask' \(it takes"):
        convert_modules(teacher, "primal", "all", batches=batch, s=6, mask="attn_mask", **LUCID)
    with pytest.raises(ValueError, match="mask_kind must be one of 'keep', 'pad', 'attend', got 'keys'"):
        convert_modules(teacher, "primal", "all", init="random", s=6, mask="mask", mask_kind="keys", **LUCID)
    with pytest.raises(ValueError, match="mask_kind: read only with mask"):
        convert_modules(teacher, "primal", "all", init="random", s=6, mask_kind="pad", **LUCID)
    model, _ = convert_modules(teacher, "primal", "all", init="random", s=6, mask="mask", **LUCID)
    attn = model.layers[0].attn
    x, keep = torch.randn(2, 9, 24, dtype=torch.float64), _padded_batch(0, B=2)[1]
    torch.testing.assert_close(attn(x, keep), attn(x, mask=keep))
    with pytest.raises(ValueError, match=r"mask \(mask_kind='keep'\) must be a tensor of shape \(B, N\) = \(2, 9\)"):
        attn(x, keep[:, :5])
    with pytest.raises(TypeError, match="got multiple values for argument 'mask'"):
        attn(x, keep, mask=keep)
    with pytest.raises(TypeError, match="takes the tokens and 'mask'"):
        attn(x, keep, torch.ones(1))
