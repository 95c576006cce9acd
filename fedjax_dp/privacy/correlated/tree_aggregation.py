"""Binary-tree aggregation as a matrix factorization (Dwork et al. 2010, Chan et al. 2011; DP-FTRL
of Kairouz et al. 2021, "Practical and Private (Deep) Learning without Sampling or Shuffling", Sec.
3): the prefix sums A x (A the lower-triangular ones) are released as B (C x + Z), where row s of C
sums the rounds of the dyadic node ending at s, (s - lowbit(s), s], and row t of B adds the nodes of
t's binary decomposition. A = B C, so the noise the server adds in round t is row t of C^{-1} Z =
A^{-1} B Z, the difference of two prefix noises:

    w_t = z_t - sum of the node noises at the levels below level(t) = ctz(t),

after which the node of level(t) holds z_t and the levels below it are empty (the decomposition of t
replaced them). The stream keeps one buffer per level: O(log n x parameters), independent of the
round index.

Column t of C has a 1 in each row whose node contains t (at most one per level), so C^T C >= 0 and
the min-separation bound of ``participation.sensitivity`` is exact.

DP-FTRL's tree restart (Kairouz et al. 2021, Sec. 4, "TreeRestart"): a new tree every ``period``
rounds (their
epoch: each example once per tree), so C is block diagonal with a tree over ``period`` leaves per
block. A client that takes part at most once in any ``period`` consecutive rounds (``period`` <= the
min-separation b) then has at most one participation per tree, and its columns in different trees
are orthogonal: the sensitivity grows as the square root of its participations, where one tree over
the whole run adds the overlap of every pair of them. The stream resets its buffers at each restart;
the noise already added stays in the model (the next tree's prefix sums start from the released
ones).

Honaker's efficient estimator (Honaker 2015, "Efficient Use of Differentially Private Binary Trees";
TensorFlow Privacy's ``EfficientTreeAggregator``, which DP-FTRL runs) releases every node of the
tree, each with its own noise (C: all the dyadic nodes completed so far, a rectangular
factorization), and estimates a node bottom-up from its own release v and its children's: value = v
+ (left + right) / 2, read with weight 1 / (2 - 2^-level), the inverse-variance combination (a
node's noise variance falls from sigma^2 to about sigma^2 / 2). Round t draws one iid vector per
level (the nodes it completes), and the stream still keeps one buffer per level.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax_privacy.matrix_factorization import streaming_matrix


def levels(rounds: int) -> int:
    """Buffers the stream keeps: the levels of a tree over ``rounds`` leaves (1 + floor(log2
    rounds))."""
    return max(1, int(rounds).bit_length())


def strategy_matrix(rounds: int) -> np.ndarray:
    """C (rounds x rounds): C[s, t] = 1 where round t lies in the node ending at round s (1-based s,
    t)."""
    C = np.zeros((rounds, rounds))
    for s in range(1, rounds + 1):
        low = s & -s
        C[s - 1, s - low : s] = 1.0
    return C


def restarted_strategy_matrix(rounds: int, period: int) -> np.ndarray:
    """C of a tree restarted every ``period`` rounds: block diagonal, a tree over ``period`` leaves
    per block (the last one cut at ``rounds``)."""
    C = np.zeros((rounds, rounds))
    for start in range(0, rounds, period):
        size = min(period, rounds - start)
        C[start : start + size, start : start + size] = strategy_matrix(size)
    return C


def noising_matrix(rounds: int, period: int = 0) -> streaming_matrix.StreamingMatrix:
    """C^{-1} streamed (module docstring), for runs of up to ``rounds`` rounds; ``period`` > 0: a
    new tree every ``period`` rounds (its buffers cleared, one buffer per level of a ``period``-leaf
    tree)."""
    depth = levels(period or rounds)

    def init(abstract_value):
        zeros = jnp.zeros((depth,) + tuple(abstract_value.shape), abstract_value.dtype)
        return jnp.zeros((), jnp.int32), zeros

    def multiply_next(z, state):
        index, nodes = state
        if period:  # round t of its tree; the tree's first round starts from empty buffers
            nodes = jnp.where(index % period == 0, jnp.zeros_like(nodes), nodes)
            t = index % period + 1
        else:
            t = index + 1
        level = jax.lax.population_count((t & -t) - 1)  # ctz(t)
        below = (jnp.arange(depth) < level).reshape((depth,) + (1,) * z.ndim)
        noise = z - jnp.sum(jnp.where(below, nodes, 0), axis=0)
        here = (jnp.arange(depth) == level).reshape(below.shape)
        nodes = jnp.where(here, z[None], jnp.where(below, 0, nodes))
        return noise, (index + 1, nodes)

    return streaming_matrix.StreamingMatrix.from_array_implementation(init, multiply_next)


def honaker_weight(level):
    """1 / (2 - 2^-level): the weight that makes a node's bottom-up value an unbiased estimate of
    its sum."""
    return 1.0 / (2.0 - 0.5**level)


def nodes(rounds: int) -> list[tuple[int, int]]:
    """Every dyadic node (level, last round) completed within ``rounds`` rounds (1-based), level by
    level."""
    return [
        (level, end)
        for level in range(levels(rounds))
        for end in range(2**level, rounds + 1, 2**level)
    ]


def honaker_strategy_matrix(rounds: int) -> np.ndarray:
    """C (nodes x rounds): row (level, end) sums the rounds (end - 2^level, end]; rows in ``nodes``
    order."""
    tree = nodes(rounds)
    C = np.zeros((len(tree), rounds))
    for row, (level, end) in enumerate(tree):
        C[row, end - 2**level : end] = 1.0
    return C


def honaker_decoder(rounds: int) -> np.ndarray:
    """B (rounds x nodes): row t gives the prefix sum's estimate from the released nodes (B C = A);
    a node at level j under the decomposition node at level l enters with weight honaker_weight(l) /
    2^(l - j)."""
    tree = nodes(rounds)
    index = {node: row for row, node in enumerate(tree)}
    B = np.zeros((rounds, len(tree)))
    for t in range(1, rounds + 1):
        start = 0
        for level in reversed(range(levels(rounds))):
            if t & (1 << level):  # the decomposition node (start, start + 2^level]
                for j in range(level + 1):
                    for end in range(start + 2**j, start + 2**level + 1, 2**j):
                        B[t - 1, index[(j, end)]] = honaker_weight(level) / 2.0 ** (level - j)
                start += 2**level
    return B


def honaker_noising(rounds: int) -> streaming_matrix.StreamingMatrix:
    """The stream of Honaker's estimator: ``multiply_next`` takes one iid draw per level (a leading
    axis of ``levels(rounds)``) and returns round t's noise, the estimate of prefix t's noise minus
    that of prefix t - 1."""
    depth = levels(rounds)
    weights = jnp.asarray([honaker_weight(level) for level in range(depth)], jnp.float32)

    def init(abstract_value):
        zeros = jnp.zeros((depth,) + tuple(abstract_value.shape), abstract_value.dtype)
        return jnp.zeros((), jnp.int32), zeros

    def prefix(t, nodes_held):
        bits = ((t >> jnp.arange(depth)) & 1).astype(nodes_held.dtype) * weights.astype(
            nodes_held.dtype
        )
        return jnp.tensordot(bits, nodes_held, axes=1)

    def multiply_next(z, state):
        index, held = state
        t = index + 1
        level = jax.lax.population_count((t & -t) - 1)  # the highest level completed this round
        value = z[0]
        # bottom-up: node j = its release + the mean of its children's values
        for j in range(1, depth):
            value = jnp.where(j <= level, z[j] + 0.5 * (held[j - 1] + value), value)
        shape = (depth,) + (1,) * (z.ndim - 1)
        here, below = (
            (jnp.arange(depth) == level).reshape(shape),
            (jnp.arange(depth) < level).reshape(shape),
        )
        new_held = jnp.where(here, value[None], jnp.where(below, 0, held))
        return prefix(t, new_held) - prefix(index, held), (t, new_held)

    return streaming_matrix.StreamingMatrix.from_array_implementation(init, multiply_next)
