"""The score kernels compile natively for NVIDIA GPUs, with no GPU present: Triton's own compiler, to a cubin for
sm_80 (A100) and sm_90 (H100 / H200), with the constants and warps a layer launches them with (width 768, 12 heads,
s = 20).

The interpreter tests check what the kernels compute; only a native compile checks what the interpreter lets pass
(the shapes and dtypes of ``tl.dot`` on the tensor cores, the scan's lowering, constexpr branches), and ``ptxas -v``
says what each thread uses: registers, and bytes spilled to local memory, which no half-precision kernel may do.
It runs in a child process: ``TRITON_INTERPRET=1`` (set for the test session) turns every ``@triton.jit`` function
into an interpreted one at import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="the kernels extra (triton) is not installed")

ROOT = Path(__file__).resolve().parents[2]

# (GPU architecture, dtype, causal, masked, energies, bias): a Hopper and an Ampere card, half and full precision
CASES = [
    (90, "bfloat16", True, True, True, True),  # every feature at once, as a causal padded training step uses them
    (90, "float32", False, False, False, False),  # float32 products in IEEE precision
    (80, "bfloat16", False, True, True, True),
    (90, "float16", False, False, True, False),
]

SCRIPT = r"""
import json, re, subprocess, sys, tempfile
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from primaldual.kernels import primal_scores as ks

TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
INPUTS = {"x_ptr", "w_ptr", "b_ptr", "wes_ptr", "out_ptr", "g_ptr", "dqk_ptr"}  # in x's dtype; the rest float32


# registers and spill stores per thread, from ptxas -v on the kernel's PTX (None where this Triton does not say which
# ptxas it uses, or its answer cannot be read)
def usage(ptx, arch):
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(ptx)
            f.flush()
            gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
            cmd = [get_ptxas(arch).path, "-v", f"--gpu-name={gpu}", f.name, "-o", "/dev/null"]
            log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        return int(re.search(r"Used (\d+) registers", log)[1]), int(re.search(r"(\d+) bytes spill stores", log)[1])
    except Exception:
        return None, None


@triton.jit
def probe(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


# the toolchain itself first: where this Triton cannot build a trivial kernel for an architecture (no working ptxas,
# another ASTSource interface), the test is skipped with the reason; only a failure of our kernels fails it
for arch in sorted({case[0] for case in json.loads(sys.argv[1])}):
    try:
        triton.compile(ASTSource(fn=probe, signature={"x_ptr": "*fp32"}, constexprs={}), target=GPUTarget("cuda", arch, 32))
    except Exception as err:
        print(json.dumps({"skip": f"Triton cannot build a trivial kernel for sm_{arch} here: {type(err).__name__}: {err}"[:500]}))
        sys.exit(0)


def compile_(fn, dtype, consts, arch):
    sig = {}
    consts = dict(consts)
    warps = consts.pop("num_warps", 4)
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + (TYPES[dtype] if name in INPUTS else "fp32")
        else:
            sig[name] = "fp32" if name == "eps" else "i32"
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    registers, spilled = usage(kernel.asm["ptx"], arch)
    return {
        "cubin_bytes": len(kernel.asm["cubin"]),
        "shared_bytes": kernel.metadata.shared,
        "registers": registers,
        "spill_store_bytes": spilled,
        "half": dtype != torch.float32,
    }


out = {}
for arch, dtype, causal, masked, energy, bias in json.loads(sys.argv[1]):
    dtype = getattr(torch, dtype)
    B, N, C, H, P, S = 1, 65536, 768, 12, 64, 20
    meta = {"device": "meta", "dtype": dtype}
    x, wq, w = torch.empty(B, N, C, **meta), torch.empty(2 * H * P, C, **meta), torch.empty(2, H, P, S, **meta)
    b = torch.empty(2 * H * P, **meta) if bias else None
    m = torch.empty(B, N, device="meta") if masked else None
    T = triton.cdiv(N, 64)
    carry = (torch.empty(B, T, C, device="meta"), torch.empty(B, T, device="meta")) if causal else None
    consts = ks._launch(x, wq, b, w, m, carry, energy).meta  # what the layer launches with
    tag = f"sm{arch}-{TYPES[dtype]}-causal{int(causal)}-masked{int(masked)}-energy{int(energy)}"
    out[f"fwd-{tag}"] = compile_(ks._scores_fwd, dtype, {**consts, "STORE_INV": False}, arch)
    out[f"bwd-{tag}"] = compile_(ks._scores_bwd, dtype, consts, arch)
    if causal:
        sums = {"HAS_MASK": masked, "BLOCK_M": 64, "BLOCK_K": ks.BLOCK_K}
        out[f"tile_sums-{tag}"] = compile_(ks._tile_sums, dtype, sums, arch)
print(json.dumps(out))
"""


def test_the_kernels_compile_for_ampere_and_hopper(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton's default, said explicitly (it warns otherwise)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    script = tmp_path / "compile_kernels.py"  # a file: Triton reads a @jit function's source from its file
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(CASES)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in compiled:
        pytest.skip(compiled["skip"])
    assert len(compiled) == 2 * len(CASES) + 1
    for name, info in compiled.items():
        assert info["cubin_bytes"] > 0, name
        # within an A100's shared memory per block (164 KB), with room to spare
        assert info["shared_bytes"] < 100_000, (name, info)
        if info["registers"] is not None and info["half"]:
            assert info["spill_store_bytes"] == 0, (name, info)  # half precision: everything stays in registers
