"""Stage 1: teacher-forced, layer-wise attention transfer."""

from __future__ import annotations

import torch

from primaldual.convert import attention_transfer, convert, find_blocks, teacher_attention_io
from primaldual.models import CausalLM


def _teacher() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(50, 64, dim=32, depth=2, num_heads=2, ffn_dim=64, dropout=0.1, positions="learned")


def _batches(n: int, seed: int = 1, B: int = 8, N: int = 32):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        yield torch.randint(0, 50, (B, N), generator=g), None


def test_teacher_forcing_records_each_layer_and_leaves_the_teacher_unchanged():
    teacher = _teacher().train()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    ids = torch.randint(0, 50, (2, 12))
    io = teacher_attention_io(teacher, ids, None, [0, 1])
    assert teacher.training  # its mode is restored
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    blocks = find_blocks(teacher.eval())
    for (x, y), block in zip(io, blocks):
        assert x.shape == y.shape == (2, 12, 32)
        torch.testing.assert_close(block.attn(x), y)  # the recorded output is the layer's on the recorded input
    # after a stage 1 the teacher is still untouched
    convert(teacher, "primal", "all", batches=_batches(6), steps=5, s=8)
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())


def test_stage1_makes_the_hybrid_exact_when_the_window_covers_the_sequence():
    teacher = _teacher()
    for init in ("random", "teacher"):
        model, report = convert(
            teacher, "hybrid", "all", batches=_batches(60), steps=50, init=init, lr=3e-3, s=8, window=64, eta=0.0
        )
        last = report["history"][-1]
        assert last["loss"] < 1e-4, (init, report["history"][0], last)
        ids = torch.randint(0, 50, (2, 32))
        teacher.eval(), model.eval()
        assert (model(ids) - teacher(ids)).abs().max() < 0.05 * teacher(ids).abs().max()


def test_stage1_lowers_the_primal_students_loss_and_trains_only_new_parameters():
    teacher = _teacher()
    model, report = convert(teacher, "primal", [-1], batches=_batches(40), steps=30, init="random", lr=3e-3, s=8)
    first, last = report["history"][0], report["history"][-1]
    assert last["loss"] < first["loss"]
    assert {"ksvd", "loss/layer1"} <= set(last) and any(k.startswith("J2/") for k in last)
    t, s = find_blocks(teacher)[1].attn, find_blocks(model)[1].attn
    torch.testing.assert_close(s.qk.weight, t.qkv.weight[:64])  # frozen in stage 1
    torch.testing.assert_close(find_blocks(model)[0].ffn.net[0].weight, find_blocks(teacher)[0].ffn.net[0].weight)
    assert all(p.requires_grad for p in model.parameters())  # unfrozen again for stage 2


def test_transfer_resumes_from_its_state():
    teacher = _teacher()
    model, _ = convert(teacher, "primal", [-1], init="random", s=4)
    state = attention_transfer(teacher, model, [1], _batches(3), 3)
    assert state.step == 3
    state = attention_transfer(teacher, model, [1], _batches(2), 5, state=state)
    assert state.step == 5 and state.history[-1]["step"] == 5


def test_the_docs_python_example_runs():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "conversion.md").read_text()
    code = re.findall(r"```python\n(.*?)```", doc, re.S)[0]
    scope: dict = {}
    exec(compile(code, "docs/conversion.md", "exec"), scope)
    assert abs(scope["report"]["init"][0]["J"]) < 1e-3 and len(scope["report"]["history"]) == 2
