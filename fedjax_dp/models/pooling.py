"""2x2, stride-2 max pooling as a reshape and a max: the same values as ``flax.linen.max_pool(x, (2,
2), strides=(2, 2))`` (VALID: an odd last row or column is dropped), with a cheaper gradient.

``nn.max_pool`` is a ``reduce_window``; its gradient on XLA:CPU goes through select-and-scatter. The
max over axes of a ``(b, h/2, 2, w/2, 2, c)`` view differentiates into an elementwise mask instead.
The two gradients are equal except where a window holds tied maxima (``reduce_window`` sends the
gradient to one of them, this splits it evenly): after a ReLU the only likely ties are zeros, whose
ReLU gradient is zero either way. Measured on workload W's CNN
(``benchmarks/RESULTS.md``).
"""

import jax
import jax.numpy as jnp


def max_pool_2x2(x: jax.Array) -> jax.Array:
    """Max over non-overlapping 2x2 windows of an NHWC array."""
    b, h, w, c = x.shape
    x = x[:, : h - h % 2, : w - w % 2, :]
    return jnp.max(x.reshape(b, h // 2, 2, w // 2, 2, c), axis=(2, 4))
