"""Multilayer perceptrons with ReLU.

``2NN`` (784-200-200-10) is McMahan et al. 2017's MNIST MLP; 784-600-100-10 is the model of Geyer et
al.'s public DP-FedAvg code (seed 000).
"""

from typing import Sequence

import flax.linen as nn


class MLP(nn.Module):
    hidden: Sequence[int]
    num_classes: int

    @nn.compact
    def __call__(self, x, penultimate: bool = False):
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return x if penultimate else nn.Dense(self.num_classes)(x)
