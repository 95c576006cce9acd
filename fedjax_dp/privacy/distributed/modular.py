"""Modular arithmetic of a simulated secure aggregation: every client's integer vector is reduced
modulo 2^bits, the server learns only the modular sum, mapped back to the signed range
[-2^(bits-1), 2^(bits-1)). The vectors are int32 and JAX's integer sums wrap modulo 2^32, which
2^bits divides (bits <= 32), so the modular sum of the reduced vectors is exact: the plain integer
sum whenever no coordinate of it leaves the signed range, wrapped exactly as modular arithmetic
says otherwise."""

from __future__ import annotations

import jax.numpy as jnp

MAX_BITS = 32


def reduce(values, bits: int):
    """``values`` (integers) modulo 2^bits, in [0, 2^bits) (int32; at 32 bits the two's complement
    word itself)."""
    values = jnp.asarray(values, jnp.int32)
    if bits == MAX_BITS:
        return values
    return jnp.bitwise_and(values, jnp.int32((1 << bits) - 1))


def to_signed(values, bits: int):
    """A value in [0, 2^bits) (int32, the modular sum) as its representative in
    [-2^(bits-1), 2^(bits-1))."""
    values = reduce(values, bits)
    if bits == MAX_BITS:
        return values
    half = jnp.int32(1 << (bits - 1))
    return jnp.where(values >= half, values - half - half, values)  # 2^bits may not fit int32


def wrapped(true_sum, bits: int):
    """Which coordinates of the true (un-reduced) sum leave the signed range (given as floats: a
    simulation's diagnostic, never what the server sees)."""
    half = float(1 << (bits - 1))
    return (true_sum >= half) | (true_sum < -half)
