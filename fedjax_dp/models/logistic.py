"""Multinomial logistic regression: one dense layer on the flattened input."""

import flax.linen as nn


class Logistic(nn.Module):
    num_classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
