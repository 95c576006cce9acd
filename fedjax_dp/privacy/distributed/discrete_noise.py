"""Integer noise for distributed DP, each client's share added to its quantised update.

* ``discrete_gaussian``: the discrete Gaussian N_Z(0, sigma^2), P(x) proportional to
  exp(-x^2 / (2 sigma^2)) on the integers, sampled exactly by rejection from a discrete Laplace of
  scale t = floor(sigma) + 1 (Canonne, Kamath and Steinke 2020, Alg. 3): Y = G1 - G2 with G ~
  Geometric(1 - e^(-1/t)) on {0, 1, ...} (the floor of an exponential of scale t), accepted with
  probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)), 0.63-0.76 of proposals for any sigma.
  Three proposals per coordinate at once, then the few coordinates left redrawn in a small buffer
  (``discrete_gaussian``).
* ``skellam``: the Skellam distribution of variance mu, the difference of two independent Poisson
  draws of mean mu / 2 (Agarwal, Kairouz and Liu 2021): the sum of n shares of variance mu / n is
  Skellam of variance mu. A large mean is drawn in chunks (``POISSON_CHUNK``); each Poisson by
  Hormann's PTRS (``poisson``), one proposal per coordinate, then the few left in a small buffer.
  Skellam shares add up to a Skellam draw, so a simulation may draw the surviving shares' sum
  once at the aggregator instead of each share (``ddp.shares=summed``): the modular sum has the
  same law.

Both run inside the cohort map (jitted and vmapped); a simulation draws them from floating-point
uniforms (a deployment would use an integer sampler).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_dp.privacy.distributed.poisson import POISSON_CHUNK, poisson
from fedjax_dp.privacy.distributed.rejection import rejection_sample


def _discrete_laplace(key: jax.Array, scale, shape) -> jax.Array:
    """Y = G1 - G2, G ~ Geometric(1 - e^(-1/scale)) on {0, 1, ...}: floor(Exp(scale))."""
    a, b = jax.random.split(key)
    g1 = jnp.floor(scale * jax.random.exponential(a, shape))
    g2 = jnp.floor(scale * jax.random.exponential(b, shape))
    return g1 - g2


def discrete_gaussian(key: jax.Array, sigma, shape, leftover_share=None) -> jax.Array:
    """Draws of N_Z(0, sigma^2) (int32; sigma = 0 gives zeros): CKS Alg. 3's proposals, three per
    coordinate in the first pass (``rejection_sample``)."""
    sigma = jnp.asarray(sigma, jnp.float32)
    scale = jnp.floor(sigma) + 1.0

    def propose(key, shape):
        lap_key, accept_key = jax.random.split(key)
        y = _discrete_laplace(lap_key, scale, shape)
        bias = jnp.abs(y) - sigma**2 / scale
        accept = jax.random.uniform(accept_key, shape) < jnp.exp(
            -(bias**2) / (2.0 * jnp.maximum(sigma, 1e-30) ** 2)
        )
        return y, accept

    value = rejection_sample(propose, key, math.prod(shape), 3, leftover_share)
    return jnp.where(sigma > 0, value, 0.0).astype(jnp.int32).reshape(shape)


def skellam(key: jax.Array, variance, shape, max_variance: float | None = None) -> jax.Array:
    """Draws of the Skellam distribution of variance ``variance`` (int32): the sum of m Skellam
    draws of variance ``variance`` / m, each the difference of two Poisson draws of mean
    ``variance`` / (2 m) <= ``POISSON_CHUNK``. ``variance`` a Python number, or a traced scalar
    of at most ``max_variance`` (which sets m)."""
    largest = float(variance) if max_variance is None else float(max_variance)
    chunks = max(1, math.ceil(largest / (2 * POISSON_CHUNK)))
    half = variance / (2 * chunks)

    def add(i, total):
        a, b = jax.random.split(jax.random.fold_in(key, i))
        return total + poisson(a, half, shape) - poisson(b, half, shape)

    return jax.lax.fori_loop(0, chunks, add, jnp.zeros(shape, jnp.int32))


SAMPLERS = {"ddgauss": discrete_gaussian, "skellam": skellam}
"""Each mechanism's share sampler, by its ``ddp.mechanism`` name (the second argument: the share's
standard deviation for the discrete Gaussian, its variance for Skellam)."""
