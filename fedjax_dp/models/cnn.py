"""The CNN of McMahan et al. 2017 (FedAvg) for 28x28 images.

conv5x5-32, ReLU, max-pool 2x2, conv5x5-64, ReLU, max-pool 2x2, dense 512, ReLU, dense classes
(1,663,370 parameters for MNIST). 4.42 GFLOP per client update of 60 examples (forward + backward).
"""

import flax.linen as nn

from fedjax_dp.models.conv import Conv2D
from fedjax_dp.models.pooling import max_pool_2x2


class FedAvgCNN(nn.Module):
    num_classes: int
    conv_impl: str = "xla"

    @nn.compact
    def __call__(self, x, penultimate: bool = False):
        for features in (32, 64):
            x = nn.relu(Conv2D(features, (5, 5), impl=self.conv_impl)(x))
            x = max_pool_2x2(x)
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(512)(x))
        return x if penultimate else nn.Dense(self.num_classes)(x)
