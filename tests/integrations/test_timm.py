"""primaldual.integrations.timm: timm's attention-layer contract, and VisionTransformer when timm imports."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import primaldual as pd
from primaldual.integrations.timm import PrimalTimmAttention, TimmAttention, convert_vision_transformer, timm_attention

TIMM_KWARGS = dict(
    qkv_bias=True,
    qk_norm=False,
    scale_norm=False,
    proj_bias=True,
    attn_drop=0.0,
    proj_drop=0.0,
    norm_layer=nn.LayerNorm,
)


def test_constructor_and_forward_follow_timm():
    attn = PrimalTimmAttention(32, num_heads=2, **TIMM_KWARGS, s=4)
    x = torch.randn(2, 9, 32)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 6:] = False
    y = attn(x, attn_mask=keep[:, None, None, :])  # SDPA style, True = attend
    assert y.shape == x.shape and torch.equal(y[1, 6:], torch.zeros(3, 32))
    longer = torch.cat([x, torch.randn(2, 4, 32)], 1)
    more = torch.cat([keep, torch.zeros(2, 4, dtype=torch.bool)], 1)
    with torch.no_grad():
        assert torch.allclose(
            attn(longer, attn_mask=more[:, None, None, :])[:, :9][keep],
            attn(x, keep[:, None, None, :])[keep],
            atol=1e-5,
        )
    assert pd.collect_aux_loss(attn) is not None
    causal = timm_attention("softmax_bn", causal=True)(32, num_heads=2, **TIMM_KWARGS)
    assert causal(x, is_causal=True).shape == x.shape
    with pytest.raises(ValueError, match="causal=True, but is_causal=False"):
        causal(x)
    with pytest.raises(ValueError, match="qk_norm"):
        PrimalTimmAttention(32, num_heads=2, **{**TIMM_KWARGS, "qk_norm": True})
    with pytest.raises(TypeError, match="unknown option"):
        timm_attention("primal", window=3)


class _TimmLikeAttention(nn.Module):
    """The layout timm's Attention has (fused qkv, proj), computed with SDPA: what conversion reads."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.q_norm = self.k_norm = self.norm = nn.Identity()

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))


def test_convert_vision_transformer_copies_the_weights():
    torch.manual_seed(0)
    model = nn.Module()
    model.blocks = nn.Sequential(*[nn.Module() for _ in range(2)])
    for b in model.blocks:
        b.attn = _TimmLikeAttention(32, 2)
    x = torch.randn(2, 5, 32)
    ref = model.blocks[1].attn(x)
    convert_vision_transformer(model, "softmax", -1)
    assert isinstance(model.blocks[1].attn, TimmAttention) and model.blocks[1].attn.attention == "softmax"
    assert torch.allclose(model.blocks[1].attn(x), ref, atol=1e-5)


def test_vision_transformer_accepts_the_class():
    try:
        from timm.models.vision_transformer import VisionTransformer
    except Exception as err:  # timm missing, or its torchvision does not match this torch
        pytest.skip(f"timm cannot be imported: {err}")
    vit = VisionTransformer(
        img_size=16,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=3,
        attn_layer=timm_attention("primal", s=4),
    )
    out = vit(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 3) and pd.collect_aux_loss(vit) is not None
