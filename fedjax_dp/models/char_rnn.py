"""Character-level recurrent model for Shakespeare next-character prediction.

Embedding (8 dims) -> stacked GRU (256 units each) -> per-position logits over the vocabulary: the
UGA/FedMeta paper's "character GRU" (ALGORITHMS.md §2), sized as TFF's char-RNN benchmark
(McMahan et al. 2017 use an LSTM of the same widths). Targets equal to the padding id are masked:
an example's loss and accuracy are means over its real (non-padding) positions.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_dp.models.base import Model


class CharGRU(nn.Module):
    vocab_size: int
    embed_dim: int = 8
    hidden: Sequence[int] = (256, 256)

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab_size, self.embed_dim)(tokens)
        for width in self.hidden:
            x = nn.RNN(nn.GRUCell(width))(x)
        return nn.Dense(self.vocab_size)(x)


@dataclasses.dataclass(frozen=True)
class SequenceModel(Model):
    """A ``Model`` whose labels are per-position targets ``(B, T)``; ``pad_id`` targets are
    ignored."""

    pad_id: int = 0

    def init(self, key: jax.Array):
        # eager, not ``base.init_params``: compiled whole, the embedding's initializer differs in
        # the last bit
        return self.module.init(key, jnp.zeros((1,) + self.input_shape, jnp.int32))["params"]

    def _mask(self, y):
        mask = (y != self.pad_id).astype(jnp.float32)
        return mask, jnp.maximum(mask.sum(axis=-1), 1.0)

    def per_example_loss(self, params, batch, key=None) -> jax.Array:
        del key
        logits = self.apply(params, batch["x"].astype(jnp.int32))
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        mask, count = self._mask(batch["y"])
        return (losses * mask).sum(axis=-1) / count

    def per_example_correct(self, params, batch) -> jax.Array:
        hits = jnp.argmax(self.apply(params, batch["x"].astype(jnp.int32)), axis=-1) == batch["y"]
        mask, count = self._mask(batch["y"])
        return (hits * mask).sum(axis=-1) / count


def char_gru(
    sequence_length: int,
    vocab_size: int,
    pad_id: int = 0,
    hidden: Sequence[int] = (256, 256),
    name: str = "char_gru",
) -> SequenceModel:
    """``char_gru``: GRU 256 x 2 (the paper's and TFF's); ``char_gru_small``: one GRU of 128
    units."""
    return SequenceModel(
        name,
        CharGRU(vocab_size, hidden=tuple(hidden)),
        (sequence_length,),
        vocab_size,
        pad_id=pad_id,
    )
