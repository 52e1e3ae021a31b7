"""Every registered mechanism on a CUDA device, against its float64 CPU result (skipped without a GPU).

The registry-wide checks (``test_registry_wide``) run on the CPU in CI; these repeat the ones a device can break
(kernel choice, TF32, autocast, graph-free decoding state on the device) where a GPU is present. The prepared GPU
run (``benchmarks/gpu_suite.py``) runs them first and times nothing if they fail.
"""

from __future__ import annotations

import pytest
import torch

import primaldual as pd
from primaldual.aux_loss import collect_aux_loss
from tests.attention.test_registry_wide import CASES, DIM, HEADS, N
from tests.conftest import rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _layer(name: str, opts: dict, causal: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return pd.build_attention(name, DIM, HEADS, causal=causal, dtype=torch.float64, **opts).eval()


def _loss_and_grads(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, list]:
    x = x.detach().requires_grad_(True)
    out = layer(x, mask)
    aux = collect_aux_loss(layer)
    (out.pow(2).sum() + (aux if aux is not None else 0.0)).backward()
    grads = [x.grad] + [p.grad for p in layer.parameters() if p.requires_grad]
    return out.detach(), grads


def _inputs(b: int = 2, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    x = torch.randn(b, n, DIM, dtype=torch.float64)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, n - 4 :] = False
    return x, mask


def _worst_float32_gap(name: str, opts: dict, causal: bool) -> tuple[float, str]:
    """The largest ratio of the GPU's float32 error to its bound over output and gradients, and where it is.

    The bound is 1e-3, or 10x the CPU's own float32 error where the mechanism is worse conditioned than that (the
    causal BN-SH gradients divide by the spread of short prefixes): a device bug shows as a gap far above it."""
    ref = _layer(name, opts, causal)
    cpu32 = _layer(name, opts, causal).float()
    dev = _layer(name, opts, causal).to("cuda", torch.float32)
    x, mask = _inputs()
    out_ref, g_ref = _loss_and_grads(ref, x, mask)
    out_32, g_32 = _loss_and_grads(cpu32, x.float(), mask)
    out, g = _loss_and_grads(dev, x.to("cuda", torch.float32), mask.cuda())
    assert torch.isfinite(out).all()
    worst = (rel_err(out.cpu(), out_ref) / max(1e-3, 10 * rel_err(out_32, out_ref)), "output")
    for i, (a, b, c) in enumerate(zip(g, g_ref, g_32)):
        if b is None:
            assert a is None or not a.abs().any(), f"gradient {i}"
            continue
        assert a is not None, f"gradient {i} is missing on the GPU"
        worst = max(worst, (rel_err(a.cpu(), b) / max(1e-3, 10 * rel_err(c, b)), f"gradient {i}"))
    return worst


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_cuda_float32_matches_cpu_float64(name, opts, causal):
    """Output, input gradient and every parameter gradient, float32 on the GPU against float64 on the CPU.

    On a failure the case runs again with TF32 off everywhere and with SDPA's math backend alone, and the message
    says which of them closes the gap: reduced-precision kernels chosen by the defaults, or our own code."""
    ratio, where = _worst_float32_gap(name, opts, causal)
    if ratio < 1:
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        no_tf32 = _worst_float32_gap(name, opts, causal)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    with sdpa_kernel(SDPBackend.MATH):
        math_only = _worst_float32_gap(name, opts, causal)
    pytest.fail(
        f"{where} is {ratio:.1f}x its bound; with TF32 off: {no_tf32[0]:.2f}x ({no_tf32[1]}); "
        f"SDPA math backend only: {math_only[0]:.2f}x ({math_only[1]}); "
        f"defaults: matmul TF32 {flags[0]}, cuDNN TF32 {flags[1]}"
    )


@pytest.mark.parametrize("name,opts,causal", CASES)
def test_cuda_bfloat16_autocast_is_close(name, opts, causal):
    """Under bf16 autocast the output stays within bf16 rounding of the float64 result."""
    ref = _layer(name, opts, causal)
    dev = _layer(name, opts, causal).to("cuda", torch.float32)
    x, mask = _inputs()
    with torch.no_grad():
        out_ref = ref(x, mask)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = dev(x.to("cuda", torch.float32), mask.cuda())
    assert torch.isfinite(out).all()
    assert rel_err(out.float().cpu(), out_ref) < 5e-2


@pytest.mark.parametrize("name,opts,causal", [c for c in CASES if c.values[2]])
def test_cuda_decoding_equals_causal_forward(name, opts, causal):
    """step() on the GPU reproduces the GPU's causal forward at every position (left-padded prompts)."""
    layer = _layer(name, opts, causal).to("cuda", torch.float32)
    x, _ = _inputs(3, N + 4)
    x = x.to("cuda", torch.float32)
    mask = torch.ones(3, N + 4, dtype=torch.bool, device="cuda")
    mask[1, :3] = False
    mask[2, :7] = False
    with torch.no_grad():
        full = layer(x, mask)
        state = layer.init_state(3, device="cuda", dtype=torch.float32)
        for t in range(N + 4):
            y_t, state = layer.step(x[:, t], state, mask[:, t])
            assert rel_err(y_t, full[:, t]) < 1e-4, f"position {t}"


@pytest.mark.parametrize("causal", [False, True])
def test_cuda_primal_at_benchmark_width(causal):
    """The benchmarked primal layer (C = 768, H = 12, s = 20, N = 1024) in bf16 against float64 on the CPU."""
    torch.manual_seed(0)
    ref = pd.build_attention("primal", 768, 12, causal=causal, s=20, dtype=torch.float64).eval()
    dev = pd.build_attention("primal", 768, 12, causal=causal, s=20, dtype=torch.float64).eval()
    dev.load_state_dict(ref.state_dict())
    dev = dev.to("cuda", torch.bfloat16)
    x = torch.randn(2, 1024, 768, dtype=torch.float64)
    with torch.no_grad():
        out_ref = ref(x)
        out = dev(x.to("cuda", torch.bfloat16))
    assert torch.isfinite(out).all()
    assert rel_err(out.double().cpu(), out_ref) < 5e-2
