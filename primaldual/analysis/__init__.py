"""Analyses of trained or random models (import the submodules: ``redundancy``, ``capture``, ``spectrum``)."""
