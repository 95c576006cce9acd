"""JAX's threefry random bits with the 20 rounds unrolled: the same numbers, several times faster on
XLA:CPU.

On CPU, JAX lowers ``threefry2x32`` as a rolled loop of five iterations (``use_rolled_loops=True``
in ``jax/_src/random/threefry2x32.py``, chosen for compile time), and every iteration passes over
the whole counter array in memory, so a draw larger than the caches runs at memory speed (on a
2-core AMD EPYC VM, 6.4M float32 normals, the FedAvg CNN's 1.66M parameters x
``mechanisms.NOISE_DRAWS``: 147 ms, 22 ns a number). Unrolled, XLA fuses the rounds into one
elementwise loop over the counters (25 ms), and compiles no slower. ``benchmarks/noise_draws.py``
measures what it does for whole DP noise draws (4.1-9.9x with the fused sum of
``mechanisms.standard_normal``) and for random measurement matrices (4.1-9.0x).

``unrolled(key)`` rewraps a threefry key in a PRNG implementation
(``jax.extend.random.define_prng_impl``) that is threefry's in everything (seed, split, fold_in)
except ``random_bits``, which computes the bits of JAX's partitionable threefry
(``jax_threefry_partitionable``, JAX's default since 0.5): element i of a draw of shape s is
Threefry-2x32 with 20 rounds (Salmon, Moraes, Dror and Shaw 2011, "Parallel random numbers: as easy
as 1, 2, 3", Sec. 3-4) of the counter (hi(i), lo(i)) of its row-major flat index under the key, the
two output words xor-ed for a 32-bit draw. jax.random's samplers (normal, uniform, rademacher...)
turn those bits into numbers with their own code, so every sample equals jax.random's on the
original key to the bit (``tests/test_unrolled_threefry.py``). A key of another implementation, or
the non-partitionable scheme, is returned unchanged; 64-bit draws and draws of 2^32 numbers or more
use JAX's own bits.
"""

from __future__ import annotations

import math

import jax
import jax.extend.random as jex_random
import jax.numpy as jnp
import numpy as np

# Threefry-2x32's rotation constants (Salmon et al. 2011, Table 4)
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
KEY_PARITY = np.uint32(0x1BD11BDA)  # the key schedule's parity constant (Threefish)
THREEFRY = jex_random.threefry_prng_impl


def threefry2x32(k1, k2, x1, x2):
    """Threefry-2x32, 20 rounds, unrolled: the arithmetic of JAX's lowering, in the same order."""
    keys = (k1, k2, k1 ^ k2 ^ KEY_PARITY)
    x1, x2 = x1 + keys[0], x2 + keys[1]
    for block in range(5):
        for rotation in ROTATIONS[block % 2]:
            x1 = x1 + x2
            x2 = (x2 << np.uint32(rotation)) | (x2 >> np.uint32(32 - rotation))
            x2 = x1 ^ x2
        x1 = x1 + keys[(block + 1) % 3]
        x2 = x2 + keys[(block + 2) % 3] + np.uint32(block + 1)
    return x1, x2


def _random_bits(key_data, bit_width: int, shape):
    """``bit_width``-bit random bits of ``shape``, those of JAX's partitionable threefry."""
    size = math.prod(shape)
    # counters past 32 bits, or 64-bit draws (x64 only): JAX's own code
    if size >= 2**32 or bit_width == 64:
        return THREEFRY.random_bits(key_data, bit_width, shape)
    low = jax.lax.iota(np.uint32, size).reshape(shape)  # the row-major flat index
    bits1, bits2 = threefry2x32(key_data[..., 0], key_data[..., 1], jnp.zeros_like(low), low)
    return (bits1 ^ bits2).astype({8: np.uint8, 16: np.uint16, 32: np.uint32}[bit_width])


UNROLLED_THREEFRY = jex_random.define_prng_impl(
    key_shape=THREEFRY.key_shape,
    seed=THREEFRY.seed,
    split=THREEFRY.split,
    random_bits=_random_bits,
    fold_in=THREEFRY.fold_in,
    name="threefry2x32_unrolled",
    tag="fu",
)


def unrolled(key: jax.Array) -> jax.Array:
    """The same key under the unrolled implementation (module docstring), or ``key`` itself where
    the bits would differ: a raw uint32 key, another PRNG implementation, the non-partitionable
    scheme."""
    if (
        not jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        or str(jax.random.key_impl(key)) != THREEFRY.name
        or not jax.config.jax_threefry_partitionable
    ):
        return key
    return jax.random.wrap_key_data(jax.random.key_data(key), impl=UNROLLED_THREEFRY)
