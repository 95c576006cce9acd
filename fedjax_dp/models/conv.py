"""A SAME-padded, stride-1 2-D convolution with interchangeable implementations.

``impl='xla'`` calls ``lax.conv_general_dilated``. ``impl='im2col'`` gathers the kh*kw shifted views
of the input into patches and does one matmul. ``impl='space_to_depth'`` runs a thin first layer
(the image's 1-3 channels, ``space_to_depth_wins``) as XLA's convolution of the image's 2x2 blocks
and every other layer as XLA's (opt-in). ``impl='per_layer'`` picks for each layer by its shape:
im2col where ``im2col_suits``, else XLA. All use the parameters of ``flax.linen.Conv`` (kernel
``(kh, kw, cin, cout)``, bias ``(cout,)``) and compute the same function. The choice matters on
XLA:CPU (``benchmarks/RESULTS.md``): when per-client weights are vmapped, a conv becomes a grouped
convolution (measured ~10x slower), whereas im2col becomes a batched matmul; inside a loop
(``lax.scan`` over local steps or clients) XLA's gradient convolutions run 10-60x slower than
unrolled (jax-ml/jax#12868), im2col does not; outside loops XLA's convolution wins wherever im2col's
patch matrix, kh*kw times the input, is large against the work of its matmul, and on a thin input
XLA:CPU's convolution can run at a fraction of the rate it reaches on the 4x wider blocks. ``auto``
does not pick space-to-depth: its gain did not hold on a quiet machine.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

CONV_IMPLS = ("xla", "im2col", "space_to_depth", "per_layer")


def im2col_suits(in_features: int, out_features: int) -> bool:
    """Whether im2col beats XLA's convolution for a 5x5 layer outside loops on XLA:CPU: when the
    input is thin against the output (cout >= 8 cin), which makes the patch matrix small against the
    matmul (the measurements behind the rule: the documentation's "Measurements behind the
    defaults")."""
    return out_features >= 8 * in_features


def conv2d_im2col(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """SAME, stride-1 convolution of NHWC ``x`` with an HWIO ``kernel`` as patches @ kernel."""
    kh, kw, cin, cout = kernel.shape
    b, h, w, _ = x.shape
    top, left = (kh - 1) // 2, (kw - 1) // 2
    padded = jnp.pad(x, ((0, 0), (top, kh - 1 - top), (left, kw - 1 - left), (0, 0)))
    patches = jnp.concatenate(
        [padded[:, i : i + h, j : j + w, :] for i in range(kh) for j in range(kw)], axis=-1
    )
    return (
        patches.reshape(b * h * w, kh * kw * cin) @ kernel.reshape(kh * kw * cin, cout)
    ).reshape(b, h, w, cout)


def space_to_depth_wins(
    kernel_size: tuple[int, int], input_shape: tuple[int, ...], out_features: int
) -> bool:
    """Whether ``conv2d_space_to_depth`` applies (a square, odd kernel of at least 5, on an image of
    even sides: a 3x3 kernel would do 4x the arithmetic, a 5x5 one does 1.44x) and beats XLA's and
    im2col's convolutions on XLA:CPU: a thin input, cin <= 3 and cout <= 16 cin, at training batches
    of up to ~100 and in forward passes (the measurements: the documentation's "Measurements behind
    the defaults")."""
    kh, kw = kernel_size
    height, width, cin = input_shape[-3:]
    applies = kh == kw and kh % 2 == 1 and kh >= 5 and height % 2 == 0 and width % 2 == 0
    return applies and cin <= 3 and out_features <= 16 * cin


def _space_to_depth_kernel(kernel: jax.Array) -> jax.Array:
    """The HWIO kernel of the equivalent convolution on 2x2 blocks: ``(t, t, 4 cin, 4 cout)``, t = 2
    ceil(r/2) + 1 taps for a (2r+1)-wide kernel. Output phase (a, b) of block (i, j) takes input
    phase (p, q) of block (i + m, j + n) through tap ``kernel[2m + p - a + r, 2n + q - b + r]``
    (zero where that falls outside the kernel)."""
    k, _, cin, cout = kernel.shape
    r, half = k // 2, (k // 2 + 1) // 2
    taps = np.arange(-half, half + 1)
    # (t, p, a)
    rows = 2 * taps[:, None, None] + np.arange(2)[None, :, None] - np.arange(2)[None, None, :] + r
    padded = jnp.pad(kernel, ((1, 1), (1, 1), (0, 0), (0, 0)))  # index -1 and k read zeros
    index = np.clip(rows, -1, k) + 1
    gathered = padded[index][:, :, :, index]  # (t, p, a, t, q, b, cin, cout)
    gathered = jnp.transpose(gathered, (0, 3, 1, 4, 6, 2, 5, 7))  # (m, n, p, q, cin, a, b, cout)
    return gathered.reshape(len(taps), len(taps), 4 * cin, 4 * cout)


def conv2d_space_to_depth(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """SAME, stride-1 convolution of NHWC ``x`` (even sides) with a square, odd HWIO ``kernel`` (5x5
    or wider), computed as XLA's convolution of the image's 2x2 blocks (4 cin channels, a quarter of
    the pixels) with ``_space_to_depth_kernel`` (4 cout channels), then the blocks' outputs put back
    in place. The same function; 1.44x the arithmetic of a 5x5 layer, but on a thin input (cin 1 or
    3) XLA:CPU runs the wider convolution at several times the rate
    (``benchmarks/conv_formulations.py``)."""
    b, h, w, cin = x.shape
    cout = kernel.shape[-1]
    blocks = (
        x.reshape(b, h // 2, 2, w // 2, 2, cin)
        .transpose(0, 1, 3, 2, 4, 5)
        .reshape(b, h // 2, w // 2, 4 * cin)
    )
    y = jax.lax.conv_general_dilated(
        blocks,
        _space_to_depth_kernel(kernel),
        (1, 1),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    return (
        y.reshape(b, h // 2, w // 2, 2, 2, cout).transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, cout)
    )


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
        elif impl == "space_to_depth" and not space_to_depth_wins(
            self.kernel_size, x.shape, self.features
        ):
            impl = "xla"
        if impl == "im2col":
            y = conv2d_im2col(x, kernel)
        elif impl == "space_to_depth":
            y = conv2d_space_to_depth(x, kernel)
        else:
            y = jax.lax.conv_general_dilated(
                x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
        return y + bias
