"""Gaussian mechanisms on pytrees: central and local noise, one code path.

Central DP (Geyer et al. 2017; seed 001): clients send clipped updates, the server adds ONE draw of
N(0, (z S)^2 I) to their sum and divides by a fixed denominator. Local DP (seed 001): every client
adds its own N(0, (z S)^2 I) to its clipped update before sending; the server only averages.
``gaussian_noise_like`` is the single primitive; ``NoiseMode`` says who calls it.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp


class NoiseMode(str, enum.Enum):
    CENTRAL = "central"
    LOCAL = "local"


def gaussian_noise_like(tree, std: float | jax.Array, key: jax.Array):
    """Independent N(0, std^2) noise for every entry of ``tree`` (one subkey per leaf)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    noise = [std * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, noise)


def add_gaussian_noise(tree, std: float | jax.Array, key: jax.Array):
    """``tree + N(0, std^2 I)``."""
    return jax.tree_util.tree_map(jnp.add, tree, gaussian_noise_like(tree, std, key))
