"""Task models: shapes, per-layer attention choice, padding handling, aux-loss plumbing, bad input."""

from __future__ import annotations

import pytest
import torch

from primaldual import collect_aux_loss, list_attentions
from primaldual.models import (
    RetrievalClassifier,
    SequenceClassifier,
    SequenceEncoder,
    TimeSeriesClassifier,
    VisionClassifier,
    masked_mean,
)

# the classifiers are bidirectional: mechanisms with no non-causal form (hybrid) train in the CausalLM tests instead
BIDIRECTIONAL = [i.name for i in list_attentions() if i.capabilities.non_causal]


def _ts(attention="softmax", **kw):
    return TimeSeriesClassifier(5, 3, 11, dim=12, depth=2, num_heads=3, ffn_dim=24, attention=attention, **kw)


def test_timeseries_shapes_and_per_layer_attention():
    model = _ts(["softmax", "linear"])
    assert model.encoder.attention_names == ["softmax", "linear"]
    assert not model.encoder.blocks[0].norm_first  # post-LN, as the UEA reference
    x, mask = torch.randn(4, 11, 5), torch.ones(4, 11, dtype=torch.bool)
    mask[2, 6:] = False
    assert model(x, mask).shape == (4, 3)


def test_timeseries_ignores_padded_values():
    model = _ts().eval()
    x, mask = torch.randn(2, 11, 5), torch.ones(2, 11, dtype=torch.bool)
    mask[:, 7:] = False
    y = model(x, mask)
    x2 = x.clone()
    x2[:, 7:] = torch.randn(2, 4, 5) * 100  # garbage in the padding
    torch.testing.assert_close(model(x2, mask), y)


def test_timeseries_bad_input():
    model = _ts()
    with pytest.raises(ValueError, match=r"padded to max_len"):
        model(torch.randn(2, 10, 5))
    with pytest.raises(TypeError, match="torch.bool"):
        model(torch.randn(2, 11, 5), torch.ones(2, 11))


@pytest.mark.parametrize("name", BIDIRECTIONAL)
def test_every_registered_attention_trains_in_the_timeseries_model(name):
    """One optimisation step with the task loss + aux loss; every parameter gets a gradient."""
    model = _ts(name)
    x, mask = torch.randn(3, 11, 5), torch.ones(3, 11, dtype=torch.bool)
    mask[0, 4:] = False
    logits = model(x, mask)
    aux = collect_aux_loss(model)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2])) + (0 if aux is None else aux)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{name}: no gradient for {missing}"
    assert torch.isfinite(loss)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_sequence_classifier_pooling_over_real_tokens(pooling):
    model = SequenceClassifier(20, 4, 9, dim=12, num_heads=2, ffn_dim=16, pooling=pooling).eval()
    tokens, mask = torch.randint(1, 20, (2, 9)), torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    y = model(tokens, mask)
    assert y.shape == (2, 4)
    tokens2 = tokens.clone()
    tokens2[1, 5:] = 7  # changing padded tokens must not change the output
    torch.testing.assert_close(model(tokens2, mask), y)
    with pytest.raises(ValueError, match="integer ids"):
        model(torch.randn(2, 9))


def test_retrieval_two_towers_share_the_encoder():
    model = RetrievalClassifier(30, 8, dim=12, num_heads=2, ffn_dim=16, attention=["softmax", "linear"]).eval()
    a, b = torch.randint(1, 30, (3, 8)), torch.randint(1, 30, (3, 8))
    m = torch.ones(3, 8, dtype=torch.bool)
    assert model(a, b, m, m).shape == (3, 2)
    assert sum(isinstance(mod, SequenceEncoder) for mod in model.modules()) == 1
    assert model.head[0].in_features == 4 * 12


def test_vision_classifier_shapes_and_errors():
    model = VisionClassifier(8, 4, 10, in_channels=1, dim=12, depth=2, num_heads=2, attention=["softmax", "linear"])
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    with pytest.raises(ValueError, match=r"expected \(B, 1, 8, 8\)"):
        model(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="must divide"):
        VisionClassifier(8, 3, 10)


def test_vision_classifier_overlapping_patches_keep_the_token_grid():
    torch.manual_seed(0)
    model = VisionClassifier(28, 4, 10, in_channels=1, dim=12, depth=1, num_heads=2, patch_kernel=8)
    assert model.patch.kernel_size == (8, 8) and model.patch.padding == (2, 2)
    assert model.patch(torch.randn(2, 1, 28, 28)).shape == (2, 12, 7, 7)  # (B, dim, 7, 7): 49 patches as before
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    # each token sees its 4 x 4 patch and a 2-pixel border: a pixel 3 px outside patch (0, 0) reaches only neighbours
    x = torch.zeros(1, 1, 28, 28, requires_grad=True)
    model.patch(x)[0, :, 0, 0].sum().backward()
    seen = x.grad[0, 0].abs() > 0
    assert seen[:6, :6].all() and not seen[6:, :].any() and not seen[:, 6:].any()
    assert VisionClassifier(28, 4, 10, patch_kernel=4).patch.padding == (0, 0)  # = patch_size: plain ViT patches
    with pytest.raises(ValueError, match="patch_kernel: expected patch_size"):
        VisionClassifier(28, 4, 10, patch_kernel=7)
    with pytest.raises(ValueError, match="patch_kernel"):
        VisionClassifier(28, 4, 10, patch_kernel=2)
    with pytest.raises(TypeError, match="patch_kernel"):
        VisionClassifier(28, 4, 10, patch_kernel=8.0)


def test_vision_classifier_conv_stem_keeps_the_token_grid_and_sees_a_growing_window():
    torch.manual_seed(0)
    model = VisionClassifier(28, 4, 10, in_channels=1, dim=12, depth=1, num_heads=2, stem="conv")
    convs = [m for m in model.patch if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [8, 12, 12] and [c.stride for c in convs] == [(2, 2), (2, 2), (1, 1)]
    assert model.patch(torch.randn(2, 1, 28, 28)).shape == (2, 12, 7, 7)  # (B, dim, 7, 7): 49 tokens as before
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    # two stride-2 3 x 3 stages: token (1, 1) sees pixels 1..7 of each axis (its 4 x 4 patch at 4..7 plus 3 px
    # before it; BatchNorm in eval mode so batch statistics do not couple pixels)
    model.eval()
    x = torch.randn(1, 1, 28, 28, requires_grad=True)
    model.patch(x)[0, :, 1, 1].sum().backward()
    seen = x.grad[0, 0].abs() > 0
    assert not seen[0].any() and not seen[:, 0].any() and not seen[8:].any() and not seen[:, 8:].any()
    assert seen[1].any() and seen[7].any() and seen[:, 1].any() and seen[:, 7].any()
    assert (
        len([m for m in VisionClassifier(224, 16, 10, dim=384, stem="conv").patch if isinstance(m, torch.nn.Conv2d)])
        == 5
    )
    with pytest.raises(ValueError, match="stem: expected 'patch' or 'conv'"):
        VisionClassifier(28, 4, 10, stem="convolutional")
    with pytest.raises(ValueError, match="power of two"):
        VisionClassifier(24, 6, 10, stem="conv")
    with pytest.raises(ValueError, match="patch_kernel None"):
        VisionClassifier(28, 4, 10, stem="conv", patch_kernel=8)


def test_masked_mean():
    h = torch.arange(12.0).reshape(1, 4, 3)
    mask = torch.tensor([[True, True, False, False]])
    torch.testing.assert_close(masked_mean(h, mask), torch.tensor([[1.5, 2.5, 3.5]]))
