"""Clipping as upload transforms: each bounds a client's L2 contribution and says by how much.

* ``FlatClip(S)``: Delta / max(1, ||Delta||_2 / S) (Geyer et al. 2017, Alg. 1).
* ``PerLayerClip(C_l)``: each layer to its own C_l; joint bound sqrt(sum_l C_l^2).
* ``AdaptiveQuantileClip``: Andrew et al. 2021, Alg. 1: S_t follows the target quantile gamma
  through a noised count of unclipped clients. As in TF Privacy's quantile estimator, each
  participating client contributes b - 1/2 (b = 1 if unclipped), so one client moves the count by at
  most 1/2 under add/remove neighbours; the server adds 1/2 back after dividing by the fixed
  denominator and clamps the estimate to [0, 1] as TF Privacy's ``QuantileEstimatorQuery`` does (the
  noise, or a realised cohort larger than D, can push it outside; post-processing, so no privacy
  cost). The count is a central Gaussian release (std sigma_b, bound 1/2) the tracker composes with
  the update noise.
* ``MedianClip``: Geyer et al.'s S = median of the round's norms, a cohort-level (server-side) clip
  on raw norms: NOT private, released with ``formal=False``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.core import rng, tree
from fedjax_dp.core.uploads import (
    BoundMapping,
    ClientContext,
    CohortLevel,
    Flow,
    KeyDrawing,
    Release,
    RunVarying,
    ServerContext,
    Stateful,
    UploadTransform,
    varying,
)
from fedjax_dp.privacy.mechanisms import clipping
from fedjax_dp.privacy.mechanisms.gaussian import standard_normal


def clip_metrics(ctx: ServerContext, clip_norm) -> dict:
    """Clip threshold, fraction of present clients clipped, median norm of the kept updates."""
    present = jnp.maximum(jnp.sum(ctx.present), 1)
    norms = jnp.where(ctx.kept, ctx.stats["norm"], jnp.nan)
    return {
        "clip_norm": clip_norm,
        "clipped_fraction": jnp.sum(ctx.stats["clipped"]) / present,
        "median_update_norm": jnp.nanmedian(norms),
    }


def unclipped_fraction(shifted_count, denominator):
    """b_bar = clamp(shifted noised count / D + 1/2, 0, 1): Andrew et al.'s estimate of the
    unclipped fraction, clamped as TF Privacy's ``QuantileEstimatorQuery.get_noised_result``
    ("protect against out-of-range estimates"), so one round moves the threshold by at most exp(eta
    max(gamma, 1 - gamma))."""
    return jnp.clip(shifted_count / denominator + AdaptiveQuantileClip.COUNT_BOUND, 0.0, 1.0)


def _flow(result: clipping.ClipResult, bound, keep) -> Flow:
    return Flow(
        result.clipped, bound, {}, {"norm": result.norm, "clipped": result.was_clipped & keep}
    )


@dataclasses.dataclass(frozen=True)
class FlatClip(BoundMapping, RunVarying, UploadTransform):
    """``clip_norm`` may differ between runs batched in one program (``RunVarying``)."""

    kind: ClassVar[str] = "clip"
    run_varying: ClassVar[tuple] = ("clip_norm",)
    clip_norm: float = 1.0

    def __post_init__(self):
        if not self.clip_norm > 0:
            raise ValueError(f"clip norm S must be > 0, got {self.clip_norm}")

    def bound_after(self, bound, state, inputs):
        return jnp.float32(varying(self, inputs, "clip_norm"))

    def client(self, upload, ctx: ClientContext) -> Flow:
        clip_norm = varying(self, ctx.inputs, "clip_norm")
        return _flow(
            clipping.clip_by_global_norm(upload, clip_norm), jnp.float32(clip_norm), ctx.keep
        )

    def server(self, total, ctx: ServerContext):
        clip_norm = varying(self, ctx.inputs, "clip_norm")
        return total, ctx.state, clip_metrics(ctx, jnp.float32(clip_norm))


@dataclasses.dataclass(frozen=True)
class PerLayerClip(BoundMapping, UploadTransform):
    """``layer_norms``: C_l per leaf, in ``jax.tree_util`` leaf order (``equal_split`` gives S /
    sqrt(L))."""

    kind: ClassVar[str] = "clip"
    layer_norms: tuple = ()

    def __post_init__(self):
        if not self.layer_norms or any(not c > 0 for c in self.layer_norms):
            raise ValueError(f"per-layer clip norms must all be > 0, got {self.layer_norms}")

    @classmethod
    def equal_split(cls, upload_template, total: float) -> "PerLayerClip":
        return cls(
            tuple(
                float(c)
                for c in jax.tree_util.tree_leaves(
                    clipping.equal_per_layer_norms(upload_template, total)
                )
            )
        )

    @property
    def sensitivity(self) -> float:
        return math.sqrt(sum(c * c for c in self.layer_norms))

    def bound_after(self, bound, state, inputs):
        return jnp.float32(self.sensitivity)

    def client(self, upload, ctx: ClientContext) -> Flow:
        leaves, treedef = jax.tree_util.tree_flatten(upload)
        if len(leaves) != len(self.layer_norms):
            raise ValueError(
                f"{len(self.layer_norms)} per-layer clip norms for an upload of {len(leaves)}"
                " layers"
            )
        norms = jax.tree_util.tree_unflatten(treedef, list(self.layer_norms))
        return _flow(
            clipping.clip_per_layer(upload, norms), jnp.float32(self.sensitivity), ctx.keep
        )

    def server(self, total, ctx: ServerContext):
        return total, ctx.state, clip_metrics(ctx, jnp.float32(self.sensitivity))


@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: no float can take another's place
class AdaptiveQuantileClip(Stateful, BoundMapping, KeyDrawing, UploadTransform):
    """Andrew et al. 2021: S_{t+1} = S_t exp(-eta_C (b_bar - gamma)),
    b_bar = clamp((sum_k (b_k - 1/2) + N(0, sigma_b^2)) / D + 1/2, 0, 1) (the clamp: TF
    Privacy's)."""

    kind: ClassVar[str] = "clip"
    initial_clip_norm: float = 1.0
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise_std: float = 1.0  # sigma_b
    denominator: float = 1.0  # D, the fixed expected cohort size

    def __post_init__(self):
        for name in ("initial_clip_norm", "count_noise_std", "denominator"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"adaptive clipping: {name} must be > 0, got {getattr(self, name)}"
                )
        if not 0 < self.target_quantile < 1:
            raise ValueError(
                f"adaptive clipping: target_quantile must lie in (0, 1), got {self.target_quantile}"
            )

    COUNT_BOUND: ClassVar[float] = 0.5  # |b - 1/2|: one client's contribution to the count

    def init(self, upload_template):
        return jnp.asarray(self.initial_clip_norm, jnp.float32)

    def bound_after(self, bound, state, inputs):
        return state

    def client(self, upload, ctx: ClientContext) -> Flow:
        result = clipping.clip_by_global_norm(upload, ctx.state)
        unclipped = (ctx.keep & ~result.was_clipped).astype(jnp.float32)
        flow = _flow(result, ctx.state, ctx.keep)
        return flow._replace(
            extras={"count": jnp.where(ctx.present, unclipped - self.COUNT_BOUND, 0.0)}
        )

    def server(self, total, ctx: ServerContext):
        noise = self.count_noise_std * standard_normal(
            rng.purpose_key(ctx.noise_key, rng.Purpose.CLIP_ADAPTATION), ()
        )
        fraction = unclipped_fraction(ctx.extras["count"] + noise, self.denominator)
        next_clip = ctx.state * jnp.exp(-self.learning_rate * (fraction - self.target_quantile))
        return total, next_clip, clip_metrics(ctx, ctx.state)

    def key_uses(self) -> tuple:
        return (rng.Purpose.CLIP_ADAPTATION,)

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        return (
            Release(
                "adaptive-clip count of unclipped clients (Andrew et al. 2021)",
                "central",
                self.count_noise_std / self.COUNT_BOUND,
                "1/2 per client (b - 1/2)",
                bound_value=self.COUNT_BOUND,
            ),
        )


@dataclasses.dataclass(frozen=True)
class MedianClip(CohortLevel, UploadTransform):
    """Geyer et al. 2017's S = median of the round's update norms, then flat clipping. The threshold
    is computed from raw updates without noise: no DP guarantee covers it."""

    kind: ClassVar[str] = "clip"

    def cohort(self, uploads, ctx: ServerContext):
        norms = jax.vmap(tree.l2_norm)(uploads)
        clip_norm = jnp.nanmedian(jnp.where(ctx.kept, norms, jnp.nan))
        scale = jnp.where(ctx.kept, 1.0 / jnp.maximum(1.0, norms / clip_norm), 0.0)
        clipped = jax.tree_util.tree_map(
            lambda u: u * scale.reshape(scale.shape + (1,) * (u.ndim - 1)), uploads
        )
        return clipped, clip_norm, {"norm": norms, "clipped": ctx.kept & (norms > clip_norm)}

    def server(self, total, ctx: ServerContext):
        return (
            total,
            ctx.state,
            clip_metrics(ctx, jnp.nanmedian(jnp.where(ctx.kept, ctx.stats["norm"], jnp.nan))),
        )

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        return (
            Release(
                "median clipping threshold (Geyer et al. 2017)",
                "central",
                0.0,
                "none: S is the median of raw update norms",
                formal=False,
                bound_value=math.inf,
                note="the clip threshold is computed from the clients' updates without noise",
            ),
        )
