"""Poisson draws for Skellam noise, exact in float32 up to means of 2^22 (``POISSON_CHUNK``):
Hormann's transformed rejection (PTRS) with the acceptance test on the log-pmf in Loader's deviance
form, one proposal per coordinate through ``rejection.rejection_sample``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_dp.privacy.distributed.rejection import rejection_sample


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
