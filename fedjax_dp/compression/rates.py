"""Compression rates per layer: CUAG-PFL's dynamic layer-wise rule (seed 004, Alg. 2) or fixed.

Alg. 2, from a pytree W (the initial weights in round 0, else the last reconstructed aggregate):
    weight_l = ||W_l||_2 / ||W||_2
    if weight_l < r_min:                 r_l = round(r_max - round(weight_l, 2), 1)
    elif round(weight_l, 1) < r_max:     r_l = round(weight_l, 1)
    else:                                r_l = r_max
Rates decide array shapes (b_l = floor(r_l I_l) measurements), so they are computed on the host with
Python's ``round`` (round-half-even, as in the paper's Python code) and are static per round.
"""

from __future__ import annotations

import jax
import numpy as np


def validate_rate(rate: float, name: str = "rate") -> float:
    if not 0 < rate <= 1:
        raise ValueError(f"compression {name} must lie in (0, 1], got {rate}")
    return float(rate)


def dynamic_rate(weight: float, r_min: float = 0.2, r_max: float = 0.5) -> float:
    """Alg. 2's rate for one layer whose norm share is ``weight`` = ||W_l|| / ||W||."""
    validate_rate(r_min, "r_min")
    validate_rate(r_max, "r_max")
    if r_min > r_max:
        raise ValueError(f"r_min={r_min} exceeds r_max={r_max}")
    if weight < r_min:
        return round(r_max - round(weight, 2), 1)
    if round(weight, 1) < r_max:
        return round(weight, 1)
    return r_max


def dynamic_rates(reference, r_min: float = 0.2, r_max: float = 0.5):
    """Alg. 2 over a pytree: a pytree of Python floats with ``reference``'s structure."""
    leaves, treedef = jax.tree_util.tree_flatten(reference)
    if not leaves:
        raise ValueError("cannot compute compression rates of an empty pytree")
    norms = np.array([float(np.linalg.norm(np.asarray(x, np.float64))) for x in leaves])
    total = float(np.sqrt(np.sum(norms**2)))
    if total == 0:
        raise ValueError("the reference weights are all zero: Alg. 2's norm shares are undefined")
    return jax.tree_util.tree_unflatten(
        treedef, [dynamic_rate(n / total, r_min, r_max) for n in norms]
    )


def fixed_rates(reference, rate: float):
    """The same rate for every layer (the paper's fixed-rate baselines 0.5 / 0.4 / 0.3)."""
    validate_rate(rate)
    return jax.tree_util.tree_map(lambda _: float(rate), reference)
