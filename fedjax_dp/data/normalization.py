"""Per-channel input standardisation with published constants: ``data.normalize = 'channel'``.

x <- (x - mean_c) / std_c per colour channel, with the mean and standard deviation of each dataset's
canonical training images as they are commonly published (CIFAR-10: Krizhevsky 2009's 50,000
training images, which our ``../shared/data/cifar10`` reproduces to 4 decimals; CIFAR-100: the
canonical training set's values, within 0.0008 of this project's non-canonical split; MNIST: 0.1307
/ 0.3081). PFLDyn's authors standardise CIFAR this way (``alpemreacar/PFL``, ``utils_dataset.py``:
the training set's per-channel mean and std); seed 004 does not say.

The constants are public numbers, not statistics of the clients' data, so using them costs no
privacy; computing them from the federated training data would be a release the accountant does not
see, and is not offered. ``'none'`` (the default) keeps the loaders' [0, 1] pixels.
"""

from __future__ import annotations

import numpy as np

NORMALIZATIONS = ("none", "channel")

# source -> (per-channel mean, per-channel std), in units of the [0, 1] pixels the loaders return.
CHANNEL_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,), (0.3081,)),
    "mnist_5k": ((0.1307,), (0.3081,)),  # a subset of MNIST: MNIST's constants
}
# same data
CHANNEL_STATS.update(
    {f"tfds:{name}": CHANNEL_STATS[name] for name in ("cifar10", "cifar100", "mnist")}
)


def _constants(source: str) -> tuple[np.ndarray, np.ndarray]:
    return tuple(np.asarray(v, np.float32) for v in CHANNEL_STATS[source])


def standardize(x: np.ndarray | None, source: str) -> np.ndarray | None:
    """``(x - mean) / std`` per channel (the last axis) with ``source``'s published constants, as
    float32."""
    if x is None:
        return None
    if source not in CHANNEL_STATS:
        raise ValueError(
            f"data.normalize='channel' has published constants for {sorted(CHANNEL_STATS)}, "
            f"not for data.source={source!r}"
        )
    mean, std = _constants(source)
    if x.shape[-1] != mean.size:
        raise ValueError(
            f"data.source={source!r}: {mean.size} channel constants for inputs of shape"
            f" {x.shape[1:]}"
        )
    return ((x - mean) / std).astype(np.float32)


def standardized_black(source: str) -> np.ndarray:
    """What a black pixel (0 in [0, 1]) becomes under ``standardize``: ``-mean / std`` per
    channel."""
    mean, std = _constants(source)
    return -mean / std
