"""A SAME-padded, stride-1 2-D convolution with two interchangeable implementations.

``impl='xla'`` calls ``lax.conv_general_dilated``. ``impl='im2col'`` gathers the kh*kw shifted views
of the input into patches and does one matmul. Both use the parameters of ``flax.linen.Conv``
(kernel ``(kh, kw, cin, cout)``, bias ``(cout,)``) and compute the same function. im2col matters on
XLA:CPU: when per-client weights are vmapped, a conv becomes a grouped convolution (measured ~10x
slower), whereas im2col becomes a batched matmul, which XLA:CPU runs near its matmul peak.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

CONV_IMPLS = ("xla", "im2col")


def conv2d_im2col(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """SAME, stride-1 convolution of NHWC ``x`` with an HWIO ``kernel`` as patches @ kernel."""
    kh, kw, cin, cout = kernel.shape
    b, h, w, _ = x.shape
    top, left = (kh - 1) // 2, (kw - 1) // 2
    padded = jnp.pad(x, ((0, 0), (top, kh - 1 - top), (left, kw - 1 - left), (0, 0)))
    patches = jnp.concatenate([padded[:, i : i + h, j : j + w, :] for i in range(kh) for j in range(kw)], axis=-1)
    return (patches.reshape(b * h * w, kh * kw * cin) @ kernel.reshape(kh * kw * cin, cout)).reshape(b, h, w, cout)


class Conv2D(nn.Module):
    """``nn.Conv(features, kernel_size, padding='SAME')`` with a selectable implementation."""

    features: int
    kernel_size: tuple[int, int]
    impl: str = "xla"
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()  # nn.Conv's default

    @nn.compact
    def __call__(self, x):
        if self.impl not in CONV_IMPLS:
            raise ValueError(f"conv impl {self.impl!r} unknown; choose one of {CONV_IMPLS}")
        kernel = self.param(
            "kernel", self.kernel_init, self.kernel_size + (x.shape[-1], self.features)
        )
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        if self.impl == "im2col":
            y = conv2d_im2col(x, kernel)
        else:
            y = jax.lax.conv_general_dilated(
                x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
        return y + bias
