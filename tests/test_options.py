"""Options are checked, never coerced: each bad value gets an error naming the option (table-driven)."""

from __future__ import annotations

import math

import pytest

import primaldual as pd
from primaldual.options import check_bool, check_choice, check_device, check_int, check_number

NAN, INF = math.nan, math.inf

# (attention, option, bad value): every registered mechanism through the shared base options, then its own
BAD = [
    *((name, "causal", v) for name in ("softmax", "primal", "linear", "softmax_bn") for v in ("false", 0, None)),
    *((name, "qkv_bias", v) for name in ("softmax", "primal", "sparse") for v in ("False", 1)),
    *((name, "attn_drop", v) for name in ("softmax", "softmax_sh") for v in (-0.1, 1.0, NAN, "0.1")),
    *((name, "proj_drop", v) for name in ("softmax", "primal") for v in (2, NAN, "0")),
    ("primal", "eta", NAN),
    ("primal", "eta", INF),
    ("primal", "eta", "0.1"),
    ("primal", "eta", -0.1),
    ("primal", "eps", 0.0),
    ("primal", "eps", -1e-12),
    ("primal", "s", 0),
    ("primal", "s", 4.0),
    ("primal", "s", True),
    ("primal", "rank_multi", 0),
    ("primal", "n", 0),
    ("primal", "max_len", "29"),
    ("primal", "padding", "exactly"),
    ("primal", "ksvd_reduction", "mean"),
    ("primal", "data_dependent", "yes"),
    ("primal", "path", 1),
    ("primal", "path", "Rotated"),
    ("primal", "thresholds", 2048),
    ("primal", "thresholds", {"min_tokens_eager": 0}),
    ("linear", "chunk_size", 0),
    ("linear", "chunk_size", 2.5),
    ("linear", "eps", 0),
    ("softmax", "backend", "flash"),
    ("softmax", "scale", NAN),
    ("sparse", "window", -1),
    ("sparse", "stride", 1.5),
    ("sparse", "scale", "0.1"),
    ("softmax_bn", "beta", NAN),
    ("softmax_bn", "beta", "1"),
    ("softmax_bn", "divide_std", "false"),
    ("softmax_bn", "bn_eps", 0),
    ("softmax_bn", "stats_over", "sequence"),
    ("linear_bn", "eps", -1.0),
    ("softmax_sh", "factors", [1, 0, 2]),
    ("softmax_sh", "factors", [1, 2]),
    ("softmax_sh", "pooling", "max"),
    ("softmax_sh", "num_cls", True),
    ("linear_sh", "chunk_size", 0),
    ("softmax_bn_sh", "stats_from", "both"),
    ("linear_bn_sh", "grid", "4x4"),
]


@pytest.mark.parametrize("name,option,value", BAD, ids=[f"{n}-{o}={v!r}" for n, o, v in BAD])
def test_bad_option_is_refused_naming_it(name, option, value):
    with pytest.raises((TypeError, ValueError), match=option):
        pd.build_attention(name, 12, 3, **{option: value})


def test_good_values_pass_unchanged():
    assert check_bool("x", False) is False
    assert check_number("x", 3, low=0.0) == 3.0 and isinstance(check_number("x", 3), float)
    assert check_int("x", 4, low=1) == 4
    assert check_choice("x", "a", ("a", "b")) == "a"
    assert check_number("x", None, allow_none=True) is None


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: check_bool("flag", "true"), r"flag must be a bool .* got 'true'"),
        (lambda: check_number("lr", -1.0, low=0.0, low_open=True), r"lr must be a number > 0, got -1.0"),
        (lambda: check_number("p", 1.0, low=0.0, high=1.0, high_open=True), r"p must be a number in \[0, 1\)"),
        (lambda: check_number("p", NAN), r"p must be a finite number"),
        (lambda: check_int("depth", 0, low=1), r"depth must be an int >= 1, got 0"),
        (lambda: check_int("depth", 2.0), r"depth must be an int, got 2.0 \(float\)"),
        (lambda: check_choice("mode", 1, ("1", "2")), r"mode must be one of '1', '2'; got 1"),
    ],
)
def test_messages_name_option_value_and_allowed(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()


def test_checked_fields_run_their_own_checks_with_the_key_named():
    from dataclasses import dataclass

    from primaldual.options import check_fields, check_int, check_name, check_optional_str, checked

    @dataclass
    class Section:
        size: int = checked(4, check_int, low=1)
        clip: float | None = checked(None, check_number, " (null for none)", low=0, low_open=True, allow_none=True)
        plain: str = "anything"

    check_fields(Section(), "sec")  # the defaults pass; an unchecked field is left alone
    with pytest.raises(TypeError, match=r"sec.size must be an int >= 1, got '4' \(str\)"):
        check_fields(Section(size="4"), "sec")
    with pytest.raises(ValueError, match=r"sec.clip \(null for none\) must be a number > 0, got 0"):
        check_fields(Section(clip=0), "sec")
    assert check_name("name", "run-1") == "run-1" and check_optional_str("root", None) is None
    for bad in ("a/b", ".hidden", "", 7):
        with pytest.raises(ValueError, match="name: expected a name usable as a directory name"):
            check_name("name", bad)
    with pytest.raises(ValueError, match="root: expected a non-empty string or null"):
        check_optional_str("root", "")


def test_check_device_reads_a_torch_device_and_names_the_option():
    import torch

    assert check_device("--device", "cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"--where: expected a torch device such as cpu or cuda:0, got 'gpu:x'"):
        check_device("--where", "gpu:x")
    with pytest.raises(TypeError, match="device must be a device name"):
        check_device("device", 0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device: cuda:0 was asked for but no CUDA device is available"):
            check_device("--device", "cuda:0")
    else:
        with pytest.raises(ValueError, match="CUDA device"):
            check_device("--device", f"cuda:{torch.cuda.device_count()}")
