"""Small helpers shared by the data, training, benchmark and analysis modules (standard library only).

:mod:`primaldual.utils.io`: atomic file and directory writes, JSON writes and SHA-256 checksums.
"""
