"""A classification model: a flax module plus what federated training needs to know about it."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

COMPUTE_DTYPES = (None, "bfloat16")


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def init_params(module: nn.Module, input_shape: tuple[int, ...], input_dtype: str, key: jax.Array):
    """``module``'s fresh parameters for inputs of ``input_shape``, as one compiled program: the
    same values as flax's eager ``init`` (checked bit for bit), without compiling each initializer
    per layer shape on its own (about 1.5x faster for the MLPs and CNNs here on a 2-core CPU)."""
    return module.init(key, jnp.zeros((1,) + input_shape, input_dtype))["params"]


@dataclasses.dataclass(frozen=True)
class Model:
    """A flax module for classification with softmax cross-entropy.

    Attributes:
      name: registry name.
      module: the flax module mapping ``(B, *input_shape)`` inputs to ``(B, num_classes)`` logits.
      input_shape: the shape of one example.
      num_classes: number of output classes.
      has_conv: whether the model convolves (the cohort engine picks strategies by it on CPU).
      has_penultimate: whether ``apply(..., penultimate=True)`` gives the last hidden layer (after
        its ReLU, before the output layer): the representation PFLDyn(Proto)'s authors build
        prototypes on.
      compute_dtype: ``None`` (float32 throughout) or ``'bfloat16'``: mixed precision. Parameters,
        gradients, optimizer state, clipping and privacy noise stay float32; only the forward and
        backward arithmetic of ``apply`` runs in bfloat16 (parameters and inputs are cast on entry,
        logits cast back to float32 before the loss, and the gradient of the cast accumulates into
        float32 parameters). Matrix units take bfloat16 operands with float32 accumulation.
      loss: ``(params, x, y) -> (B,)``, each example's loss in place of softmax cross-entropy (a
        model given as functions, ``user_model.ModelFunctions``); None: cross-entropy of the logits.
    """

    name: str
    module: nn.Module
    input_shape: tuple[int, ...]
    num_classes: int
    has_conv: bool = False
    compute_dtype: str | None = None
    has_penultimate: bool = False
    loss: Callable | None = None

    def __post_init__(self):
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"model.compute_dtype {self.compute_dtype!r} unknown; choose one of"
                f" {COMPUTE_DTYPES}"
            )

    def init(self, key: jax.Array):
        """Fresh parameters (a pytree)."""
        return init_params(self.module, self.input_shape, "float32", key)

    def apply(self, params, x: jax.Array, penultimate: bool = False) -> jax.Array:
        """Logits of a batch (float32, whatever the compute dtype); with ``penultimate`` the last
        hidden layer's activations instead (models with ``has_penultimate``)."""
        if penultimate and not self.has_penultimate:
            raise ValueError(
                f"model {self.name!r} has no hidden layer to give as the penultimate representation"
            )
        options = {"penultimate": True} if penultimate else {}
        if self.compute_dtype is None:
            return self.module.apply({"params": params}, x, **options)
        dtype = jnp.dtype(self.compute_dtype)
        low = jax.tree_util.tree_map(
            lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, params
        )
        x = x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        return self.module.apply({"params": low}, x, **options).astype(jnp.float32)

    def per_example_loss(self, params, batch, key=None) -> jax.Array:
        """Softmax cross-entropy (or the model's own ``loss``) of each example of ``batch = {'x':
        ..., 'y': ...}``."""
        del key
        if self.loss is not None:
            return self.loss(params, batch["x"], batch["y"])
        logits = self.apply(params, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])

    def per_example_correct(self, params, batch) -> jax.Array:
        """1.0 where the arg-max prediction equals the label."""
        return (jnp.argmax(self.apply(params, batch["x"]), axis=-1) == batch["y"]).astype(
            jnp.float32
        )
