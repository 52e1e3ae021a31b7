"""primaldual.convert.hf: conversion of a Hugging Face Llama (grouped K / V heads, RoPE) with the teacher-based
initialisation and stage 1."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.integrations.tiny_models import tiny

pytest.importorskip("transformers")
from primaldual.convert.hf import convert_hf, hf_attention_io, hf_student_layers  # noqa: E402


def _batches(seed: int = 0, n: int = 16):
    g = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randint(2, 50, (4, n), generator=g), None


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def test_covering_window_hybrid_is_the_teacher_and_stage_one_loss_is_zero():
    """With a window covering the sequence the rotated window branch is the teacher's softmax: the initialised
    student gives the teacher's logits, and stage 1 starts at zero loss (the KSVD term then moves the branch a
    little: the later rows stay small)."""
    teacher = tiny("llama")
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    model, _ = convert_hf(teacher, "hybrid", "all", batches=_batches(), window=64, sinks=1, s=4)
    ids = next(_batches(5))[0]
    torch.testing.assert_close(_logits(model, ids), _logits(teacher, ids), rtol=0, atol=1e-5)
    _, report = convert_hf(teacher, "hybrid", "all", batches=_batches(), steps=3, log_every=1, window=64, sinks=1, s=4)
    assert report["history"][0]["loss"] < 1e-10 and max(r["loss"] for r in report["history"]) < 1e-3
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())  # teacher forcing leaves it


def test_ksvd_initialisation_gives_j_zero_and_stage_one_trains_new_parameters_only():
    teacher = tiny("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # primal does without RoPE (tested in the integration tests)
        model, report = convert_hf(teacher, "primal", (-1,), batches=_batches(), steps=4, log_every=1, s=4)
    assert report["layers"] == [1] and abs(report["init"][1]["J"]) < 1e-8 and report["init"][1]["rebuild_error"] < 1e-5
    assert 0 <= report["init"][1]["lstsq_residual"] <= 1
    assert len(report["history"]) == 4
    changed = {
        k
        for k, v in model.state_dict().items()
        if k in teacher.state_dict() and not torch.equal(v, teacher.state_dict()[k])
    }
    assert changed == set()  # the projections the student shares with the teacher are frozen in stage 1
    layer = hf_student_layers(model, [1])[0]
    assert layer.w_e.requires_grad  # trainable again afterwards, for stage 2


def test_teacher_io_carries_the_rotary_tables():
    teacher = tiny("llama")
    ids = next(_batches())[0]
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ((x, y, rope),) = hf_attention_io(teacher, ids, mask, [0])
    assert x.shape == y.shape == (4, 16, 32) and rope[0].shape == (4, 16, 8)
    assert not y[0, :3].any()  # padded positions are zero, as the students' outputs


def test_bad_arguments_are_named():
    teacher = tiny("llama")
    with pytest.raises(ValueError, match="student must be one of"):
        convert_hf(teacher, "linear")
    with pytest.raises(ValueError, match="primal_branch: set by the student 'window'"):
        convert_hf(teacher, "window", primal_branch=True)
    with pytest.raises(ValueError, match="batches: needed"):
        convert_hf(teacher, "hybrid", "all", window=4)
    with pytest.raises(ValueError, match="init must be one of"):
        convert_hf(teacher, "hybrid", init="zeros")


def test_gpt2_converts_the_same_way():
    """A teacher without rotary embeddings (GPT-2): the covering-window hybrid reproduces it after the init."""
    teacher = tiny("gpt2")
    model, report = convert_hf(teacher, "hybrid", "all", batches=_batches(), window=64, sinks=1, s=4)
    assert set(report["init"]) == {0, 1}
    ids = next(_batches(7))[0]
    torch.testing.assert_close(_logits(model, ids), _logits(teacher, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "name", ["qwen2", "phi3", "smollm3", "opt", "qwen3", "olmo2", "gemma3_text", "gpt_neox", "phi"]
)
def test_llama_layout_types_convert_with_the_initialisation(name):
    """Qwen2 (q / k / v biases), Phi-3 (the fused qkv_proj), SmolLM3 (a NoPE layer), OPT (no rotary tables at
    all), Qwen3 and Gemma 3 (query / key norms per head), OLMo 2 (over all heads), GPT-NeoX and Phi-2 (partial
    rotary): the covering-window hybrid, initialised from the teacher, gives its logits, and stage 1 starts at zero
    loss."""
    teacher = tiny(name)
    model, _ = convert_hf(teacher, "hybrid", "all", batches=_batches(), window=64, sinks=1, s=4)
    ids = next(_batches(5))[0]
    torch.testing.assert_close(_logits(model, ids), _logits(teacher, ids), rtol=0, atol=1e-5)
    _, report = convert_hf(teacher, "hybrid", "all", batches=_batches(), steps=1, log_every=1, window=64, sinks=1, s=4)
    assert report["history"][0]["loss"] < 1e-10


# ---------------------------------------------------------------------------------------------------------------
# bidirectional encoders: BERT's post-norm block, ViT's images (a batch as a mapping of the model's inputs)


def _token_batches(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    while True:
        ids = torch.randint(2, 50, (8, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[::2, 8:] = 0
        yield ids.masked_fill(mask == 0, 1), mask


@pytest.mark.parametrize("name", ["bert", "distilbert"])
def test_an_encoders_recorded_output_is_its_attention_before_the_residual_and_norm(name):
    """BERT's replaced module returns norm(attention + x): the transfer target is the attention alone, which the
    teacher's own layer rebuilt as a primaldual softmax layer gives on the recorded input."""
    from primaldual.convert.hf import hf_teacher_layer

    teacher = tiny(name)
    ids, mask = next(_token_batches())
    ((x, y, rope),) = hf_attention_io(teacher, ids, mask, [1])
    assert rope is None
    expected = hf_teacher_layer(teacher, 1)(x, mask.bool())
    torch.testing.assert_close(y, expected.masked_fill(~mask.bool()[..., None], 0.0), rtol=0, atol=1e-5)


def test_bert_converts_to_a_bidirectional_primal_student_and_stage_one_lowers_its_error():
    teacher = tiny("bert")
    model, report = convert_hf(
        teacher, "primal", "all", batches=_token_batches(), steps=20, lr=3e-3, log_every=5, s=4, max_len=12
    )
    layers = hf_student_layers(model, [0, 1])
    assert all(not layer.causal and layer.data_dependent for layer in layers)  # the paper's bidirectional layer
    assert all(abs(report["init"][i]["J"]) < 1e-6 for i in (0, 1))
    assert report["history"][-1]["loss"] < report["history"][0]["loss"] < 1
    ids, mask = next(_token_batches(3))
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert out.shape == (8, 12, 32) and torch.isfinite(out).all()


def test_a_vision_transformer_converts_from_batches_of_pixel_values():
    teacher = tiny("vit")
    g = torch.Generator().manual_seed(0)
    # a calibration batch of 24 images: 8 n / p = 20 at least for the data-dependent fit
    images = ({"pixel_values": torch.randn(24 if i == 0 else 4, 3, 16, 16, generator=g)} for i in range(8))
    model, report = convert_hf(teacher, "primal", [-1], batches=images, steps=4, log_every=2, s=4)
    layer = hf_student_layers(model, [1])[0]
    assert layer.data_dependent and layer.n == 40  # s * rank_multi: sampled positions repeat over the 17 tokens
    assert "weights_residual" in report["init"][1] and len(report["history"]) == 3
    fixed, report = convert_hf(teacher, "primal", [-1], batches=images, s=4, data_dependent=False)
    assert not hf_student_layers(fixed, [1])[0].data_dependent and "weights_residual" not in report["init"][1]


def test_encoders_refuse_window_students_and_malformed_batches():
    teacher = tiny("bert")
    with pytest.raises(ValueError, match="student 'hybrid' is causal only"):
        convert_hf(teacher, "hybrid", [-1], batches=_token_batches())
    with pytest.raises(TypeError, match="batches: each batch is"):
        convert_hf(teacher, "primal", [-1], batches=iter([torch.zeros(2, 3, dtype=torch.long)]), s=4)
    with pytest.raises(ValueError, match="carries its own attention_mask"):
        hf_attention_io(teacher, {"input_ids": torch.ones(2, 3, dtype=torch.long)}, torch.ones(2, 3), [0])


W = 4  # a sliding window shorter than the batches


def _sliding(name: str):
    layers = ["sliding_attention", "full_attention"]
    overrides = {"sliding_window": W} if name == "mistral" else {"layer_types": layers, "sliding_window": W}
    return tiny(name, **overrides)


def _calibration(n: int = 12, length: int = 10):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 50, (n, length), generator=g)
    return [(ids, torch.ones_like(ids))]


def test_convert_hf_rebuilds_a_sliding_teacher_and_keeps_its_window():
    """The teacher check rebuilds a sliding layer as sparse softmax on its window (0 error); the window student with
    the teacher's window is the teacher; a hybrid window wider than the teacher's is refused."""
    teacher = _sliding("mistral")
    batches = _calibration()
    model, report = convert_hf(teacher, "window", "all", batches=batches, window=W, sinks=0)
    assert all(row["rebuild_error"] < 1e-5 for row in report["init"].values())
    ids = batches[0][0]
    torch.testing.assert_close(_logits(model, ids), _logits(teacher, ids), rtol=0, atol=2e-5)
    with pytest.raises(ValueError, match=r"window: layer 0 of the teacher slides a window of 4 keys; the hybrid "
                                         r"student's window of 64 keys would see more than the teacher did: pass "
                                         "window=4 or less"):  # fmt: skip
        convert_hf(teacher, "hybrid", "all", batches=batches)


def test_convert_hf_primal_students_on_a_capped_sliding_teacher():
    """Gemma 2 (capped logits, a sliding layer): the teacher check rebuilds the sliding layer as capped sparse softmax,
    and the primal students train in stage 1."""
    teacher = _sliding("gemma2")
    with pytest.warns(UserWarning, match="sliding window"):
        model, report = convert_hf(teacher, "primal", "all", batches=_calibration() * 3, steps=2, s=4)
    assert all(row["rebuild_error"] < 1e-5 for row in report["init"].values())
    assert len(report["history"]) >= 1 and all(torch.isfinite(torch.tensor(r["loss"])) for r in report["history"])


def test_convert_hf_refuses_a_calibration_batch_padded_inside_for_a_sliding_teacher():
    teacher = _sliding("mistral")
    ids, mask = _calibration()[0]
    mask = mask.clone()
    mask[0, 3] = 0
    with pytest.raises(ValueError, match=r"the batch's attention_mask has padding between real tokens \(row 0\)"):
        convert_hf(teacher, "hybrid", "all", batches=[(ids, mask)], window=W, sinks=0, s=4)
