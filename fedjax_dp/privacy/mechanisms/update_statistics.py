"""Geyer et al. 2017, Fig. 2: the between-clients variance V_c and the update scale U_s of a round's
kept updates, over every parameter entry (i, j):
    mu_ij = mean_k Delta^k_ij,  V_c = mean_ij mean_k (Delta^k_ij - mu_ij)^2,  U_s = mean_ij mu_ij^2.
Computed from the raw (unclipped) updates: diagnostics outside any DP guarantee. Put first in a
chain.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.core import tree
from fedjax_dp.core.uploads import ClientContext, Flow, ServerContext, UploadTransform


@dataclasses.dataclass(frozen=True)
class UpdateStatistics(UploadTransform):
    kind: ClassVar[str] = "diagnostic"

    def client(self, upload, ctx: ClientContext) -> Flow:
        return Flow(
            upload, ctx.bound, {"raw": upload, "raw_sq": jax.tree_util.tree_map(jnp.square, upload)}
        )

    def server(self, total, ctx: ServerContext):
        k = jnp.maximum(jnp.sum(ctx.kept).astype(jnp.float32), 1.0)
        mean = jax.tree_util.tree_map(lambda s: s / k, ctx.extras["raw"])
        var = jax.tree_util.tree_map(
            lambda sq, m: jnp.maximum(sq / k - jnp.square(m), 0.0), ctx.extras["raw_sq"], mean
        )
        size = tree.num_params(mean)
        total_of = lambda t: sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(t))  # noqa: E731
        return (
            total,
            ctx.state,
            {
                "between_client_variance": total_of(var) / size,
                "update_scale": total_of(jax.tree_util.tree_map(jnp.square, mean)) / size,
            },
        )
