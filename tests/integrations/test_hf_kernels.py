"""register_hf_attentions: the parameter-free mechanisms as transformers attention implementations."""

from __future__ import annotations

import pytest
import torch

import primaldual as pd

from .tiny_models import tiny, token_batch

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("primaldual.integrations.hf")


@pytest.fixture(scope="module", autouse=True)
def _registered():
    hf.register_hf_attentions(options={"sparse": {"window": 3}, "softmax_sh": {"factors": [1, 2]}})
    yield
    hf.register_hf_attentions()  # back to default options


class _Module(torch.nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.is_causal = causal


@pytest.mark.parametrize("name", hf.HF_KERNELS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_kernel_matches_build_attention_on_the_same_projected_inputs(name, causal, padded):
    if causal and not pd.attention.attention_class(name).capabilities.causal:
        pytest.skip(f"{name} is not causal")
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 7, 8, generator=g) for _ in range(3))  # (B, H, N, D)
    keys = torch.ones(2, 7, dtype=torch.bool)
    if padded:
        keys[1, 5:] = False
    mask_fn = transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS[f"primaldual_{name}"]
    hf_mask = mask_fn(2, 7, 7, attention_mask=keys.long())  # what the model hands to the attention function
    fn = transformers.AttentionInterface()[f"primaldual_{name}"]
    out, _ = fn(_Module(causal), q, k, v, hf_mask, scaling=0.3)  # (B, N, H, D)
    options = {"sparse": {"window": 3}, "softmax_sh": {"factors": [1, 2]}}.get(name, {})
    if "scale" in pd.attention_options(name):
        options["scale"] = 0.3
    layer = pd.build_attention(name, 16, 2, causal=causal, **options)
    ref, _ = layer.attend(q, k, v, keys if padded else None, False)  # (B, H, N, D)
    assert torch.allclose(out.transpose(1, 2), ref, atol=1e-6), name


def test_models_run_with_a_registered_implementation_and_match_softmax_where_they_should():
    hf.register_hf_attentions(options={"sparse": {"window": 64}})  # covering window: exactly softmax
    ids, mask = token_batch()
    for name in ("bert", "gpt2"):
        model = tiny(name)
        with torch.no_grad():
            ref = model(ids, attention_mask=mask)[0]
            model.set_attn_implementation("primaldual_sparse")
            got = model(ids, attention_mask=mask)[0]
        keep = mask.bool()
        assert torch.allclose(got[keep], ref[keep], atol=1e-5), name
    gpt = tiny("gpt2")
    gpt.set_attn_implementation("primaldual_linear")
    short, _ = token_batch(pad_from=None, length=5)
    seq = short
    with torch.no_grad():  # cached decoding (queries shorter than keys) equals full forwards
        for _ in range(4):
            seq = torch.cat([seq, gpt(seq, use_cache=False).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(gpt.generate(short, max_new_tokens=4, do_sample=False), seq)
    hf.register_hf_attentions(options={"sparse": {"window": 3}, "softmax_sh": {"factors": [1, 2]}})


def test_kernel_errors_name_the_problem():
    gpt = tiny("gpt2")
    gpt.set_attn_implementation("primaldual_linear_bn")
    ids, _ = token_batch(pad_from=None)
    with pytest.raises(ValueError, match="'linear_bn' cannot be causal"):
        gpt(ids)
    mask_fn = transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["primaldual_sparse"]
    window = transformers.masking_utils.sliding_window_causal_mask_function(4)
    with pytest.raises(ValueError, match="another pattern"):
        mask_fn(2, 7, 7, mask_function=window)
    with pytest.raises(ValueError, match="primal has parameters"):
        hf.register_hf_attentions(["primal"])
    with pytest.raises(TypeError, match="unknown option"):
        hf.register_hf_attentions(options={"sparse": {"widow": 3}})


@pytest.mark.parametrize(
    "args,error,message",
    [
        ((["sparse"], {"sparse": {"window": "4"}}), TypeError, "window must be an int >= 0, got '4'"),
        ((["sparse"], {"sparse": 4}), TypeError, "options for 'sparse' must be a mapping"),
        (("softmax_bn",), TypeError, "names must be a sequence of mechanism names"),
        ((["sparse"], [("sparse", {})]), TypeError, "options must map a mechanism name to its options"),
    ],
)
def test_registration_checks_its_arguments_and_option_values(args, error, message):
    """Option values are checked at registration, not at the model's first forward."""
    with pytest.raises(error, match=message):
        hf.register_hf_attentions(*args)
    assert hf.register_hf_attentions(["softmax_sh"], {"softmax_sh": {"factors": [1, 2]}}) == ["primaldual_softmax_sh"]
    hf.register_hf_attentions()  # every kernel back at its default options
