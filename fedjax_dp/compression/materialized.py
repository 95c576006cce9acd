"""A random measurement matrix held in memory for a round, instead of regenerated at every product.

``operators.RandomMatrix`` never holds Phi: each product regenerates it tile by tile from the shared
seed, so memory stays O(tile) but every product costs b x I random draws. The min-norm
reconstruction takes up to 100 conjugate-gradient steps of two products each, so for ``cnn_pfl``'s
dense layer on CIFAR-10 (65,536 weights, r = 0.5: 2.1e9 entries, 54 M normal draws/s on the 2-core
VM) one round needed up to 200 regenerations (~2 h of draws, estimated from that rate; the first
round of a run had not finished after 11 minutes) and Table 7's Gaussian and Bernoulli rows could
not run.

Held in memory, Phi is generated once per round (the same tiles side by side, so the same matrix
and, up to float summation order, the same measurements and reconstructions) and every product is
one matrix-vector product over memory (a 8192 x 65536 matrix: 91 ms a product, 2.8 s for 100 CG
steps, vs 14.3 s with the tiles as a batch of matrices, whose products XLA:CPU ran at 1.5 GB/s;
measured on the 2-core VM). The tiles are written into the matrix one by one in place, so generation
needs the matrix and one tile, not two matrices. The matrix is passed to the round as one of its
inputs, not captured as a constant, and ``materialized_matrices`` keeps only the current round's
matrices alive between rounds (Alg. 2 often keeps a layer's rate, so its matrix is reused).
Measured: one compress + reconstruct of an 8,192-entry layer at r = 0.25, 11.2 s regenerating vs
0.11 s held (``benchmarks/cs_compression.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp

from fedjax_dp.compression.operators import RandomMatrix
from fedjax_dp.core import rng


def matrix_bytes(operator: RandomMatrix) -> int:
    """float32 bytes of ``operator``'s matrix (b x count tile, the last tile's padded columns
    included)."""
    b, tile, count = operator._layout
    return 4 * count * b * tile


@functools.partial(jax.jit, static_argnums=0)
def _generate(operator: RandomMatrix) -> jax.Array:
    """The tiles side by side, b x (count tile): column j of Phi is column j here."""
    b, tile, count = operator._layout

    def put(index, matrix):
        return jax.lax.dynamic_update_slice(matrix, operator._tile(index), (0, index * tile))

    return jax.lax.fori_loop(0, count, put, jnp.zeros((b, count * tile), jnp.float32))


@dataclasses.dataclass(frozen=True)
class MaterializedRandomMatrix:
    """``source``'s operator with its matrix in memory (``matrix``, b x count tile): same interface
    and values; the columns past ``source.size`` (the last tile's padding) only ever meet zeros."""

    source: RandomMatrix
    matrix: jax.Array

    @property
    def shape(self) -> tuple[int, int]:
        return self.source.shape

    @property
    def lipschitz(self) -> jax.Array:
        """``source.lipschitz``'s estimate (30 power iterations from the same start, enlarged 5 %),
        with the held matrix: 60 products over memory instead of 60 regenerations of Phi."""
        v = jax.random.normal(
            rng.public_key(self.source.seed, rng.Stream.MEASUREMENT_START), (self.source.size,)
        )
        for _ in range(30):
            v = self.adjoint(self.measure(v))
            v = v / jnp.linalg.norm(v)
        return 1.05 * jnp.linalg.norm(self.adjoint(self.measure(v)))

    def measure(self, x: jax.Array) -> jax.Array:
        return self.matrix @ jnp.pad(x, (0, self.matrix.shape[1] - self.source.size))

    def adjoint(self, y: jax.Array) -> jax.Array:
        return (y @ self.matrix)[: self.source.size]

    def gram_solve(self, y: jax.Array, iterations: int = 100) -> jax.Array:
        """(Phi Phi^T)^{-1} y by the source's rule: exact for one tile, else conjugate gradients."""
        if self.source._layout[2] == 1:  # one tile: b x I exactly, no padded columns
            phi = self.matrix
            return jnp.linalg.solve(phi @ phi.T, y)
        solution, _ = jax.scipy.sparse.linalg.cg(
            lambda v: self.measure(self.adjoint(v)), y, maxiter=iterations
        )
        return solution


_current: dict = {}  # operator -> its matrix, for the operators of the last call only
_warned: set = set()  # operators already reported as too large to hold


def materialized_matrices(operators, limit_bytes: float) -> tuple:
    """Per layer: the matrix of each random operator (or None: a block operator, or over the limit).

    Random operators are taken in order while their matrices fit ``limit_bytes`` together. An
    operator that comes back (same size, rate, kind and seed) reuses its matrix from the previous
    call; the others' are released before any new matrix is generated, so at most one round's
    matrices live.
    """
    global _current
    wanted, used = [], 0
    for op in operators:
        fits = isinstance(op, RandomMatrix) and used + matrix_bytes(op) <= limit_bytes
        used += matrix_bytes(op) if fits else 0
        wanted.append(op if fits else None)
        if isinstance(op, RandomMatrix) and not fits and op not in _warned:
            _warned.add(op)
            logging.warning(
                "compression: a %s matrix of %.2f GB (%d x %d) does not fit"
                " compression.materialize_gb (%.2f GB, %.2f GB already held); it is regenerated at"
                " every product, about 100x slower per reconstruction: raise the limit if memory"
                " allows",
                op.kind,
                matrix_bytes(op) / 2**30,
                *op.shape,
                limit_bytes / 2**30,
                used / 2**30,
            )
    _current = {op: _current[op] for op in wanted if op is not None and op in _current}
    for op in wanted:
        if op is not None and op not in _current:
            _current[op] = _generate(op)
    return tuple(None if op is None else _current[op] for op in wanted)
