"""Flax models and a registry: ``get_model(name, input_shape, num_classes, **options)``."""

from __future__ import annotations

import dataclasses

from fedjax_dp.models.base import COMPUTE_DTYPES, Model
from fedjax_dp.models.char_rnn import SequenceModel, char_gru
from fedjax_dp.models.cnn import FedAvgCNN
from fedjax_dp.models.logistic import Logistic
from fedjax_dp.models.mlp import MLP
from fedjax_dp.models.pfl_cnn import VGG16, AuthorsCNN, PflCNN, check_input_shape

MODEL_NAMES = (
    "logistic",
    "mlp_2nn",
    "mlp_600_100",
    "cnn_fedavg",
    "cnn_pfl",
    "cnn_pfl_authors",
    "vgg16",
    "vgg16_gn",
    "char_gru",
    "char_gru_small",
)
# apply(..., penultimate=True)
PENULTIMATE_MODELS = (
    "mlp_2nn",
    "mlp_600_100",
    "cnn_fedavg",
    "cnn_pfl",
    "cnn_pfl_authors",
    "vgg16",
    "vgg16_gn",
)


def get_model(
    name: str,
    input_shape: tuple[int, ...] = (28, 28, 1),
    num_classes: int = 10,
    conv_impl: str = "auto",
    compute_dtype: str | None = None,
) -> Model:
    """Builds a registered model.

    ``conv_impl`` ('xla', 'im2col', 'per_layer', or 'auto': what ``core.strategy.choose_strategy``
    measured fastest on this backend) applies to convolutional models. ``compute_dtype``
    ``'bfloat16'`` runs the arithmetic in bfloat16 with float32 parameters (see ``Model``).
    """
    return dataclasses.replace(
        _build(name, tuple(input_shape), num_classes, _resolve_conv(conv_impl)),
        compute_dtype=compute_dtype,
        has_penultimate=name in PENULTIMATE_MODELS,
    )


def evaluation_model(model):
    """The model with XLA convolutions for the forward-only evaluation pass: on XLA:CPU the im2col
    form that training prefers is memory-bound on whole batches of images
    (``benchmarks/evaluation_pass.py``), and the space-to-depth first layer's gain did not hold on a
    quiet machine. Same parameters, same function."""
    if getattr(model.module, "conv_impl", "xla") == "xla":
        return model
    return dataclasses.replace(model, module=model.module.clone(conv_impl="xla"))


def _resolve_conv(conv_impl: str) -> str:
    if conv_impl != "auto":
        return conv_impl
    from fedjax_dp.core.strategy import choose_strategy  # models stay importable without the core

    return choose_strategy(has_conv=True, cohort_size=1).conv_impl


def _build(name: str, input_shape: tuple[int, ...], num_classes: int, conv_impl: str) -> Model:
    if name == "logistic":
        return Model(name, Logistic(num_classes), input_shape, num_classes)
    if name == "mlp_2nn":
        return Model(name, MLP((200, 200), num_classes), input_shape, num_classes)
    if name == "mlp_600_100":
        return Model(name, MLP((600, 100), num_classes), input_shape, num_classes)
    if name == "cnn_fedavg":
        return Model(
            name, FedAvgCNN(num_classes, conv_impl), input_shape, num_classes, has_conv=True
        )
    if name in ("cnn_pfl", "cnn_pfl_authors", "vgg16", "vgg16_gn"):
        check_input_shape(name, input_shape)
        module = (
            PflCNN(num_classes, conv_impl)
            if name == "cnn_pfl"
            else (
                AuthorsCNN(num_classes, conv_impl)
                if name == "cnn_pfl_authors"
                else VGG16(num_classes, conv_impl, group_norm=name == "vgg16_gn")
            )
        )
        return Model(name, module, input_shape, num_classes, has_conv=True)
    if name == "char_gru":  # input_shape = (sequence_length,), num_classes = vocabulary size
        return char_gru(input_shape[0], num_classes)
    # one GRU of 128: about a tenth of char_gru's recurrent work, for CPU-sized grids
    if name == "char_gru_small":
        return char_gru(input_shape[0], num_classes, hidden=(128,), name=name)
    raise ValueError(f"unknown model {name!r}; available: {MODEL_NAMES}")


__all__ = [
    "COMPUTE_DTYPES",
    "Model",
    "SequenceModel",
    "get_model",
    "MODEL_NAMES",
    "PENULTIMATE_MODELS",
    "evaluation_model",
]
