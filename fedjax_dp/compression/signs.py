"""Random signs before measuring: Phi D, D a shared-seed diagonal of +-1 per entry
(``compression.signs='random'``; not in seed 004).

Alg. 3's block rows sum disjoint blocks, so their sum is the all-ones vector: the constant direction
of every layer lies in the row space and the min-norm reconstruction keeps a layer's mean shift
whole while it keeps about a fraction r of every other direction (``permuted`` or not: any block
partition sums to all-ones). Measured on CIFAR-100 ACID3, where the cohort's first mean update is
largely such a shift, that makes the compressed step switch every unit off (experiments/RESULTS.md,
seed 004, "The block matrix keeps each layer's mean shift whole";
``experiments/compression_direction_probe.py``).

Flipping each entry's sign with a fixed +-1 draw both sides derive from (seed, layer) first makes
every row a +-1
pattern: the constant vector is no longer in the row space, and every direction, the constant one
included, is kept about alike, as by a random matrix, at Alg. 3's O(I) cost and the same measurement
count. D D^T = I, so (Phi D)(Phi D)^T = Phi Phi^T: the reconstruction's Gram solve is unchanged and
Rec stays the orthogonal projection onto the (rotated) row space, never increasing a norm (a clip
before it still bounds what is sent).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.compression.orthogonal_input import OrthogonalInput

SIGNS = ("none", "random")
# keeps the sign draws apart from ``refresh``'s permutations of the same (seed, layer)
_STREAM = 0x5167


@functools.lru_cache(maxsize=8)
def layer_signs(sizes: tuple, seed: int) -> tuple:
    """Per layer, its +-1 signs (float32 device arrays, from (seed, layer) on the host: the same on
    every client and at the server, every round)."""
    return tuple(
        jnp.asarray(
            np.random.default_rng([int(seed), _STREAM, layer]).choice([-1.0, 1.0], int(size)),
            jnp.float32,
        )
        for layer, size in enumerate(sizes)
    )


@dataclasses.dataclass(frozen=True)
class Signed(OrthogonalInput):
    """``operator`` measuring D x: Phi D."""

    operator: Any
    signs: jax.Array  # +-1 per entry

    def forward(self, x: jax.Array) -> jax.Array:
        return self.signs * x

    def backward(self, v: jax.Array) -> jax.Array:
        return self.signs * v  # D^T = D


def signed(operators: list, signs) -> list:
    """``operators`` each with its layer's signs (``None``: the operators unchanged)."""
    if signs is None:
        return operators
    return [Signed(op, s) for op, s in zip(operators, signs)]
