"""Correlation-weighted aggregation (seed 003, the local mini-batch DP patent, step s6 and claim 4):
each kept client's weight is a_k = softmax_k(tau * cos(Delta_k, mean Delta)) over the round's kept
clients, so updates that agree with the cohort count more; ``tau = 0`` is the plain mean.

A cohort-level upload transform: it needs every upload of the round (their mean first), so it runs
on the stacked uploads at the server. Each row becomes a_k K Delta_k (K kept clients), so the sum
divided by K, as ``UniformWeights`` divides it, is sum_k a_k Delta_k. It touches only uploads that
are already noised at every local step (post-processing), and it releases nothing.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.core.uploads import CohortLevel, ServerContext, UploadTransform


def correlation_weights(uploads, kept, temperature: float) -> jax.Array:
    """a_k = softmax(tau cos(Delta_k, mean of the kept Delta)) over kept rows (0 elsewhere)."""
    flat = jax.vmap(lambda u: jnp.concatenate([x.ravel() for x in jax.tree_util.tree_leaves(u)]))(
        uploads
    )
    flat = jnp.where(kept[:, None], flat, 0.0)
    mean = jnp.sum(flat, axis=0) / jnp.maximum(jnp.sum(kept), 1)
    cosine = flat @ mean / jnp.maximum(jnp.linalg.norm(flat, axis=1) * jnp.linalg.norm(mean), 1e-12)
    logits = jnp.where(kept, temperature * cosine, -jnp.inf)
    return jnp.where(kept, jax.nn.softmax(logits), 0.0), cosine


@dataclasses.dataclass(frozen=True)
class CorrelationWeights(CohortLevel, UploadTransform):
    kind: ClassVar[str] = "reweight"
    temperature: float = 1.0  # tau

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"correlation temperature tau must be >= 0, got {self.temperature!r}")

    def cohort(self, uploads, ctx: ServerContext):
        weights, cosine = correlation_weights(uploads, ctx.kept, self.temperature)
        scale = weights * jnp.sum(ctx.kept)
        scaled = jax.tree_util.tree_map(
            lambda u: u * scale.reshape(scale.shape + (1,) * (u.ndim - 1)), uploads
        )
        return scaled, ctx.bound, {"weight": weights, "cosine": cosine}

    def server(self, total, ctx: ServerContext):
        kept = ctx.kept
        mean_cos = jnp.sum(jnp.where(kept, ctx.stats["cosine"], 0.0)) / jnp.maximum(
            jnp.sum(kept), 1
        )
        return (
            total,
            ctx.state,
            {"max_client_weight": jnp.max(ctx.stats["weight"]), "mean_cosine_to_mean": mean_cos},
        )
