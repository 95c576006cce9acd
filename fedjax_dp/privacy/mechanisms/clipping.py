"""Clipping of a client update to bound its sensitivity.

* Flat L2 (Geyer et al. 2017, Alg. 1; the paper's formula): Delta / max(1, ||Delta||_2 / S).
* Per-layer: each leaf l clipped to its own C_l; the joint L2 sensitivity is sqrt(sum_l C_l^2)
  (``per_layer_sensitivity``), which is what the noise must be calibrated to.
* Median S (Geyer et al.'s choice) is computed in the algorithm from the round's norms: it uses the
  clients' data without noise and is NOT covered by any DP guarantee.
* Private adaptive quantile clipping (Andrew et al. 2021, "Differentially Private Learning with
  Adaptive Clipping", Alg. 1): ``adaptive_clip_update`` moves S geometrically toward the target
  quantile gamma using a noised count of unclipped clients.

All functions are jittable and vmappable; they report the norm and whether clipping happened.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dp.core import tree


class ClipResult(NamedTuple):
    clipped: object  # the clipped pytree
    norm: jax.Array  # L2 norm before clipping (global norm, also for per-layer clipping)
    was_clipped: jax.Array  # whether any scaling happened


def _check_positive(clip_norm):
    if isinstance(clip_norm, (int, float)) and not clip_norm > 0:
        raise ValueError(f"clip norm S must be > 0, got {clip_norm}")


def clip_scale(norm, clip_norm):
    """The factor 1 / max(1, norm / S) that brings a vector of L2 norm ``norm`` within
    ``clip_norm``."""
    return 1.0 / jnp.maximum(1.0, norm / clip_norm)


def example_clip_weights(norms, mask, clip_norm, median: bool = False):
    """``(weights, C)``: each example's clip factor 1 / max(1, ||g_i|| / C), 0 on padded slots, and
    the C used: ``clip_norm``, or with ``median`` the median of the real examples' norms
    (data-dependent: no guarantee)."""
    if median:
        clip_norm = jnp.maximum(jnp.nanmedian(jnp.where(mask, norms, jnp.nan)), 1e-12)
    return jnp.where(mask, clip_scale(norms, clip_norm), 0.0), clip_norm


def clip_by_global_norm(update, clip_norm: float | jax.Array) -> ClipResult:
    """Scales ``update`` so its global L2 norm is at most ``clip_norm``."""
    _check_positive(clip_norm)
    norm = tree.l2_norm(update)
    scale = clip_scale(norm, clip_norm)
    return ClipResult(jax.tree_util.tree_map(lambda x: x * scale, update), norm, norm > clip_norm)


def clip_per_layer(update, clip_norms) -> ClipResult:
    """Clips every leaf to its own threshold (``clip_norms``: a pytree of floats matching
    ``update``)."""
    for c in jax.tree_util.tree_leaves(clip_norms):
        _check_positive(c)
    norms = jax.tree_util.tree_map(lambda x: jnp.sqrt(jnp.sum(jnp.square(x))), update)
    clipped = jax.tree_util.tree_map(
        lambda x, n, c: x / jnp.maximum(1.0, n / c), update, norms, clip_norms
    )
    any_clipped = jnp.any(
        jnp.stack(
            [
                n > c
                for n, c in zip(
                    jax.tree_util.tree_leaves(norms), jax.tree_util.tree_leaves(clip_norms)
                )
            ]
        )
    )
    return ClipResult(clipped, tree.l2_norm(update), any_clipped)


def per_layer_sensitivity(clip_norms) -> float:
    """Joint L2 sensitivity sqrt(sum_l C_l^2) of a per-layer-clipped update."""
    return math.sqrt(sum(float(c) ** 2 for c in jax.tree_util.tree_leaves(clip_norms)))


def equal_per_layer_norms(params, total: float):
    """Per-layer thresholds C_l = total / sqrt(L), so that the joint sensitivity equals
    ``total``."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    return jax.tree_util.tree_unflatten(treedef, [total / math.sqrt(len(leaves))] * len(leaves))


def adaptive_clip_update(
    clip_norm: jax.Array,
    unclipped_count: jax.Array,
    count_noise: jax.Array,
    denominator: float,
    target_quantile: float,
    learning_rate: float,
) -> jax.Array:
    """Andrew et al. 2021, Alg. 1: S <- S exp(-eta_C (b_bar - gamma)), where
    b_bar = (sum_k 1[||Delta_k|| <= S] + N(0, sigma_b^2)) / denominator is the noised fraction of
    unclipped clients (``count_noise`` is that Gaussian draw)."""
    fraction = (unclipped_count + count_noise) / denominator
    return clip_norm * jnp.exp(-learning_rate * (fraction - target_quantile))


def adaptive_update_noise_multiplier(noise_multiplier: float, count_noise_std: float) -> float:
    """Noise multiplier z_Delta of the update sum so that the update and the count together are
    z-private (Andrew et al. 2021, Thm. 1): z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)."""
    if count_noise_std <= noise_multiplier / 2:
        raise ValueError(
            f"count noise std sigma_b={count_noise_std} must exceed z/2={noise_multiplier / 2} "
            "for adaptive clipping (Andrew et al. 2021, Thm. 1)"
        )
    return (noise_multiplier**-2 - (2 * count_noise_std) ** -2) ** -0.5
