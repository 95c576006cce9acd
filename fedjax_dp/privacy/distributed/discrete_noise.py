"""Integer noise for distributed DP, each client's share added to its quantised update.

* ``discrete_gaussian``: the discrete Gaussian N_Z(0, sigma^2), P(x) proportional to
  exp(-x^2 / (2 sigma^2)) on the integers, sampled exactly by rejection from a discrete Laplace of
  scale t = floor(sigma) + 1 (Canonne, Kamath and Steinke 2020, Alg. 3): Y = G1 - G2 with G ~
  Geometric(1 - e^(-1/t)) on {0, 1, ...} (the floor of an exponential of scale t), accepted with
  probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)). Coordinates not yet accepted are redrawn
  together until every one is (each round accepts at least about half).
* ``skellam``: the Skellam distribution of variance mu, the difference of two independent Poisson
  draws of mean mu / 2 (Agarwal, Kairouz and Liu 2021): the sum of n shares of variance mu / n is
  Skellam of variance mu. A large mean is drawn in chunks (``POISSON_CHUNK``).

Both run inside the cohort map (jitted and vmapped); a simulation draws them from floating-point
uniforms (a deployment would use an integer sampler).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

MAX_ROUNDS = 200  # rejection rounds; each accepts >= ~half of what is left, so 200 never binds


def _discrete_laplace(key: jax.Array, scale, shape) -> jax.Array:
    """Y = G1 - G2, G ~ Geometric(1 - e^(-1/scale)) on {0, 1, ...}: floor(Exp(scale))."""
    a, b = jax.random.split(key)
    g1 = jnp.floor(scale * jax.random.exponential(a, shape))
    g2 = jnp.floor(scale * jax.random.exponential(b, shape))
    return g1 - g2


def discrete_gaussian(key: jax.Array, sigma, shape) -> jax.Array:
    """Draws of N_Z(0, sigma^2) (int32; sigma = 0 gives zeros)."""
    sigma = jnp.asarray(sigma, jnp.float32)
    scale = jnp.floor(sigma) + 1.0

    def draw(round_key):
        lap_key, accept_key = jax.random.split(round_key)
        y = _discrete_laplace(lap_key, scale, shape)
        bias = jnp.abs(y) - sigma**2 / scale
        accept = jax.random.uniform(accept_key, shape) < jnp.exp(
            -(bias**2) / (2.0 * jnp.maximum(sigma, 1e-30) ** 2)
        )
        return y, accept

    def body(carry):
        i, value, done = carry
        y, accept = draw(jax.random.fold_in(key, i))
        value = jnp.where(done, value, y)
        return i + 1, value, done | accept

    def more(carry):
        i, _, done = carry
        return (i < MAX_ROUNDS) & ~jnp.all(done)

    init = (jnp.int32(0), jnp.zeros(shape, jnp.float32), jnp.zeros(shape, bool))
    _, value, _ = jax.lax.while_loop(more, body, init)
    return jnp.where(sigma > 0, value, 0.0).astype(jnp.int32)


POISSON_CHUNK = 5e4
"""The largest Poisson mean drawn at once: JAX's float32 Poisson sampler has the right variance to
0.2 % up to about 1e5 and drifts beyond (1.45x at 2e7, measured); a larger mean is the sum of equal
chunks (a Poisson, and a Skellam, are infinitely divisible)."""


def skellam(key: jax.Array, variance, shape) -> jax.Array:
    """Draws of the Skellam distribution of variance ``variance`` (int32): the sum of m Skellam
    draws of variance ``variance`` / m, each the difference of two Poisson draws of mean
    ``variance`` / (2 m) <= ``POISSON_CHUNK`` (``variance`` a Python number)."""
    chunks = max(1, math.ceil(float(variance) / (2 * POISSON_CHUNK)))
    half = jnp.float32(float(variance) / (2 * chunks))

    def add(i, total):
        a, b = jax.random.split(jax.random.fold_in(key, i))
        return total + jax.random.poisson(a, half, shape) - jax.random.poisson(b, half, shape)

    return jax.lax.fori_loop(0, chunks, add, jnp.zeros(shape, jnp.int32))


SAMPLERS = {"ddgauss": discrete_gaussian, "skellam": skellam}
"""Each mechanism's share sampler, by its ``ddp.mechanism`` name (the second argument: the share's
standard deviation for the discrete Gaussian, its variance for Skellam)."""
