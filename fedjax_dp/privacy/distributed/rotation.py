"""The randomized Hadamard rotation of distributed DP (Kairouz, Liu and Steinke 2021, Sec. 4.2;
Agarwal, Kairouz and Liu 2021): a client's flattened update x of d coordinates is padded to D = 2^m
and rotated, R x = H (s * x) / sqrt(D), with s a vector of random signs drawn from a key the server
knows and H the Walsh-Hadamard matrix, applied in O(D log D) (the fast Walsh-Hadamard transform).
R is orthonormal, so norms are kept, and it spreads a vector's mass over every coordinate (each
rotated coordinate is about norm / sqrt(D), subgaussian), which bounds the modular wrap-around of
the quantised sum. The server inverts it after summing: x = s * H y / sqrt(D)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_dp.core.unrolled_threefry import unrolled


def padded_dimension(dim: int) -> int:
    """D: the least power of two >= ``dim``."""
    return 1 << max(0, math.ceil(math.log2(max(dim, 1))))


def walsh_hadamard(x: jax.Array) -> jax.Array:
    """H x / sqrt(D) along the last axis (D a power of two): the orthonormal, self-inverse fast
    Walsh-Hadamard transform, one butterfly per bit of the index."""
    size = x.shape[-1]
    bits = int(math.log2(size))
    if 1 << bits != size:
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two length, got {size}")
    lead = x.shape[:-1]
    y = x.reshape(lead + (2,) * bits)
    for axis in range(len(lead), len(lead) + bits):
        a, b = jnp.take(y, 0, axis=axis), jnp.take(y, 1, axis=axis)
        y = jnp.stack([a + b, a - b], axis=axis)
    return y.reshape(x.shape) / jnp.sqrt(jnp.asarray(size, x.dtype))


def random_signs(key: jax.Array, size: int) -> jax.Array:
    """s: ``size`` independent uniform signs (+1 or -1) from ``key``."""
    heads = jax.random.bernoulli(unrolled(key), 0.5, (size,))  # jax.random's bits, unrolled
    return jnp.where(heads, 1.0, -1.0).astype(jnp.float32)


def rotate(x: jax.Array, signs: jax.Array) -> jax.Array:
    """R x for a vector padded to ``len(signs)``."""
    padded = jnp.zeros(signs.shape, jnp.float32).at[: x.shape[-1]].set(x.astype(jnp.float32))
    return walsh_hadamard(signs * padded)


def unrotate(y: jax.Array, signs: jax.Array, dim: int) -> jax.Array:
    """R^T y, cut back to the first ``dim`` coordinates."""
    return (signs * walsh_hadamard(y.astype(jnp.float32)))[:dim]
