"""Compression of a whole update pytree: one measurement operator per layer, jitted and vmappable.

``LayerwiseCompressor(reference, rates, kind, seed)`` fixes each leaf's operator (rates decide the
measurement counts, so they are static; rebuild when Alg. 2 changes them). ``compress(tree)`` returns
the per-layer measurement vectors, ``reconstruct(measurements)`` the server's estimate with the same
structure as the update. Random operators get a different seed per layer, derived from ``seed``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.compression.operators import make_operator
from fedjax_dp.compression.reconstruction import reconstruct


@dataclasses.dataclass(frozen=True)
class LayerwiseCompressor:
    reference: Any  # a pytree with the update's structure and shapes (arrays or ShapeDtypeStructs)
    rates: Any  # a pytree of floats with the same structure (``rates.dynamic_rates`` / ``fixed_rates``)
    kind: str = "block"
    seed: int = 0
    method: str = "min_norm"
    tile: int = 4096
    reconstruction_options: tuple = ()

    def __post_init__(self):
        self._operators  # noqa: B018  (builds and validates the operators now)

    @functools.cached_property
    def _treedef(self):
        return jax.tree_util.tree_structure(self.reference)

    @functools.cached_property
    def _shapes(self) -> list:
        return [tuple(x.shape) for x in jax.tree_util.tree_leaves(self.reference)]

    @functools.cached_property
    def _operators(self) -> list:
        leaves = jax.tree_util.tree_leaves(self.reference)
        rates = self._treedef.flatten_up_to(self.rates)
        return [make_operator(self.kind, int(np.prod(x.shape)), float(r), seed=self.seed * 1_000_003 + i, tile=self.tile)
                for i, (x, r) in enumerate(zip(leaves, rates))]

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

    def compress(self, update) -> list:
        leaves = self._treedef.flatten_up_to(update)
        return [op.measure(jnp.ravel(x)) for op, x in zip(self._operators, leaves)]

    def reconstruct(self, measurements: list):
        options = dict(self.reconstruction_options)
        leaves = [reconstruct(op, y, self.method, **options).reshape(shape)
                  for op, y, shape in zip(self._operators, measurements, self._shapes)]
        return jax.tree_util.tree_unflatten(self._treedef, leaves)
