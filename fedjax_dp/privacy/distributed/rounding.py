"""Conditional randomized rounding (Kairouz, Liu and Steinke 2021, Sec. 4.1 and Thm. 1 / Prop. 22):
each coordinate of a scaled vector y is rounded to floor(y) + Bernoulli(y - floor(y)), unbiased, and
the whole draw is repeated until the rounded vector's L2 norm is at most the bound the accounting
assumes: for ||y|| <= c in D coordinates and a failure probability beta in (0, 1),

    Delta_2^2 = min(c^2 + D / 4 + sqrt(2 ln(1 / beta)) (c + sqrt(D) / 2), (c + sqrt(D))^2),

so one draw meets it with probability at least 1 - beta. The L1 sensitivity of an integer vector is
then at most Delta_2 min(sqrt(D), Delta_2). A draw that never meets the bound within
``MAX_DRAWS`` tries (probability at most beta^MAX_DRAWS) sends the zero vector, which is within it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_dp.core.unrolled_threefry import unrolled

MAX_DRAWS = 100


def rounded_l2_bound(norm: float, beta: float, dim: int) -> float:
    """Delta_2: the L2 norm a rounded vector of norm <= ``norm`` in ``dim`` coordinates is held to
    (beta = 0: the unconditional bound norm + sqrt(dim))."""
    unconditional = norm + math.sqrt(dim)
    if beta == 0:
        return unconditional
    squared = (
        norm**2 + 0.25 * dim + math.sqrt(2.0 * math.log(1.0 / beta)) * (norm + 0.5 * math.sqrt(dim))
    )
    return min(unconditional, math.sqrt(squared))


def rounded_l1_bound(l2_bound: float, dim: int) -> float:
    """Delta_1 of an integer vector of L2 norm <= ``l2_bound``: L1 <= sqrt(D) L2, and L1 <= L2^2 on
    the integers."""
    return l2_bound * min(math.sqrt(dim), l2_bound)


def conditional_round(key: jax.Array, y: jax.Array, bound) -> tuple[jax.Array, jax.Array]:
    """(rounded int32 vector of L2 norm <= ``bound``, the draws it took; 0 where none met it)."""
    low = jnp.floor(y)
    frac = y - low
    bound_sq = jnp.asarray(bound, jnp.float32) ** 2

    key = unrolled(key)  # the same bits as jax.random's, several times faster on a CPU

    def draw(i):
        up = jax.random.bernoulli(jax.random.fold_in(key, i), frac)
        return low + up.astype(jnp.float32)

    def body(carry):
        i, value, done = carry
        candidate = draw(i)
        fits = jnp.sum(candidate**2) <= bound_sq
        value = jnp.where(done, value, candidate)
        return i + 1, value, done | fits

    def more(carry):
        i, _, done = carry
        return (i < MAX_DRAWS) & ~done

    tries, value, done = jax.lax.while_loop(
        more, body, (jnp.int32(0), jnp.zeros_like(y), jnp.bool_(False))
    )
    return jnp.where(done, value, 0.0).astype(jnp.int32), jnp.where(done, tries, 0)
