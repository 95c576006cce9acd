"""Measurement matrices that change every round: Phi_t = Phi Pi_t, a shared-seed permutation Pi_t of
each layer's entries per round (``compression.refresh='round'``; not in seed 004).

Seed 004's Alg. 3 matrix is deterministic, and Alg. 2 keeps a layer's rate for many rounds (the
dense layer of ``cnn_pfl`` is at r_max = 0.5 in every round of every run here), so a layer is
measured by the SAME matrix round after round. Min-norm reconstruction returns the update's
projection onto Phi's row space, so the global model then only ever moves inside that fixed
subspace: with the block matrix at r = 0.5, the two weights of each block keep their initial
difference for the whole run (measured: after 20 CUAG-PFL rounds the within-block spread of w_20 -
w_0 of the dense kernel was 1.2e-7 for a movement of up to 0.94; ``experiments/RESULTS.md``). A
random matrix with a fixed seed has the same property with a random subspace. Error feedback cannot
help there either: the residual x - Rec(Phi x) lies in Phi's null space, so the next round's Phi
measures none of it.

Permuting the entries before measuring, with a permutation both sides derive from (seed, round,
layer), keeps Alg. 3's O(I) block sums and its measurement count (nothing more is sent) while every
round measures a different subspace; Phi_t Phi_t^T = Phi Phi^T, so the reconstruction's Gram solve
is unchanged. For a random matrix, permuting its columns gives another matrix of the same i.i.d.
distribution, without regenerating it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.compression.orthogonal_input import OrthogonalInput

REFRESH = ("fixed", "round")


def round_permutations(sizes, seed: int, round_index: int) -> tuple:
    """Per layer, the permutation of round ``round_index`` (host numpy from (seed, round, layer), as
    int32 device arrays: the round's input, the same on every client and at the server)."""
    return tuple(
        jnp.asarray(
            np.random.default_rng([int(seed), int(round_index), layer]).permutation(int(size)),
            jnp.int32,
        )
        for layer, size in enumerate(sizes)
    )


@dataclasses.dataclass(frozen=True)
class Permuted(OrthogonalInput):
    """``operator`` measuring x[perm]: Phi Pi."""

    operator: Any
    perm: jax.Array  # a permutation of range(size), int32

    def forward(self, x: jax.Array) -> jax.Array:
        return x[self.perm]

    def backward(self, v: jax.Array) -> jax.Array:
        """Pi^T v: entry perm[j] of the result is entry j of v."""
        return jnp.zeros_like(v).at[self.perm].set(v, unique_indices=True)


def permuted(operators: list, permutations) -> list:
    """``operators`` each permuted by its layer's permutation (``None``: the operators
    unchanged)."""
    if permutations is None:
        return operators
    return [Permuted(op, perm) for op, perm in zip(operators, permutations)]
