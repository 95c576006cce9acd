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


def _bd0_ratio(r):
    """phi(r) = (1 + r) log(1 + r) - r, so that lam phi((k - lam) / lam) = k log(k / lam) + lam - k
    (Loader's "bd0", the deviance term of the Poisson log-pmf, C. Loader 2000, "Fast and accurate
    computation of binomial probabilities"): by its Taylor series sum_n (-1)^n r^n / (n (n - 1))
    for |r| < 0.1, where the closed form cancels, else directly (r > -1)."""
    series = sum((-r) ** n / (n * (n - 1)) for n in range(2, 11))
    direct = (1 + r) * jnp.log1p(r) - r
    return jnp.where(jnp.abs(r) < 0.1, series, direct)


def _poisson_log_pmf(k, lam, whole, fraction):
    """log P(k) of Poisson(lam) in float32 accurate to ~1e-6 up to lam = 2^23: -lam phi(x / lam) -
    log(2 pi k) / 2 - Stirling's series in 1/k (x = k - lam from lam's ``whole`` and ``fraction``
    parts, so that no large number is subtracted); below k = 10, -lam + k log lam - lgamma(k + 1).
    The direct form loses ~lam x 6e-8 (0.03 at lam = 5e4), which is why Poisson draws were chunked
    at means of 5e4."""
    x = (k - whole) - fraction
    stirling = (
        -lam * _bd0_ratio(x / lam)
        - 0.5 * jnp.log(2 * jnp.pi * k)
        - 1 / (12 * k)
        + 1 / (360 * k**3)
        - 1 / (1260 * k**5)
    )
    small = -lam + k * jnp.log(lam) - jax.lax.lgamma(k + 1)
    return jnp.where(k < 10, small, stirling)


def _ptrs(lam):
    """Proposals of Hormann's transformed rejection with squeeze for Poisson(``lam``), lam >= 10
    (W. Hormann 1993, "The transformed rejection method for generating Poisson random
    variables", Insurance: Mathematics and Economics 12, algorithm PTRS; JAX's, NumPy's and
    TensorFlow's sampler for lam >= 10, here as one proposal a call): at most 11 % rejected. The
    proposal is formed around lam's whole part and the acceptance test uses
    ``_poisson_log_pmf``, so means up to 2^22 are drawn exactly in float32 (``POISSON_CHUNK``)."""
    whole = jnp.floor(lam)
    fraction = lam - whole
    b = 0.931 + 2.53 * jnp.sqrt(lam)
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2)

    def propose(key, shape):
        key_u, key_v = jax.random.split(key)
        u = jax.random.uniform(key_u, shape) - 0.5
        v = jax.random.uniform(key_v, shape)
        u_shifted = 0.5 - jnp.abs(u)
        k = whole + jnp.floor((2 * a / u_shifted + b) * u + fraction + 0.43)
        s = jnp.log(v * inv_alpha / (a / (u_shifted * u_shifted) + b))
        squeeze = (u_shifted >= 0.07) & (v <= v_r)
        reject = (k < 0) | ((u_shifted < 0.013) & (v > u_shifted))
        safe = jnp.maximum(k, 0.0)
        return k, squeeze | (~reject & (s <= _poisson_log_pmf(safe, lam, whole, fraction)))

    return propose


def poisson(key: jax.Array, lam, shape) -> jax.Array:
    """Poisson(``lam``) draws (int32): for lam >= 10, one PTRS proposal per coordinate in the first
    pass, then the <= 11 % left in a buffer of a fifth of the vector (``rejection_sample``; twice
    as fast as two proposals each, which compute twice the log-gamma terms);
    ``jax.random.poisson`` (Knuth's product of uniforms) below. ``lam`` a Python number, or a
    traced scalar (the branch then chosen in the program)."""
    ptrs = lambda: rejection_sample(_ptrs(jnp.float32(lam)), key, math.prod(shape), 1, 5)  # noqa: E731
    knuth = lambda: jax.random.poisson(key, lam, shape).astype(jnp.float32).ravel()  # noqa: E731
    if isinstance(lam, (int, float)):
        value = knuth() if lam < 10 else ptrs()
    else:
        value = jax.lax.cond(lam < 10, knuth, ptrs)
    return value.astype(jnp.int32).reshape(shape)


POISSON_CHUNK = 2.0**22
"""The largest Poisson mean drawn at once (``_ptrs``: its draws stay far inside float32's exact
integers, 2^24, and its log-pmf is accurate there); a larger mean is the sum of equal chunks (a
Poisson, and a Skellam, are infinitely divisible). It was 5e4 with JAX's sampler, whose log-pmf
drifts (variance 1.45x at 2e7, measured)."""


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
