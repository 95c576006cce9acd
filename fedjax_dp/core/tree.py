"""Pytree helpers used across the library (thin wrappers over ``optax.tree_utils``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def l2_norm(tree) -> jax.Array:
    """L2 norm of a whole pytree, as if all its leaves were flattened into one vector (integer
    leaves as float32, whose squares cannot overflow)."""
    as_float = lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.integer) else x
    return optax.tree_utils.tree_norm(jax.tree_util.tree_map(as_float, tree))


@jax.jit  # one program for the whole tree, not an eager pair of operations per leaf
def is_finite(tree) -> jax.Array:
    """True iff every entry of every leaf is finite (no NaN, no Inf)."""
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def where(condition, on_true, on_false):
    """Leaf-wise ``jnp.where`` with a scalar condition."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(condition, a, b), on_true, on_false)


def num_params(tree) -> int:
    """Total number of entries in a pytree."""
    return int(optax.tree_utils.tree_size(tree))
