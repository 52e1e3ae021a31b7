"""Converting a timm vision transformer (``convert_timm``): a model of timm's layout (``blocks[i].attn`` with a fused
``qkv`` and ``proj``) is read right, initialised from the teacher and transferred; timm's own ViT where it imports."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from primaldual.convert import layer_losses
from primaldual.convert.timm import TIMM_READER, convert_timm, timm_attention_io
from primaldual.integrations.timm import TimmAttention


class Attention(nn.Module):
    """timm's ``Attention`` layout and arithmetic (fused qkv, scale ``D ** -0.5``, SDPA with its bool mask)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.q_norm = self.k_norm = self.norm = nn.Identity()
        self.attn_drop, self.proj_drop = nn.Dropout(0.0), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, H, N, D)
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(B, N, C)))  # (B, N, C)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(dim), Attention(dim, heads), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attn_mask=attn_mask)
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A DeiT-style classifier of timm's layout: patch embedding, class token, ``blocks``, head."""

    def __init__(self, dim: int = 32, heads: int = 4, depth: int = 3) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, 4, 4)
        self.cls_token, self.pos_embed = nn.Parameter(torch.randn(1, 1, dim)), nn.Parameter(torch.randn(1, 17, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, C, 4, 4) -> (B, 16, C)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos_embed  # (B, 17, C)
        return self.head(self.norm(self.blocks(x))[:, 0])


def _vit(seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    return ViT().double().eval()


def _images(seed: int, B: int = 8) -> torch.Tensor:
    return torch.rand(B, 3, 16, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_the_recorded_attention_is_the_teachers_own():
    teacher = _vit()
    io = timm_attention_io(teacher, _images(0), [0, 2])
    for i, (x, y, key) in zip([0, 2], io):
        assert x.shape == (8, 17, 32) and key is None
        torch.testing.assert_close(TIMM_READER.teacher_layer(teacher, i)(x), y)
    # a padding mask handed to the blocks (SDPA's bool convention, True = may attend) is read per layer
    keep = torch.ones(8, 17, dtype=torch.bool)
    keep[:3, 12:] = False
    block = Block(32, 4).double().eval()
    holder = nn.Module()
    holder.blocks = nn.ModuleList([block])
    holder.forward = lambda x, m: block(x, m)
    x = torch.randn(8, 17, 32, dtype=torch.float64)
    ((xr, y, key),) = timm_attention_io(holder, (x, keep[:, None, None, :]), [0])
    assert torch.equal(key, keep) and (y[~keep] == 0).all()
    torch.testing.assert_close(TIMM_READER.teacher_layer(holder, 0)(xr, key)[keep], y[keep])


def test_the_teacher_initialisation_stage_1_and_reloading():
    teacher = _vit()
    batches = [_images(1, B=32)] + [_images(2 + i) for i in range(4)]
    model, report = convert_timm(teacher, "primal", "all", batches=batches, steps=4, log_every=2, s=8, max_len=17)
    assert all(abs(report["init"][i]["J"]) < 1e-6 for i in range(3)) and len(report["history"]) == 3
    assert all(isinstance(b.attn, TimmAttention) for b in model.blocks)
    assert not any(m.training for m in model.modules())  # the copy of an eval-mode teacher, after stage 1 too
    held = TIMM_READER.io(teacher, _images(99, B=16), None, [0, 1, 2])
    fitted, _ = convert_timm(teacher, "primal", "all", batches=batches[:1], s=8, max_len=17)
    random, _ = convert_timm(teacher, "primal", "all", init="random", s=8, max_len=17)
    with torch.no_grad():
        ours, theirs = (layer_losses(TIMM_READER.students(m, [0, 1, 2]), held, None) for m in (fitted, random))
    assert bool((ours < theirs).all() and (ours < 1).all()), (ours, theirs)
    random.load_state_dict(model.state_dict())  # a saved conversion reloads into a fresh swap
    with torch.no_grad():
        torch.testing.assert_close(random.eval()(_images(5)), model.eval()(_images(5)))


def test_what_is_refused():
    teacher = _vit()
    with pytest.raises(ValueError, match="student 'hybrid' is causal only"):
        convert_timm(teacher, "hybrid")
    with pytest.raises(TypeError, match="expected a timm vision transformer with .blocks, got Linear"):
        convert_timm(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="batches: needed"):
        convert_timm(teacher, s=8)
    teacher.blocks[1].attn.q_norm = nn.LayerNorm(8)
    with pytest.raises(ValueError, match="block 1: q_norm is not supported"):
        convert_timm(teacher, layers="all", init="random", s=8)


class Rotated(Attention):
    """timm's layout, with an operation its weights do not show: the queries turned (as a rotary block would)."""

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
        q = q.roll(1, dims=-1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, H, N, D)
        return self.proj(y.transpose(1, 2).reshape(B, N, C))  # (B, N, C)


def test_a_teacher_its_weights_do_not_describe_is_refused_by_the_initialisation():
    teacher = _vit()
    model, report = convert_timm(teacher, "primal", [0, 2], batches=[_images(1, B=32)], s=8, max_len=17)
    assert all(report["init"][i]["rebuild_error"] < 1e-12 for i in (0, 2))  # float64: rounding only
    hidden = Rotated(32, 4).double()
    hidden.load_state_dict(teacher.blocks[2].attn.state_dict())
    teacher.blocks[2].attn = hidden
    with pytest.raises(ValueError, match=r"layer 2: the teacher's attention rebuilt from its weights is 0\.\d+"):
        convert_timm(teacher, "primal", [0, 2], batches=[_images(1, B=32)], s=8, max_len=17)


def test_timms_own_vision_transformer_converts():
    try:
        from timm.models.vision_transformer import VisionTransformer
    except Exception as err:  # timm missing, or its torchvision does not match this torch
        pytest.skip(f"timm cannot be imported: {err}")
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=3).eval()
    io = timm_attention_io(vit, torch.rand(4, 3, 16, 16), [1])
    torch.testing.assert_close(TIMM_READER.teacher_layer(vit, 1)(io[0][0]), io[0][1], atol=1e-5, rtol=1e-4)
    model, report = convert_timm(vit, "primal", -1, batches=[torch.rand(8, 3, 16, 16)] * 3, steps=2, s=8)
    assert abs(report["init"][1]["J"]) < 1e-5 and model(torch.rand(2, 3, 16, 16)).shape == (2, 3)


def test_a_chosen_block_that_does_not_run_is_named():
    teacher = _vit()
    teacher.forward = lambda images: teacher.blocks[0](torch.zeros(len(images), 17, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"blocks \[2\] did not run in the teacher's forward"):
        timm_attention_io(teacher, _images(0), [0, 2])
