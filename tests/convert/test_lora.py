"""primaldual.convert.lora: low-rank adapters for stage 2. The adapted model starts where it was, only the adapters
and the students' new parameters train, every evaluation path of the primal layer sees the update, and merging gives
back a plain model with the same outputs."""

from __future__ import annotations

import warnings

import pytest
import torch

from primaldual.convert.lora import LoRAUpdate, add_lora, fold_lora, has_lora, lora_parameters, merge_lora, unfold_lora
from primaldual.convert.students import new_parameters
from primaldual.models import CausalLM


def _model(path: str = "auto", kernel: str = "torch") -> CausalLM:
    torch.manual_seed(0)
    opts = [None, {"s": 4, "path": path, "kernel": kernel}]
    return CausalLM(50, 16, dim=32, depth=2, num_heads=4, ffn_dim=64, dropout=0.0, attention=["softmax", "primal"],
                    attention_options=opts).eval()  # fmt: skip


def _ids() -> torch.Tensor:
    return torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))


def test_the_adapted_model_starts_where_it_was_and_trains_only_adapters_and_new_parameters():
    model = _model()
    ids = _ids()
    before = model(ids)
    trainable = add_lora(model, r=4, alpha=8.0)
    assert torch.allclose(model(ids), before, atol=1e-6)  # B = 0
    student = model.decoder.blocks[1].attn
    want = {id(p) for p in lora_parameters(model)} | {id(p) for p in new_parameters(student)}
    assert {id(p) for p in trainable} == want
    assert {id(p) for p in model.parameters() if p.requires_grad} == want
    assert len(lora_parameters(model)) == 2 * 4  # qkv + proj of the softmax layer, qk + proj of the primal layer


@pytest.mark.parametrize(("path", "kernel"), [("scores", "torch"), ("rotated", "torch"), ("scores", "triton")])
def test_every_primal_path_sees_the_adapter(path, kernel):
    if kernel == "triton":
        pytest.importorskip("triton")
    # the kernel runs on a CUDA device, else on the CPU under TRITON_INTERPRET=1 (tests/conftest.py)
    device = "cuda" if kernel == "triton" and torch.cuda.is_available() else "cpu"
    model = _model(path, kernel).to(device)
    add_lora(model, r=2)
    qk = model.decoder.blocks[1].attn.qk
    update = qk.parametrizations["weight"][0]
    with torch.no_grad():
        update.lora_b.normal_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernel runs (no fallback)
        loss = model(_ids().to(device)).float().pow(2).mean()
    loss.backward()
    assert update.lora_b.grad is not None and update.lora_b.grad.abs().sum() > 0
    with torch.no_grad():
        moved = model(_ids().to(device))
        update.lora_b.zero_()
        assert not torch.allclose(model(_ids().to(device)), moved, atol=1e-4)  # the update changes this path's output


def test_a_step_leaves_the_frozen_weights_and_merging_keeps_the_outputs():
    model = _model()
    names = [n for n, _ in model.named_parameters()]
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = add_lora(model, r=4)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(_ids()).logsumexp(-1).mean().backward()
        opt.step()
    adapted = {n: p for n, p in model.named_parameters() if "parametrizations" not in n}
    student = {id(p) for p in new_parameters(model.decoder.blocks[1].attn)}
    for n, p in adapted.items():
        if id(p) not in student:
            assert torch.equal(p, frozen[n]), n
    with torch.no_grad():
        out = model(_ids())
    merge_lora(model)
    assert sorted(n for n, _ in model.named_parameters()) == sorted(names)  # the original names: loads as before
    assert not any(isinstance(m, LoRAUpdate) for m in model.modules())
    with torch.no_grad():
        assert torch.allclose(model(_ids()), out, atol=1e-5)
    fresh = _model()
    fresh.load_state_dict(model.state_dict())


def test_bad_arguments_are_named():
    model = _model()
    with pytest.raises(ValueError, match="r must be"):
        add_lora(model, r=0)
    with pytest.raises(ValueError, match="targets"):
        add_lora(model, targets=())
    with pytest.raises(ValueError, match="none of .*'nope'"):
        add_lora(model, targets=("nope",))
    add_lora(_model(), r=2)
    twice = _model()
    add_lora(twice, r=2)
    with pytest.raises(ValueError, match="already has adapters"):
        add_lora(twice, r=2)


def test_a_converted_hugging_face_llama_takes_adapters():
    pytest.importorskip("transformers")
    from primaldual.convert.hf import convert_hf, hf_student_layers
    from tests.integrations.tiny_models import tiny

    teacher = tiny("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # primal does without RoPE
        model, _ = convert_hf(teacher, "hybrid", [-1], init="random", s=4, window=4, sinks=1)
    ids = torch.randint(2, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids, use_cache=False).logits
    trainable = add_lora(model, r=2, layers=hf_student_layers(model, [-1]))
    with torch.no_grad():
        assert torch.allclose(model(ids, use_cache=False).logits, before, atol=1e-5)
    model(ids, labels=ids, use_cache=False).loss.backward()
    assert all(p.grad is not None for p in lora_parameters(model))
    assert sum(p.numel() for p in trainable) < 0.2 * sum(p.numel() for p in model.parameters())


def test_a_folded_state_loads_as_a_plain_model_and_unfolds_to_the_adapted_one():
    model = _model()
    add_lora(model, r=2, alpha=4.0)
    with torch.no_grad():  # a trained adapter: B away from zero
        for m in model.modules():
            if isinstance(m, LoRAUpdate):
                m.lora_b.normal_()
    ids = _ids()
    state = model.state_dict()
    folded = fold_lora(model, state)
    assert folded and has_lora(model) and not any("parametrizations" in k for k in state)
    plain = _model()
    plain.load_state_dict(state)  # strict: a reader that knows no adapters
    torch.testing.assert_close(plain(ids), model(ids))
    unfold_lora(state, folded)
    again = _model()
    add_lora(again, r=2, alpha=4.0)
    again.load_state_dict(state)  # strict: the adapters back in their places
    torch.testing.assert_close(again(ids), model(ids))
    assert fold_lora(_model(), _model().state_dict()) == {} and not has_lora(_model())
    with pytest.raises(ValueError, match="lora entries"):
        unfold_lora(state, ["not", "a", "mapping"])
