"""Compression of a whole update pytree: one measurement operator per layer, jitted and vmappable.

``LayerwiseCompressor(reference, rates, kind, seed)`` fixes each leaf's operator (rates decide the
measurement counts, so they are static; rebuild when Alg. 2 changes them). ``compress(tree)``
returns the per-layer measurement vectors, ``reconstruct(measurements)`` the server's estimate with
the same structure as the update. Random operators get a different seed per layer, derived from
``seed``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.compression.materialized import MaterializedRandomMatrix
from fedjax_dp.compression.operators import PaddedBlockSum, make_operator, num_measurements
from fedjax_dp.compression.reconstruction import reconstruct
from fedjax_dp.compression.refresh import permuted
from fedjax_dp.compression.signs import signed


def _with_orthogonal_inputs(operators: list, permutations, signs) -> list:
    """Each layer's operator after its input maps: Phi Pi D (``refresh``'s permutation, ``signs``'
    +-1; None: none)."""
    return signed(permuted(operators, permutations), signs)


class _Layers:
    """The leaf structure and shapes of ``self.reference`` (shared by both compressors)."""

    @functools.cached_property
    def _treedef(self):
        return jax.tree_util.tree_structure(self.reference)

    @functools.cached_property
    def _shapes(self) -> list:
        return [tuple(x.shape) for x in jax.tree_util.tree_leaves(self.reference)]


@dataclasses.dataclass(frozen=True)
class LayerwiseCompressor(_Layers):
    reference: Any  # a pytree with the update's structure and shapes (arrays or ShapeDtypeStructs)
    # a pytree of floats with the same structure (``rates.dynamic_rates`` / ``fixed_rates``)
    rates: Any
    kind: str = "block"
    seed: int = 0
    method: str = "min_norm"
    tile: int = 4096
    reconstruction_options: tuple = ()

    def __post_init__(self):
        self._operators  # noqa: B018  (builds and validates the operators now)

    @functools.cached_property
    def _operators(self) -> list:
        leaves = jax.tree_util.tree_leaves(self.reference)
        rates = self._treedef.flatten_up_to(self.rates)
        return [
            make_operator(
                self.kind,
                int(np.prod(x.shape)),
                float(r),
                seed=self.seed * 1_000_003 + i,
                tile=self.tile,
            )
            for i, (x, r) in enumerate(zip(leaves, rates))
        ]

    @property
    def operators(self) -> list:
        return list(self._operators)

    @property
    def num_measurements(self) -> int:
        """Floats one client uploads per round."""
        return sum(op.shape[0] for op in self._operators)

    @property
    def num_parameters(self) -> int:
        return sum(op.shape[1] for op in self._operators)

    def _with(self, matrices) -> list:
        """The operators, each random one whose matrix ``matrices`` holds (``materialized``) using
        it."""
        if matrices is None:
            return self._operators
        return [
            op if m is None else MaterializedRandomMatrix(op, m)
            for op, m in zip(self._operators, matrices)
        ]

    def compress(self, update, matrices=None, permutations=None, signs=None) -> list:
        """``permutations``: this round's per-layer permutations (``refresh.round_permutations``) or
        None; ``signs``: the per-layer +-1 signs (``signs.layer_signs``) or None."""
        leaves = self._treedef.flatten_up_to(update)
        operators = _with_orthogonal_inputs(self._with(matrices), permutations, signs)
        return [op.measure(jnp.ravel(x)) for op, x in zip(operators, leaves)]

    def reconstruct(self, measurements: list, matrices=None, permutations=None, signs=None):
        options = dict(self.reconstruction_options)
        operators = _with_orthogonal_inputs(self._with(matrices), permutations, signs)
        leaves = [
            reconstruct(op, y, self.method, **options).reshape(shape)
            for op, y, shape in zip(operators, measurements, self._shapes)
        ]
        return jax.tree_util.tree_unflatten(self._treedef, leaves)


@dataclasses.dataclass(frozen=True)
class PaddedBlockCompressor(_Layers):
    """Alg. 3's block compression of a pytree with the per-layer row counts b_l passed as an array
    (``rows``, traced) and every layer's measurements padded to its count at ``max_rates``: the same
    measurements and reconstruction as ``LayerwiseCompressor(kind="block")`` at any rates up to
    those, from one compiled program (``operators.PaddedBlockSum``)."""

    reference: Any
    max_rates: Any  # a pytree of floats: each layer's largest rate (Alg. 2's r_max)
    method: str = "min_norm"
    reconstruction_options: tuple = ()

    @functools.cached_property
    def max_rows(self) -> tuple[int, ...]:
        rates = self._treedef.flatten_up_to(self.max_rates)
        return tuple(
            num_measurements(int(np.prod(s)), float(r)) for s, r in zip(self._shapes, rates)
        )

    def rows(self, compressor: LayerwiseCompressor) -> np.ndarray:
        """b_l of ``compressor``'s operators (host), checked against the padding."""
        rows = np.array([op.shape[0] for op in compressor.operators], np.int32)
        if np.any(rows > np.array(self.max_rows)):
            raise ValueError(
                f"measurement counts {rows.tolist()} exceed the padded counts {list(self.max_rows)}"
            )
        return rows

    def _operators(self, rows) -> list:
        return [
            PaddedBlockSum(int(np.prod(s)), m, rows[i])
            for i, (s, m) in enumerate(zip(self._shapes, self.max_rows))
        ]

    def compress(self, update, rows, permutations=None, signs=None) -> list:
        leaves = self._treedef.flatten_up_to(update)
        operators = _with_orthogonal_inputs(self._operators(rows), permutations, signs)
        return [op.measure(jnp.ravel(x)) for op, x in zip(operators, leaves)]

    def reconstruct(self, measurements: list, rows, permutations=None, signs=None):
        options = dict(self.reconstruction_options)
        operators = _with_orthogonal_inputs(self._operators(rows), permutations, signs)
        leaves = [
            reconstruct(op, y, self.method, **options).reshape(shape)
            for op, y, shape in zip(operators, measurements, self._shapes)
        ]
        return jax.tree_util.tree_unflatten(self._treedef, leaves)
