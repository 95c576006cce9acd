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

Both run inside the cohort map (jitted and vmapped); a simulation draws them from floating-point
uniforms (a deployment would use an integer sampler).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_dp.core.unrolled_threefry import unrolled

MAX_ROUNDS = 200  # rejection rounds; each accepts >= ~half of what is left, so 200 never binds
LEFTOVER_SHARE = 16  # the second pass's buffer: 1/16 of the coordinates by default


def _until_accepted(propose, key: jax.Array, value, done):
    """Redraws every coordinate not ``done`` until each is accepted (all of ``value``'s shape each
    round, so it runs on few coordinates or few rounds)."""

    def body(carry):
        i, value, done = carry
        y, accept = propose(jax.random.fold_in(key, i), value.shape)
        return i + 1, jnp.where(done, value, y), done | accept

    def more(carry):
        i, _, done = carry
        return (i < MAX_ROUNDS) & ~jnp.all(done)

    _, value, done = jax.lax.while_loop(more, body, (jnp.int32(0), value, done))
    return value, done


def rejection_sample(propose, key: jax.Array, size: int, candidates: int, leftover_share=None):
    """``size`` draws by rejection: ``propose(key, shape) -> (proposals, accepted)`` makes
    independent proposals, and each coordinate takes the first accepted of its own, so the draws
    are exact whatever order the proposals are made in.

    Made in three passes, for speed on a vector of 2^18 coordinates per client: ``candidates``
    proposals for every coordinate at once; the coordinates left (about (1 - p)^candidates of
    them, p the acceptance rate), gathered into a buffer of 1/``leftover_share`` of the vector and
    redrawn until accepted; and, should more be left than the buffer holds (about 1e-300 for 2^18
    coordinates at the rates here), the whole vector's leftovers redrawn. Redrawing whole vectors
    until every one of 2^18 coordinates is accepted took ~15 rounds of full draws."""
    leftover_share = leftover_share or LEFTOVER_SHARE
    first, second, third = (unrolled(jax.random.fold_in(key, i)) for i in range(3))
    y, accept = propose(first, (candidates, size))
    value = jnp.take_along_axis(y, jnp.argmax(accept, axis=0)[None], axis=0)[0]
    done = jnp.any(accept, axis=0)
    slots = min(size, max(64, -(-size // leftover_share)))
    (left,) = jnp.nonzero(~done, size=slots, fill_value=size)  # size: an empty slot
    redrawn, filled = _until_accepted(propose, second, jnp.zeros(slots, y.dtype), left == size)
    value = value.at[left].set(redrawn, mode="drop")
    done = done.at[left].set(filled, mode="drop")
    return _until_accepted(propose, third, value, done)[0]


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


def _ptrs(lam):
    """Proposals of Hormann's transformed rejection with squeeze for Poisson(``lam``), lam >= 10
    (W. Hormann 1993, "The transformed rejection method for generating Poisson random
    variables", Insurance: Mathematics and Economics 12, algorithm PTRS; JAX's, NumPy's and
    TensorFlow's sampler for lam >= 10, here as one proposal a call): at most 11 % rejected."""
    log_lam = jnp.log(lam)
    b = 0.931 + 2.53 * jnp.sqrt(lam)
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2)

    def propose(key, shape):
        key_u, key_v = jax.random.split(key)
        u = jax.random.uniform(key_u, shape) - 0.5
        v = jax.random.uniform(key_v, shape)
        u_shifted = 0.5 - jnp.abs(u)
        k = jnp.floor((2 * a / u_shifted + b) * u + lam + 0.43)
        s = jnp.log(v * inv_alpha / (a / (u_shifted * u_shifted) + b))
        t = -lam + k * log_lam - jax.lax.lgamma(k + 1)
        squeeze = (u_shifted >= 0.07) & (v <= v_r)
        reject = (k < 0) | ((u_shifted < 0.013) & (v > u_shifted))
        return k, squeeze | (~reject & (s <= t))

    return propose


def poisson(key: jax.Array, lam: float, shape) -> jax.Array:
    """Poisson(``lam``) draws (int32, ``lam`` a Python number): for lam >= 10, one PTRS proposal
    per coordinate in the first pass, then the <= 11 % left in a buffer of a fifth of the vector
    (``rejection_sample``; twice as fast as two proposals each, which compute twice the log-gamma
    terms); ``jax.random.poisson`` (Knuth's product of uniforms) below."""
    if lam < 10:
        return jax.random.poisson(key, lam, shape)
    value = rejection_sample(_ptrs(jnp.float32(lam)), key, math.prod(shape), 1, 5)
    return value.astype(jnp.int32).reshape(shape)


POISSON_CHUNK = 5e4
"""The largest Poisson mean drawn at once: JAX's float32 Poisson sampler has the right variance to
0.2 % up to about 1e5 and drifts beyond (1.45x at 2e7, measured); a larger mean is the sum of equal
chunks (a Poisson, and a Skellam, are infinitely divisible)."""


def skellam(key: jax.Array, variance, shape) -> jax.Array:
    """Draws of the Skellam distribution of variance ``variance`` (int32): the sum of m Skellam
    draws of variance ``variance`` / m, each the difference of two Poisson draws of mean
    ``variance`` / (2 m) <= ``POISSON_CHUNK`` (``variance`` a Python number)."""
    chunks = max(1, math.ceil(float(variance) / (2 * POISSON_CHUNK)))
    half = float(variance) / (2 * chunks)

    def add(i, total):
        a, b = jax.random.split(jax.random.fold_in(key, i))
        return total + poisson(a, half, shape) - poisson(b, half, shape)

    return jax.lax.fori_loop(0, chunks, add, jnp.zeros(shape, jnp.int32))


SAMPLERS = {"ddgauss": discrete_gaussian, "skellam": skellam}
"""Each mechanism's share sampler, by its ``ddp.mechanism`` name (the second argument: the share's
standard deviation for the discrete Gaussian, its variance for Skellam)."""
