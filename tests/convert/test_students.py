"""The swap: students built from a trained softmax layer's projections, the teacher left as it was."""

from __future__ import annotations

import pytest
import torch

from primaldual.attention.hybrid import HybridAttention
from primaldual.attention.primal import PrimalAttention
from primaldual.convert import STUDENTS, find_blocks, new_parameters, student_plan, swap_attention
from primaldual.models import CausalLM


def _teacher() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(50, 32, dim=16, depth=3, num_heads=2, ffn_dim=32, dropout=0.0).double()


@pytest.mark.parametrize("student", sorted(STUDENTS))
def test_swap_copies_the_projections_and_leaves_the_teacher(student):
    teacher = _teacher()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    model, layers = (
        swap_attention(teacher, student, [-1], s=4) if student != "window" else swap_attention(teacher, student, [-1])
    )
    assert layers == [2]
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    t, s = find_blocks(teacher)[2].attn, find_blocks(model)[2].attn
    assert find_blocks(model)[2].attention_name == STUDENTS[student][0]
    assert isinstance(find_blocks(model)[0].attn, type(find_blocks(teacher)[0].attn))
    if isinstance(s, PrimalAttention):
        torch.testing.assert_close(s.qk.weight, t.qkv.weight[:32])
    else:
        assert isinstance(s, HybridAttention)
        torch.testing.assert_close(s.qkv.weight, t.qkv.weight)
        assert s.has_branch == (student == "hybrid")
    torch.testing.assert_close(s.proj.weight, t.proj.weight)
    assert (len(new_parameters(s)) == 0) == (student == "window")


def test_window_covering_the_sequence_is_the_teacher():
    teacher = _teacher().eval()
    model, _ = swap_attention(teacher, "window", "all", window=32)
    ids = torch.randint(0, 50, (3, 20))
    torch.testing.assert_close(model.eval()(ids), teacher(ids))


def test_student_plan_lists_the_per_layer_attention():
    names, options = student_plan(4, "window", [3], window=16)
    assert names == ["softmax", "softmax", "softmax", "hybrid"]
    assert options == [None, None, None, {"primal_branch": False, "window": 16}]


def test_bad_students_and_layers_are_clear_errors():
    teacher = _teacher()
    with pytest.raises(ValueError, match="student must be one of"):
        swap_attention(teacher, "linear")
    with pytest.raises(IndexError, match="out of range"):
        swap_attention(teacher, "primal", [5])
    with pytest.raises(ValueError, match="primal_branch: set by the student"):
        swap_attention(teacher, "window", primal_branch=True)
    converted, _ = swap_attention(teacher, "primal", [0])
    with pytest.raises(ValueError, match="not a softmax teacher layer"):
        swap_attention(converted, "primal", [0])
    with pytest.raises(TypeError, match="CausalLM"):
        swap_attention(torch.nn.Linear(2, 2), "primal")


def test_the_window_student_refuses_the_primal_branch_options():
    from primaldual.attention.hybrid import HybridAttention

    with pytest.raises(ValueError, match="s: an option of the primal branch, which primal_branch=False drops"):
        HybridAttention(16, 2, window=4, primal_branch=False, s=3, causal=True)
    HybridAttention(16, 2, window=4, primal_branch=False, causal=True)  # window and sinks alone


def test_a_teacher_with_query_key_norms_passes_them_on():
    """The window / hybrid students take the teacher's norms (a covering window is the teacher again); the primal
    student has none and says so."""
    torch.manual_seed(0)
    kw = dict(dim=16, depth=2, num_heads=2, ffn_dim=32, dropout=0.0, attention_options={"qk_norm": "all_heads"})
    teacher = CausalLM(50, 32, **kw).double().eval()
    with torch.no_grad():
        for name, p in teacher.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 1.5)
    model, _ = swap_attention(teacher, "window", "all", window=32)
    assert find_blocks(model)[1].attn.qk_norm == "all_heads"
    ids = torch.randint(0, 50, (3, 20))
    torch.testing.assert_close(model.eval()(ids), teacher(ids))
    with pytest.warns(UserWarning, match="student 'primal' takes no query / key norms"):
        swap_attention(teacher, "primal", [-1], s=4)
