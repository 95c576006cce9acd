"""One client's local training as a pure, jittable, vmappable function.

``make_local_trainer`` builds ``train(params, batches, mask, key) -> (params, LocalStats)``: minibatch
steps of any optax optimizer under ``lax.scan``. Clients with different amounts of data share one
compiled program through padding: ``batches`` has a leading steps axis and a batch axis, ``mask``
(steps, batch) marks the real examples. A padded example contributes nothing to the masked mean loss,
and a step whose batch is all padding leaves parameters *and* optimizer state untouched, so a padded
client gets exactly the result of an unpadded loop over its real batches (McMahan et al. 2017,
ClientUpdate: E epochs of minibatch SGD).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.core import tree

PerExampleLoss = Callable[..., jax.Array]
"""``per_example_loss(params, batch, key) -> (batch_size,)`` losses."""

Regularizer = Callable[[object, object], jax.Array]
"""``regularizer(params, initial_params) -> scalar`` added to every step's loss (FedProx, FedDyn)."""


class LocalStats(NamedTuple):
    """What local training reports besides the trained parameters."""

    loss: jax.Array  # mean training loss over the real examples of all steps
    num_examples: jax.Array  # real examples processed (counted once per step they appear in)
    num_steps: jax.Array  # steps with at least one real example


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``values`` over the entries where ``mask`` is true (0 when none is)."""
    total = jnp.sum(jnp.where(mask, values, 0.0))
    return total / jnp.maximum(jnp.sum(mask), 1)


def make_local_trainer(
    per_example_loss: PerExampleLoss,
    optimizer: optax.GradientTransformation,
    *,
    unroll: int | bool = 1,
    regularizer: Regularizer | None = None,
    remat: bool = False,
):
    """Returns ``train(params, batches, mask, key) -> (params, LocalStats)``.

    Args:
      per_example_loss: ``(params, batch, key) -> (B,)`` losses of one batch.
      optimizer: the client optimizer (any optax transformation).
      unroll: ``lax.scan`` unroll factor; ``True`` unrolls every step (fastest for convolutions on
        XLA:CPU, where a conv inside a loop body runs several times slower).
      regularizer: optional term ``R(params, initial_params)`` added to each step's loss.
      remat: rematerialise each step in the backward pass (``jax.checkpoint``), which bounds the
        memory of differentiating *through* local training (UGA) by the carried parameters.
    """

    def step_loss(params, initial_params, batch, mask, key):
        loss = masked_mean(per_example_loss(params, batch, key), mask)
        if regularizer is not None:
            loss = loss + regularizer(params, initial_params)
        return loss

    def step(carry, inputs, initial_params):
        params, opt_state = carry
        batch, mask, key = inputs
        loss, grads = jax.value_and_grad(step_loss)(params, initial_params, batch, mask, key)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        real = jnp.any(mask)
        params = tree.where(real, new_params, params)
        opt_state = tree.where(real, new_opt_state, opt_state)
        return (params, opt_state), (loss, jnp.sum(mask), real)

    def train(params, batches, mask, key):
        num_steps = mask.shape[0]
        body = lambda carry, inputs: step(carry, inputs, params)  # noqa: E731
        if remat:
            body = jax.checkpoint(body)
        keys = jax.random.split(key, num_steps)
        (final_params, _), (losses, counts, real) = jax.lax.scan(
            body, (params, optimizer.init(params)), (batches, mask, keys), unroll=unroll
        )
        num_examples = jnp.sum(counts)
        mean_loss = jnp.sum(losses * counts) / jnp.maximum(num_examples, 1)
        return final_params, LocalStats(mean_loss, num_examples, jnp.sum(real))

    return train
