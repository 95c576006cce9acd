"""Gaussian mechanisms on pytrees: central and local noise, one code path.

Central DP (Geyer et al. 2017; seed 001): clients send clipped updates, the server adds ONE draw of
N(0, (z S)^2 I) to their sum and divides by a fixed denominator. Local DP (seed 001): every client
adds its own N(0, (z S)^2 I) to its clipped update before sending; the server only averages.
``gaussian_noise_like`` is the single primitive; ``NoiseMode`` says who calls it.

Floating-point noise (the Gaussian analogue of Mironov 2012): one float32
``jax.random.normal`` draw comes from an inverse-erf of a 24-bit uniform, so its support stops at
about 5.4 sigma and is a grid. Every noise draw here is instead the sum of ``NOISE_DRAWS``
independent standard normals divided by sqrt(NOISE_DRAWS): exactly N(0, 1) in distribution, support
to about 5.4 sqrt(NOISE_DRAWS) sigma (the Gaussian tail beyond it is below 1e-25), and values no
longer on one draw's grid. Noise is drawn in float32 (float64 for float64 leaves), never in a
low-precision leaf's dtype, and the noised value is cast back (post-processing). The residual: the
released values are still float32 numbers; a discrete Gaussian on a fixed-point grid (Canonne,
Kamath and Steinke 2020) would remove it and is not implemented.
"""

from __future__ import annotations

import enum
import math

import jax
import jax.numpy as jnp

from fedjax_dp.core.unrolled_threefry import unrolled


class NoiseMode(str, enum.Enum):
    CENTRAL = "central"
    LOCAL = "local"


NOISE_DRAWS = 4


def noise_dtype(dtype) -> jnp.dtype:
    """float32, or float64 for float64 leaves: never a low-precision dtype."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def standard_normal(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
    """N(0, 1) as the mean-preserving sum of ``NOISE_DRAWS`` draws (module docstring). The draws are
    made as one flat vector and reshaped: the same values as drawing the shape directly (JAX's
    threefry counts over the flat index), but XLA:CPU compiles the flat draw several times faster,
    and every DP program draws its noise this way. The key's threefry runs unrolled
    (``core.unrolled_threefry``: the same draws to the bit), and the draws are summed by three
    additions that XLA fuses with them instead of a reduce over their axis
    (``benchmarks/noise_draws.py`` measures both). The sum is in the same order, but XLA:CPU may
    contract a draw's last multiply (sqrt(2) erfinv(u)) and the addition into one fused
    multiply-add, one rounding instead of two: an entry can differ from the reduce's by a rounding
    of the summands (at most 4.8e-7 in 6.4M draws); the distribution is the same."""
    shape = (NOISE_DRAWS,) + tuple(shape)
    draws = jax.random.normal(unrolled(key), (math.prod(shape),), noise_dtype(dtype)).reshape(shape)
    total = draws[0]
    # added in sequence, as XLA:CPU's reduce over the axis does, fused with the draws
    for draw in draws[1:]:
        total = total + draw
    return total / jnp.sqrt(jnp.asarray(NOISE_DRAWS, draws.dtype))


def gaussian_noise_like(tree, std: float | jax.Array, key: jax.Array):
    """Independent N(0, std^2) noise for every entry of ``tree`` (one subkey per leaf), in float32
    or float64 whatever the leaf's dtype."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    noise = [std * standard_normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, noise)


def add_gaussian_noise(tree, std: float | jax.Array, key: jax.Array):
    """``tree + N(0, std^2 I)``, added in the noise's precision and cast back to each leaf's
    dtype."""
    return jax.tree_util.tree_map(
        lambda x, n: (x.astype(n.dtype) + n).astype(x.dtype),
        tree,
        gaussian_noise_like(tree, std, key),
    )
