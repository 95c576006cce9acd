"""Compressed sensing as an upload transform (seed 004, Alg. 2 rates, Alg. 3 operators, ``Rec``).

The client measures each layer of its upload, y_l = Phi_l x_l; the server reconstructs. Two
placements:

* ``reconstruct="each"``: the server reconstructs every upload before summing (exact for non-linear
  ``Rec`` such as ISTA); simulated inside the cohort map. For uploads that are not noised
  afterwards.
* ``reconstruct="aggregate"``: the measurements travel on through the chain (clip them, noise them)
  and the server reconstructs the (noised) sum, the only thing it sees under central DP. With the
  min-norm ``Rec`` (linear) the two agree up to float summation order.

Rates decide measurement counts, so they are fixed on the host each round (``specialize``): Alg. 2's
dynamic rule from the state's reference (the initial weights, then the last reconstructed aggregate)
or a fixed rate. Operators are built once per distinct rate vector. Dynamic rates with the ``block``
operator pass the counts to the round as an input and pad every layer's measurements to its count at
r_max (``pytree.PaddedBlockCompressor``), so the round compiles once, not once per rate vector (the
padding is zeros before any noise and is never read by the reconstruction; traffic counts the real
measurements). Random operators and fixed rates keep static shapes; a random operator's matrix is
generated once per round and passed in as an input while the round's random matrices fit
``materialize_gb`` (``materialized``), and regenerated tile by tile at every product otherwise.

``signs="random"`` (not in seed 004, ``signs``) flips each entry's sign by a shared +-1 draw before
measuring, so the block matrix no longer keeps every layer's mean shift whole (its rows sum to
all-ones; measured to collapse CIFAR-100's features), at the same cost and traffic.

``error_feedback=True`` (not in seed 004; Seide et al. 2014, Karimireddy et al. 2019's EF-SGD, Stich
et al. 2018) keeps each client's compression residual and adds it to its next upload: the client
measures x = Delta + e, sends Phi x, and keeps e' = x - Rec(Phi x) (its own noiseless
reconstruction, so with the min-norm ``Rec`` the directions its measurements missed), so what the
unmeasured directions lose in one round is sent in a later one (the sum of what a client sent plus
its residual is the sum of its updates). The residual is local state, never sent; it is per client
(``PerClientStateful``, stored like an algorithm's per-client state and checkpointed), and a client
whose update is dropped keeps its old one. A clip and noise after the compression bound and noise
the measurements of x as they would those of Delta, so a formal guarantee is unchanged; the bound
after compression is unbounded with it (x carries e). Under partial participation a residual is as
old as its client's last round (~1 / sampling rate rounds): Li & Li 2023 (Fed-EF, ICML) prove such
"stale error compensation" slows convergence; in seed 004's setting (10 of 100 clients a round,
PFLDyn's server state) it lowered accuracy in both seeds measured (``experiments/RESULTS.md``, "Alg.
3's fixed matrix keeps the model in one subspace"). With ``reconstruct="aggregate"`` each client
reconstructs its own measurements once more for its residual (for random matrices: one
conjugate-gradient solve per client). It needs ``refresh="round"``: with the same Phi every round
the residual lies in Phi's null space and is never measured (``refresh``).
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
from fedjax_dp.compression.refresh import REFRESH, round_permutations
from fedjax_dp.compression.signs import SIGNS, layer_signs
from fedjax_dp.core import tree
from fedjax_dp.core.uploads import (
    UNBOUNDED,
    BoundMapping,
    ClientContext,
    Flow,
    PerClientStateful,
    Resizing,
    Scheduled,
    ServerContext,
    Specialized,
    Stateful,
    UploadTransform,
)

PLACEMENTS = ("each", "aggregate")
FIXED_MATRIX_FEEDBACK = (
    "compression.error_feedback=True needs compression.refresh='round': with the same matrix "
    "every round (refresh='fixed') the residual x - Rec(Phi x) lies in Phi's null space and is "
    "never measured, so error feedback would send nothing more"
)


@dataclasses.dataclass(frozen=True)
class CompressedSensing(
    Stateful, PerClientStateful, Specialized, Scheduled, BoundMapping, Resizing, UploadTransform
):
    kind: ClassVar[str] = "compress"
    rates: str = "dynamic"  # "dynamic" (Alg. 2) or a fixed rate such as "0.5"
    r_min: float = 0.2
    r_max: float = 0.5
    operator: str = "block"  # block | gaussian | bernoulli
    method: str = "min_norm"  # min_norm | ista_dct
    seed: int = 0
    reconstruct: str = "each"
    # random matrices up to this many GB (float32) are held for the round
    materialize_gb: float = 1.0
    # keep each client's residual x - Rec(Phi x) and add it to its next upload
    error_feedback: bool = False
    # fixed (Alg. 3: the same matrices every round) | round (permuted per round, ``refresh``)
    refresh: str = "fixed"
    # none (Alg. 3) | random (a shared +-1 per entry before measuring, ``signs``)
    signs: str = "none"
    compressor: Any = dataclasses.field(default=None, compare=False)  # set by ``specialize``
    # set by ``specialize`` (dynamic block rates)
    padded: Any = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if self.operator not in KINDS:
            raise ValueError(f"compression operator {self.operator!r} unknown; available: {KINDS}")
        if self.method not in METHODS:
            raise ValueError(f"compression method {self.method!r} unknown; available: {METHODS}")
        if self.reconstruct not in PLACEMENTS:
            raise ValueError(
                f"compression reconstruct {self.reconstruct!r} unknown; available: {PLACEMENTS}"
            )
        if self.rates != "dynamic":
            fixed_rates({}, float(self.rates))  # validates the rate
        if not self.materialize_gb >= 0:
            raise ValueError(
                f"compression materialize_gb must be >= 0, got {self.materialize_gb!r}"
            )
        if self.refresh not in REFRESH:
            raise ValueError(f"compression refresh {self.refresh!r} unknown; available: {REFRESH}")
        if self.error_feedback and self.refresh != "round":
            raise ValueError(FIXED_MATRIX_FEEDBACK)
        if self.signs not in SIGNS:
            raise ValueError(f"compression signs {self.signs!r} unknown; available: {SIGNS}")

    def init(self, upload_template):
        return jax.tree_util.tree_map(
            lambda x: jax.numpy.asarray(x, jax.numpy.float32), upload_template
        )

    @property
    def keeps_client_state(self) -> bool:
        return self.error_feedback

    def client_state_init(self, upload_template):
        """Error feedback's residual: zero before a client's first upload."""
        if not self.error_feedback:
            return None
        return jax.tree_util.tree_map(
            lambda x: jax.numpy.zeros(x.shape, jax.numpy.float32), upload_template
        )

    def rates_for(self, reference):
        if self.rates == "dynamic":
            return dynamic_rates(reference, self.r_min, self.r_max)
        return fixed_rates(reference, float(self.rates))

    def specialize(self, state) -> "CompressedSensing":
        reference = jax.tree_util.tree_map(np.asarray, jax.device_get(state))
        rates = self.rates_for(reference)
        leaves, treedef = jax.tree_util.tree_flatten(reference)
        shapes = tuple(tuple(x.shape) for x in leaves)
        compressor = _compressor(
            treedef,
            shapes,
            tuple(jax.tree_util.tree_leaves(rates)),
            self.operator,
            self.seed,
            self.method,
        )
        padded = _padded(treedef, shapes, self.r_max, self.method) if self._pads else None
        return dataclasses.replace(self, compressor=compressor, padded=padded)

    @property
    def _pads(self) -> bool:
        return self.rates == "dynamic" and self.operator == "block"

    def static_key(self) -> tuple:
        if self._pads:
            return ("padded to r_max", self.r_max)
        return (
            tuple(jax.tree_util.tree_leaves(self.compressor.rates))
            if self.compressor is not None
            else ()
        )

    def inputs(self, round_index: int) -> dict:
        inputs = {}
        if self.padded is not None:
            inputs["rows"] = self.padded.rows(self.compressor)
        elif self.compressor is not None and self.operator != "block" and self.materialize_gb > 0:
            inputs["matrices"] = materialized_matrices(
                self.compressor.operators, self.materialize_gb * 2**30
            )
        if self.refresh == "round" and self.compressor is not None:
            inputs["permutations"] = round_permutations(
                [op.shape[1] for op in self.compressor.operators], self.seed, round_index
            )
        if self.signs == "random" and self.compressor is not None:
            inputs["signs"] = layer_signs(
                tuple(op.shape[1] for op in self.compressor.operators), self.seed
            )
        return inputs

    def _compress(self, upload, inputs):
        if self.padded is not None:
            return self.padded.compress(
                upload, inputs["rows"], inputs.get("permutations"), inputs.get("signs")
            )
        return self.compressor.compress(
            upload, inputs.get("matrices"), inputs.get("permutations"), inputs.get("signs")
        )

    def _reconstruct(self, measured, inputs):
        if self.padded is not None:
            return self.padded.reconstruct(
                measured, inputs["rows"], inputs.get("permutations"), inputs.get("signs")
            )
        return self.compressor.reconstruct(
            measured, inputs.get("matrices"), inputs.get("permutations"), inputs.get("signs")
        )

    def layer_rates(self) -> list[float]:
        return [float(r) for r in jax.tree_util.tree_leaves(self.compressor.rates)]

    def bound_after(self, bound, state, inputs):
        if self.reconstruct == "each" and self.method == "min_norm" and not self.error_feedback:
            return bound  # Rec(Phi x) is an orthogonal projection: it never increases the norm
        return jax.numpy.float32(UNBOUNDED)

    def client(self, upload, ctx: ClientContext) -> Flow:
        if self.error_feedback:
            upload = jax.tree_util.tree_map(lambda x, e: x + e, upload, ctx.client_state)
        measured = self._compress(upload, ctx.inputs)
        rebuilt = (
            self._reconstruct(measured, ctx.inputs)
            if self.reconstruct == "each" or self.error_feedback
            else None
        )
        residual = None
        # what the measurements missed; a client whose upload is not kept keeps its old one
        if self.error_feedback:
            residual = tree.where(
                ctx.keep,
                jax.tree_util.tree_map(lambda x, r: x - r, upload, rebuilt),
                ctx.client_state,
            )
        sent = rebuilt if self.reconstruct == "each" else measured
        return Flow(sent, self.bound_after(ctx.bound, None, None), client_state=residual)

    def server(self, total, ctx: ServerContext):
        if self.reconstruct == "aggregate":
            total = self._reconstruct(total, ctx.inputs)
        # The reconstructed aggregate is Alg. 2's next reference; an all-zero one (every client
        # dropped,
        # or nothing sent) has no norm shares, so the previous reference is kept.
        return total, tree.where(tree.l2_norm(total) > 0, total, ctx.state), {}

    def upload_bytes(self, template_bytes: int) -> int:
        return traffic.compressed_upload_bytes(self.compressor)


@functools.lru_cache(maxsize=64)
def _compressor(treedef, shapes, rates, operator, seed, method) -> LayerwiseCompressor:
    reference = jax.tree_util.tree_unflatten(
        treedef, [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
    )
    return LayerwiseCompressor(
        reference, jax.tree_util.tree_unflatten(treedef, list(rates)), operator, seed, method
    )


@functools.lru_cache(maxsize=16)
def _padded(treedef, shapes, r_max, method) -> PaddedBlockCompressor:
    reference = jax.tree_util.tree_unflatten(
        treedef, [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
    )
    return PaddedBlockCompressor(
        reference, jax.tree_util.tree_unflatten(treedef, [float(r_max)] * len(shapes)), method
    )
