"""Measurement operators y = Phi x for one flattened layer x of I entries at rate r (seed 004, Alg.
3).

One interface: ``measure(x) -> y`` (b values), ``adjoint(y) -> Phi^T y``, ``shape = (b, I)``,
``gram_solve(y) -> (Phi Phi^T)^{-1} y`` and ``lipschitz`` (||Phi||_2^2, for ISTA). All are pure jnp
functions of arrays (jittable, vmappable across clients).

* ``BlockSum``: the deterministic binary matrix of Alg. 3 / Eq. 13. b = floor(r I) rows, z =
  floor(1/r); ``count = I - z b`` rows hold z + 1 ones and the rest z, in disjoint contiguous blocks
  covering x. Applied as reshape-and-sum in O(I) time and memory, never materialised. Equivalently
  the blocks are I split as evenly as possible over b rows (the first I mod b rows one longer):
  whenever the paper's rule is feasible (count <= b) this is exactly it; where it is not (e.g. I =
  7, r = 0.4: b = 2, z = 2, count = 3 > b) the even split is the documented rule. A layer smaller
  than 1/r (floor(r I) = 0) gets one measurement, its sum: b = max(1, floor(r I)).
* ``RandomMatrix``: Gaussian N(0, 1/b) or Bernoulli +-1/sqrt(b) entries generated from a seed both
  sides share (nothing is transmitted), column tile by column tile (``tile`` columns each) so a
  large layer never holds the b x I matrix; a layer of at most ``tile`` entries is one dense tile.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import rng
from fedjax_dp.core.unrolled_threefry import unrolled
from fedjax_dp.compression.rates import validate_rate

KINDS = ("block", "gaussian", "bernoulli")


def num_measurements(size: int, rate: float) -> int:
    """b = max(1, floor(r I)) (a tolerance absorbs float error: 0.3 * 10 is 3, not 2.9999)."""
    if size < 1:
        raise ValueError(f"cannot compress an empty layer (size {size})")
    validate_rate(rate)
    return max(1, math.floor(rate * size + 1e-9))


@dataclasses.dataclass(frozen=True)
class BlockSum:
    size: int
    rate: float

    def __post_init__(self):
        self._layout  # noqa: B018  (validates size and rate now)

    @functools.cached_property
    def _layout(self) -> tuple[int, int, int]:
        b = num_measurements(self.size, self.rate)
        q, rem = divmod(self.size, b)
        return b, q, rem

    @property
    def shape(self) -> tuple[int, int]:
        return self._layout[0], self.size

    @property
    def block_sizes(self) -> np.ndarray:
        b, q, rem = self._layout
        return np.array([q + 1] * rem + [q] * (b - rem))

    @property
    def lipschitz(self) -> float:
        return float(self.block_sizes.max())

    def measure(self, x: jax.Array) -> jax.Array:
        b, q, rem = self._layout
        split = rem * (q + 1)
        head = _row_sums(x[:split].reshape(rem, q + 1))
        tail = _row_sums(x[split:].reshape(b - rem, q))
        return jnp.concatenate([head, tail])

    def adjoint(self, y: jax.Array) -> jax.Array:
        b, q, rem = self._layout
        head = jnp.broadcast_to(y[:rem, None], (rem, q + 1)).reshape(-1)
        tail = jnp.broadcast_to(y[rem:, None], (b - rem, q)).reshape(-1)
        return jnp.concatenate([head, tail])

    def gram_solve(self, y: jax.Array) -> jax.Array:
        """Phi Phi^T = diag(block sizes): each measurement divided by its block's length."""
        b, q, rem = self._layout
        return jnp.concatenate([y[:rem] / (q + 1), y[rem:] / q])

    def dense(self) -> np.ndarray:
        """The explicit b x I matrix (tests and small-layer coherence only)."""
        rows = np.zeros(self.shape, np.float32)
        start = 0
        for i, length in enumerate(self.block_sizes):
            rows[i, start : start + length] = 1
            start += length
        return rows


@dataclasses.dataclass(frozen=True)
class PaddedBlockSum:
    """``BlockSum`` with its row count b = ``rows`` an array (traced inside a jitted round) and its
    output padded to ``max_rows``: entries [0, b) are BlockSum's y, the rest zero. One compiled
    program then serves every rate up to ``max_rows / size``, where a static b would recompile the
    round each time Alg. 2 picks a new rate vector (measured: 4 new vectors in 6 CIFAR-10 rounds
    cost 44 s of compiling, ``benchmarks/RESULTS.md``). Same blocks as BlockSum (the first I mod b
    one longer), summed with a sorted segment sum."""

    size: int
    max_rows: int
    rows: jax.Array  # b, 1 <= b <= max_rows

    @property
    def shape(self) -> tuple[int, int]:
        return self.max_rows, self.size

    def _layout(self):
        b = jnp.asarray(self.rows, jnp.int32)
        q, rem = self.size // b, self.size % b
        return b, q, rem

    def _segments(self) -> jax.Array:
        """The block (row) of each of the ``size`` entries."""
        b, q, rem = self._layout()
        j, split = jnp.arange(self.size, dtype=jnp.int32), rem * (q + 1)
        return jnp.where(j < split, j // (q + 1), rem + (j - split) // q)

    def _block_sizes(self) -> jax.Array:
        """Each row's block length (padding rows: 1, they hold zeros)."""
        b, q, rem = self._layout()
        i = jnp.arange(self.max_rows, dtype=jnp.int32)
        return jnp.where(i < rem, q + 1, jnp.where(i < b, q, 1))

    @property
    def lipschitz(self) -> jax.Array:
        b, q, rem = self._layout()
        return jnp.where(rem > 0, q + 1, q).astype(jnp.float32)

    def measure(self, x: jax.Array) -> jax.Array:
        return jax.ops.segment_sum(
            x, self._segments(), num_segments=self.max_rows, indices_are_sorted=True
        )

    def adjoint(self, y: jax.Array) -> jax.Array:
        return y[self._segments()]

    def gram_solve(self, y: jax.Array) -> jax.Array:
        return y / self._block_sizes().astype(y.dtype)


def _row_sums(blocks: jax.Array) -> jax.Array:
    """Sums of the rows of a (rows, q) array. XLA:CPU reduces a short minor axis slowly (10M
    entries, q = 2: 43 ms as a reduce, 4 ms as a sum of column slices, 6 ms as a dot; measured on
    the 2-core CPU of this project), so short blocks add columns and long ones use a matrix-vector
    product."""
    q = blocks.shape[1]
    if q > 8:
        return blocks @ jnp.ones(q, blocks.dtype)
    total = blocks[:, 0]
    for j in range(1, q):
        total = total + blocks[:, j]
    return total


@dataclasses.dataclass(frozen=True)
class RandomMatrix:
    size: int
    rate: float
    kind: str = "gaussian"
    seed: int = 0
    tile: int = 4096

    def __post_init__(self):
        if self.kind not in ("gaussian", "bernoulli"):
            raise ValueError(f"random matrix kind must be gaussian or bernoulli, got {self.kind!r}")
        if self.tile < 1:
            raise ValueError(f"tile must be >= 1 columns, got {self.tile}")
        self._layout  # noqa: B018  (validates size and rate now)

    @functools.cached_property
    def _layout(self) -> tuple[int, int, int]:
        b = num_measurements(self.size, self.rate)
        tile = min(self.tile, self.size)
        return b, tile, math.ceil(self.size / tile)

    @property
    def shape(self) -> tuple[int, int]:
        return self._layout[0], self.size

    def _tile(self, index) -> jax.Array:
        """Columns [index * tile, (index + 1) * tile) of Phi (b x tile), from the shared seed
        (threefry
        unrolled: ``core.unrolled_threefry``, the same entries, generated faster on a CPU)."""
        b, tile, _ = self._layout
        key = unrolled(jax.random.fold_in(rng.public_key(self.seed, rng.Stream.MEASUREMENT), index))
        if self.kind == "gaussian":
            return jax.random.normal(key, (b, tile)) / math.sqrt(b)
        return jax.random.rademacher(key, (b, tile), jnp.float32) / math.sqrt(b)

    def _tiles_of(self, x: jax.Array) -> jax.Array:
        b, tile, count = self._layout
        return jnp.pad(x, (0, count * tile - self.size)).reshape(count, tile)

    def measure(self, x: jax.Array) -> jax.Array:
        b, tile, count = self._layout
        if count == 1:
            return self._tile(0) @ x

        def add(y, inputs):
            index, chunk = inputs
            return y + self._tile(index) @ chunk, None

        y, _ = jax.lax.scan(add, jnp.zeros(b, x.dtype), (jnp.arange(count), self._tiles_of(x)))
        return y

    def adjoint(self, y: jax.Array) -> jax.Array:
        b, tile, count = self._layout
        if count == 1:
            return self._tile(0).T @ y
        columns = jax.lax.map(lambda index: self._tile(index).T @ y, jnp.arange(count))
        return columns.reshape(-1)[: self.size]

    def gram_solve(self, y: jax.Array, iterations: int = 100) -> jax.Array:
        """(Phi Phi^T)^{-1} y: exact for one dense tile, else conjugate gradients (matrix-free)."""
        b, tile, count = self._layout
        if count == 1:
            phi = self._tile(0)
            return jnp.linalg.solve(phi @ phi.T, y)
        solution, _ = jax.scipy.sparse.linalg.cg(
            lambda v: self.measure(self.adjoint(v)), y, maxiter=iterations
        )
        return solution

    @functools.cached_property
    def lipschitz(self) -> float:
        """||Phi||_2^2 by 30 power iterations (an estimate, enlarged 5 % for ISTA's step safety);
        computed once per operator, not at every reconstruction."""
        v = jax.random.normal(rng.public_key(self.seed, rng.Stream.MEASUREMENT_START), (self.size,))
        for _ in range(30):
            v = self.adjoint(self.measure(v))
            v = v / jnp.linalg.norm(v)
        return 1.05 * float(jnp.linalg.norm(self.adjoint(self.measure(v))))

    def dense(self) -> np.ndarray:
        b, tile, count = self._layout
        return np.asarray(jnp.concatenate([self._tile(i) for i in range(count)], axis=1))[
            :, : self.size
        ]


def make_operator(kind: str, size: int, rate: float, seed: int = 0, tile: int = 4096):
    """The operator of ``kind`` (block | gaussian | bernoulli) for a layer of ``size`` entries."""
    if kind == "block":
        return BlockSum(size, rate)
    if kind in ("gaussian", "bernoulli"):
        return RandomMatrix(size, rate, kind, seed, tile)
    raise ValueError(f"unknown measurement operator {kind!r}; choose one of {KINDS}")
