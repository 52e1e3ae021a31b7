"""Kernel tests run natively on a CUDA device, else in Triton's interpreter on CPU tensors (set before the kernel
modules are imported: ``triton.jit`` reads it when it decorates)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
