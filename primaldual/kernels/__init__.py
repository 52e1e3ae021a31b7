"""Fused GPU kernels (Triton) for the primal layer: optional, behind ``PrimalAttention(kernel="triton")``.

Needs the ``kernels`` extra (``pip install 'primaldual[kernels]'``). Each module holds one kernel and the
``torch.autograd.Function`` that wraps it; ``TRITON_INTERPRET=1`` runs them on CPU tensors (the CI tests).
"""
