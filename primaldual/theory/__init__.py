"""Numerical checks of the papers' theory (import the submodules directly; they may need the `theory` extra)."""
