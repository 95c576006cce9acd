"""Compressed sensing as an upload transform (seed 004, Alg. 2 rates, Alg. 3 operators, ``Rec``).

The client measures each layer of its upload, y_l = Phi_l x_l; the server reconstructs. Two placements:

* ``reconstruct="each"``: the server reconstructs every upload before summing (exact for non-linear
  ``Rec`` such as ISTA); simulated inside the cohort map. For uploads that are not noised afterwards.
* ``reconstruct="aggregate"``: the measurements travel on through the chain (clip them, noise them)
  and the server reconstructs the (noised) sum, the only thing it sees under central DP. With the
  min-norm ``Rec`` (linear) the two agree up to float summation order.

Rates decide measurement counts, so they are fixed on the host each round (``specialize``): Alg. 2's
dynamic rule from the state's reference (the initial weights, then the last reconstructed aggregate) or
a fixed rate. Operators are built once per distinct rate vector. Dynamic rates with the ``block``
operator pass the counts to the round as an input and pad every layer's measurements to its count at
r_max (``pytree.PaddedBlockCompressor``), so the round compiles once, not once per rate vector (the
padding is zeros before any noise and is never read by the reconstruction; traffic counts the real
measurements). Random operators and fixed rates keep static shapes; a random operator's matrix is
generated once per round and passed in as an input while the round's random matrices fit
``materialize_gb`` (``materialized``), and regenerated tile by tile at every product otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import numpy as np

from fedjax_dp.compression import traffic
from fedjax_dp.compression.materialized import materialized_matrices
from fedjax_dp.compression.operators import KINDS
from fedjax_dp.compression.pytree import LayerwiseCompressor, PaddedBlockCompressor
from fedjax_dp.compression.rates import dynamic_rates, fixed_rates
from fedjax_dp.compression.reconstruction import METHODS
from fedjax_dp.core import tree
from fedjax_dp.core.uploads import UNBOUNDED, ClientContext, Flow, ServerContext, UploadTransform

PLACEMENTS = ("each", "aggregate")


@dataclasses.dataclass(frozen=True)
class CompressedSensing(UploadTransform):
    kind: ClassVar[str] = "compress"
    rates: str = "dynamic"  # "dynamic" (Alg. 2) or a fixed rate such as "0.5"
    r_min: float = 0.2
    r_max: float = 0.5
    operator: str = "block"  # block | gaussian | bernoulli
    method: str = "min_norm"  # min_norm | ista_dct
    seed: int = 0
    reconstruct: str = "each"
    materialize_gb: float = 1.0  # random matrices up to this many GB (float32) are held for the round
    compressor: Any = dataclasses.field(default=None, compare=False)  # set by ``specialize``
    padded: Any = dataclasses.field(default=None, compare=False)  # set by ``specialize`` (dynamic block rates)

    def __post_init__(self):
        if self.operator not in KINDS:
            raise ValueError(f"compression operator {self.operator!r} unknown; available: {KINDS}")
        if self.method not in METHODS:
            raise ValueError(f"compression method {self.method!r} unknown; available: {METHODS}")
        if self.reconstruct not in PLACEMENTS:
            raise ValueError(f"compression reconstruct {self.reconstruct!r} unknown; available: {PLACEMENTS}")
        if self.rates != "dynamic":
            fixed_rates({}, float(self.rates))  # validates the rate
        if not self.materialize_gb >= 0:
            raise ValueError(f"compression materialize_gb must be >= 0, got {self.materialize_gb!r}")

    def init(self, upload_template):
        return jax.tree_util.tree_map(lambda x: jax.numpy.asarray(x, jax.numpy.float32), upload_template)

    def rates_for(self, reference):
        if self.rates == "dynamic":
            return dynamic_rates(reference, self.r_min, self.r_max)
        return fixed_rates(reference, float(self.rates))

    def specialize(self, state) -> "CompressedSensing":
        reference = jax.tree_util.tree_map(np.asarray, jax.device_get(state))
        rates = self.rates_for(reference)
        leaves, treedef = jax.tree_util.tree_flatten(reference)
        shapes = tuple(tuple(x.shape) for x in leaves)
        compressor = _compressor(treedef, shapes, tuple(jax.tree_util.tree_leaves(rates)), self.operator, self.seed,
                                 self.method)
        padded = _padded(treedef, shapes, self.r_max, self.method) if self._pads else None
        return dataclasses.replace(self, compressor=compressor, padded=padded)

    @property
    def _pads(self) -> bool:
        return self.rates == "dynamic" and self.operator == "block"

    def static_key(self) -> tuple:
        if self._pads:
            return ("padded to r_max", self.r_max)
        return tuple(jax.tree_util.tree_leaves(self.compressor.rates)) if self.compressor is not None else ()

    def inputs(self, round_index: int) -> dict:
        if self.padded is not None:
            return {"rows": self.padded.rows(self.compressor)}
        if self.compressor is not None and self.operator != "block" and self.materialize_gb > 0:
            return {"matrices": materialized_matrices(self.compressor.operators, self.materialize_gb * 2**30)}
        return {}

    def _compress(self, upload, inputs):
        if self.padded is not None:
            return self.padded.compress(upload, inputs["rows"])
        return self.compressor.compress(upload, inputs.get("matrices"))

    def _reconstruct(self, measured, inputs):
        if self.padded is not None:
            return self.padded.reconstruct(measured, inputs["rows"])
        return self.compressor.reconstruct(measured, inputs.get("matrices"))

    def layer_rates(self) -> list[float]:
        return [float(r) for r in jax.tree_util.tree_leaves(self.compressor.rates)]

    def bound_after(self, bound, state, inputs):
        if self.reconstruct == "each" and self.method == "min_norm":
            return bound  # Rec(Phi x) is an orthogonal projection: it never increases the norm
        return jax.numpy.float32(UNBOUNDED)

    def client(self, upload, ctx: ClientContext) -> Flow:
        measured = self._compress(upload, ctx.inputs)
        if self.reconstruct == "each":
            return Flow(self._reconstruct(measured, ctx.inputs), self.bound_after(ctx.bound, None, None))
        return Flow(measured, self.bound_after(ctx.bound, None, None))

    def server(self, total, ctx: ServerContext):
        if self.reconstruct == "aggregate":
            total = self._reconstruct(total, ctx.inputs)
        # The reconstructed aggregate is Alg. 2's next reference; an all-zero one (every client dropped,
        # or nothing sent) has no norm shares, so the previous reference is kept.
        return total, tree.where(tree.l2_norm(total) > 0, total, ctx.state), {}

    def upload_bytes(self, template_bytes: int) -> int:
        return traffic.compressed_upload_bytes(self.compressor)


@functools.lru_cache(maxsize=64)
def _compressor(treedef, shapes, rates, operator, seed, method) -> LayerwiseCompressor:
    reference = jax.tree_util.tree_unflatten(treedef, [jax.ShapeDtypeStruct(s, np.float32) for s in shapes])
    return LayerwiseCompressor(reference, jax.tree_util.tree_unflatten(treedef, list(rates)), operator, seed, method)


@functools.lru_cache(maxsize=16)
def _padded(treedef, shapes, r_max, method) -> PaddedBlockCompressor:
    reference = jax.tree_util.tree_unflatten(treedef, [jax.ShapeDtypeStruct(s, np.float32) for s in shapes])
    return PaddedBlockCompressor(reference, jax.tree_util.tree_unflatten(treedef, [float(r_max)] * len(shapes)), method)
