"""A classification model: a flax module plus what federated training needs to know about it."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class Model:
    """A flax module for classification with softmax cross-entropy.

    Attributes:
      name: registry name.
      module: the flax module mapping ``(B, *input_shape)`` inputs to ``(B, num_classes)`` logits.
      input_shape: the shape of one example.
      num_classes: number of output classes.
      has_conv: whether the model convolves (the cohort engine picks strategies by it on CPU).
    """

    name: str
    module: nn.Module
    input_shape: tuple[int, ...]
    num_classes: int
    has_conv: bool = False

    def init(self, key: jax.Array):
        """Fresh parameters (a pytree)."""
        return self.module.init(key, jnp.zeros((1,) + self.input_shape, jnp.float32))["params"]

    def apply(self, params, x: jax.Array) -> jax.Array:
        """Logits of a batch."""
        return self.module.apply({"params": params}, x)

    def per_example_loss(self, params, batch, key=None) -> jax.Array:
        """Softmax cross-entropy of each example of ``batch = {'x': ..., 'y': ...}``."""
        del key
        logits = self.apply(params, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])

    def per_example_correct(self, params, batch) -> jax.Array:
        """1.0 where the arg-max prediction equals the label."""
        return (jnp.argmax(self.apply(params, batch["x"]), axis=-1) == batch["y"]).astype(jnp.float32)
