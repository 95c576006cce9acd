"""Flax models and the model registry: ``get_model(name, input_shape, num_classes, **options)``.

The shipped models are registered here; a user's flax module or init/apply functions join the same
registry through ``register_model`` (``models/user_model.py``). ``model_names()`` lists them all.
"""

from __future__ import annotations

import dataclasses
import functools

from fedjax_dp.models import registry
from fedjax_dp.models.base import COMPUTE_DTYPES, Model
from fedjax_dp.models.char_rnn import SequenceModel, char_gru
from fedjax_dp.models.cnn import FedAvgCNN
from fedjax_dp.models.logistic import Logistic
from fedjax_dp.models.mlp import MLP
from fedjax_dp.models.pfl_cnn import VGG16, AuthorsCNN, PflCNN, check_input_shape
from fedjax_dp.models.user_model import ModelFunctions, register_model


def get_model(
    name: str,
    input_shape: tuple[int, ...] = (28, 28, 1),
    num_classes: int = 10,
    conv_impl: str = "auto",
    compute_dtype: str | None = None,
) -> Model:
    """Builds a registered model.

    ``conv_impl`` ('xla', 'im2col', 'per_layer', or 'auto': what ``core.strategy.choose_strategy``
    measured fastest on this backend) applies to the shipped convolutional models.
    ``compute_dtype`` ``'bfloat16'`` runs the arithmetic in bfloat16 with float32 parameters (see
    ``Model``).
    """
    entry = registry.get(name)
    return dataclasses.replace(
        entry.build(tuple(input_shape), num_classes, _resolve_conv(conv_impl)),
        compute_dtype=compute_dtype,
        has_penultimate=entry.penultimate,
    )


def model_names() -> tuple[str, ...]:
    """Every registered model's name: the shipped ones, then those registered since."""
    return registry.names()


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


def _pfl(name: str, module):
    """A 32x32-image CNN of the PFL papers: its input shape checked first."""

    def build(shape, classes, conv_impl):
        check_input_shape(name, shape)
        return Model(name, module(classes, conv_impl), shape, classes, has_conv=True)

    return build


registry.register("logistic", lambda s, k, c: Model("logistic", Logistic(k), s, k))
for _name, _hidden in (("mlp_2nn", (200, 200)), ("mlp_600_100", (600, 100))):
    registry.register(
        _name,
        lambda s, k, c, n=_name, h=_hidden: Model(n, MLP(h, k), s, k),
        penultimate=True,
    )
registry.register(
    "cnn_fedavg",
    lambda s, k, c: Model("cnn_fedavg", FedAvgCNN(k, c), s, k, has_conv=True),
    penultimate=True,
)
registry.register("cnn_pfl", _pfl("cnn_pfl", PflCNN), penultimate=True)
registry.register("cnn_pfl_authors", _pfl("cnn_pfl_authors", AuthorsCNN), penultimate=True)
registry.register(
    "vgg16",
    _pfl("vgg16", VGG16),
    penultimate=True,
    check_input_shape=functools.partial(check_input_shape, "vgg16"),
)
registry.register(
    "vgg16_gn",
    _pfl("vgg16_gn", lambda k, c: VGG16(k, c, group_norm=True)),
    penultimate=True,
    check_input_shape=functools.partial(check_input_shape, "vgg16_gn"),
)
# input_shape = (sequence_length,), num_classes = the vocabulary size
registry.register("char_gru", lambda s, k, c: char_gru(s[0], k))
# one GRU of 128: about a tenth of char_gru's recurrent work, for CPU-sized grids
registry.register(
    "char_gru_small", lambda s, k, c: char_gru(s[0], k, hidden=(128,), name="char_gru_small")
)


__all__ = [
    "COMPUTE_DTYPES",
    "Model",
    "ModelFunctions",
    "SequenceModel",
    "evaluation_model",
    "get_model",
    "model_names",
    "register_model",
]
