"""A SAME-padded, stride-1 2-D convolution with interchangeable implementations.

``impl='xla'`` calls ``lax.conv_general_dilated``. ``impl='im2col'`` gathers the kh*kw shifted views
of the input into patches and does one matmul. ``impl='per_layer'`` picks one of the two for each layer
by its shape (``im2col_suits``). All use the parameters of ``flax.linen.Conv`` (kernel
``(kh, kw, cin, cout)``, bias ``(cout,)``) and compute the same function. The choice matters on XLA:CPU
(``benchmarks/RESULTS.md``): when per-client weights are vmapped, a conv becomes a grouped convolution
(measured ~10x slower), whereas im2col becomes a batched matmul; inside a loop (``lax.scan`` over local
steps or clients) XLA's gradient convolutions run 10-60x slower than unrolled (jax-ml/jax#12868), im2col
does not; outside loops XLA's convolution wins wherever im2col's patch matrix, kh*kw times the input, is
large against the work of its matmul.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

CONV_IMPLS = ("xla", "im2col", "per_layer")


def im2col_suits(in_features: int, out_features: int) -> bool:
    """Whether im2col beats XLA's convolution for a 5x5 layer outside loops on XLA:CPU: when the input is thin
    against the output (cout >= 8 cin), which makes the patch matrix small against the matmul. Measured
    (forward + backward, 2-core VM, 2026-11-26), time XLA / im2col at batch x side, cin -> cout: 10 x 28,
    1 -> 32: 1.23; 100 x 28, 1 -> 32: 2.73; 50 x 32, 3 -> 64: 1.88 (im2col wins); 10 x 14, 32 -> 64: 0.90;
    100 x 32, 3 -> 16: 0.62; 100 x 16, 16 -> 16: 0.31; 50 x 16, 16 -> 32: 0.73; 50 x 16, 64 -> 64: 0.87 (XLA
    wins); the one miss of the rule, 10 x 32, 3 -> 16: 1.14."""
    return out_features >= 8 * in_features


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
        impl = self.impl
        if impl == "per_layer":
            impl = "im2col" if im2col_suits(x.shape[-1], self.features) else "xla"
        if impl == "im2col":
            y = conv2d_im2col(x, kernel)
        else:
            y = jax.lax.conv_general_dilated(
                x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
        return y + bias
