"""The CNNs of CUAG-PFL (seed 004 §7.1: "two convolutional layers, two max-pooling layers, two fully
connected layers and a softmax", the architecture of PFLDyn, Acar et al. 2021) and VGG16 (Simonyan
and Zisserman 2015, the CIFAR variant: 13 conv layers with batch norm replaced by nothing, 5
max-pools, classifier 512-512-classes).

Widths of ``PflCNN`` are not given by the paper; they are chosen so that one upload matches its
traffic: Table 2 reports 0.8918 GB uplink for PFLDyn(Proto) over 300 rounds x 10 clients, i.e.
297,267 bytes = 74,317 float32 parameters per upload (GB = 1e9 B). conv5x5-16, pool, conv5x5-16,
pool, dense 64, dense 10 has 73,882 parameters on 32x32x3 inputs (0.8866 GB over the same 3,000
uploads, -0.6 %); with 100 classes 79,732. The output is the class logits for the softmax baselines
and the representation r_W(x) for the prototype transform of PFLDyn(Proto) (its dimension is the
class count).

``AuthorsCNN`` (model ``cnn_pfl_authors``) is the CNN of PFLDyn's authors' CIFAR script (Acar et al.
2021's code): conv5x5-64, pool, conv5x5-64, pool, dense 384, dense 192, classes, with VALID
(unpadded) convolutions as PyTorch's
default: 797,962 parameters on 32x32x3 with 10 classes, about 11x the upload the seed's traffic
implies. Not the seed's model; offered to test whether the model's size explains seed 004's gaps
(the GPU grid).

VGG16 here has 15,245,130 parameters for 10 classes (about 15M); it needs square
inputs whose side is a multiple of 32 (five 2x2 pools), so 28x28 MNIST-like inputs are refused. Its
conv and hidden dense weights are He-normal (He et al. 2015, Eq. 10: variance 2 / fan_in;
torchvision's VGG uses the fan_out form for its convs): with flax's LeCun-normal default and no
normalisation the 15 ReLU layers shrank the signal ~100x (output std 0.0012 on CIFAR-10, gradient
norm 3e-5) and no run trained (experiments/RESULTS.md, "Table 6 with VGG16"). The output layer keeps
the LeCun default.

``VGG16(group_norm=True)`` (model ``vgg16_gn``) puts a GroupNorm (Wu and He 2018, 32 groups) after
every conv, in place of the batch norm of the usual CIFAR VGG16: it normalises each example on its
own, so it works with per-client vmapped training, small client batches and per-example DP clipping,
where batch statistics would mix examples (and clients). Not in the seed, which does not say which
VGG16 it ran: a departure, named as such wherever its results appear; it adds 8,448 parameters (a
scale and a bias per channel).
"""

import flax.linen as nn

from fedjax_dp.models.conv import Conv2D
from fedjax_dp.models.pooling import max_pool_2x2

HE_NORMAL = nn.initializers.he_normal()  # variance 2 / fan_in (truncated normal)
VGG16_LAYERS = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
)


class PflCNN(nn.Module):
    num_outputs: int
    conv_impl: str = "xla"
    features: tuple[int, int] = (16, 16)
    hidden: int = 64

    @nn.compact
    def __call__(self, x, penultimate: bool = False):
        for features in self.features:
            x = nn.relu(Conv2D(features, (5, 5), impl=self.conv_impl)(x))
            x = max_pool_2x2(x)
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.hidden)(x))
        return x if penultimate else nn.Dense(self.num_outputs)(x)


def valid_conv(features: int, impl: str, x):
    """A 5x5 VALID convolution: the SAME one (any ``Conv2D`` implementation) cropped by 2 on each
    side, the same values as an unpadded convolution for stride 1."""
    y = Conv2D(features, (5, 5), impl=impl)(x)
    return y[:, 2:-2, 2:-2, :]


class AuthorsCNN(nn.Module):
    num_outputs: int
    conv_impl: str = "xla"

    @nn.compact
    def __call__(self, x, penultimate: bool = False):
        for features in (64, 64):
            x = max_pool_2x2(nn.relu(valid_conv(features, self.conv_impl, x)))
        x = x.reshape((x.shape[0], -1))
        for width in (384, 192):
            x = nn.relu(nn.Dense(width)(x))
        return x if penultimate else nn.Dense(self.num_outputs)(x)


class VGG16(nn.Module):
    num_outputs: int
    conv_impl: str = "xla"
    group_norm: bool = False

    @nn.compact
    def __call__(self, x, penultimate: bool = False):
        if x.shape[1] % 32 or x.shape[2] % 32:
            raise ValueError(
                "vgg16 needs inputs whose height and width are multiples of 32 (five 2x2"
                f" max-pools), got {tuple(x.shape[1:])}"
            )
        for layer in VGG16_LAYERS:
            if layer == "M":
                x = max_pool_2x2(x)
            else:
                x = Conv2D(layer, (3, 3), impl=self.conv_impl, kernel_init=HE_NORMAL)(x)
                x = nn.relu(nn.GroupNorm(num_groups=32)(x) if self.group_norm else x)
        x = x.reshape((x.shape[0], -1))
        for width in (512, 512):
            x = nn.relu(nn.Dense(width, kernel_init=HE_NORMAL)(x))
        return x if penultimate else nn.Dense(self.num_outputs)(x)


def check_input_shape(name: str, input_shape: tuple) -> None:
    """Refuses an input shape a model cannot take, naming both (before any data is loaded)."""
    if name.startswith("vgg16") and (
        len(input_shape) != 3 or input_shape[0] % 32 or input_shape[1] % 32
    ):
        raise ValueError(
            f"model.name={name!r} needs 32x32 (or larger multiple-of-32) images; the data gives "
            f"{tuple(input_shape)} (e.g. 28x28 MNIST/FEMNIST): use cnn_pfl or cnn_fedavg there"
        )
