"""Plain, obviously-correct reference implementations (one module per mechanism).

They favour clarity over speed: explicit score matrices, explicit masks, loops where loops are clearer.
The tests compare every fast path against them, forward and gradients, in float64.
"""
