"""Benchmarks: layer sweeps (``primaldual bench layers``), LRA-style training steps and plots.

Needs the ``bench`` extra (matplotlib, psutil, and the peers performer-pytorch / nystrom-attention).
"""
