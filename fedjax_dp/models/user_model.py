"""Your own model, registered by name beside the shipped ones: a flax module, a function of the
class count that returns one, or plain init / apply / per-example-loss functions.

    import flax.linen as nn
    import fedjax_dp

    class CNN(nn.Module):
        num_classes: int

        @nn.compact
        def __call__(self, x, penultimate: bool = False):
            x = nn.relu(nn.Conv(8, (3, 3))(x)).reshape((x.shape[0], -1))
            x = nn.relu(nn.Dense(32)(x))
            return x if penultimate else nn.Dense(self.num_classes)(x)

    fedjax_dp.register_model("my_cnn", CNN)   # then model.name="my_cnn" in a config or on the CLI

The input shape and the number of classes come from the data (or are stated: ``input_shape``,
``num_classes``); ``training.fit_to_data`` checks the model against the data before any training
and refuses, in one line, what does not fit. Whatever is given becomes the package's own ``Model``
(``models.base``): every algorithm, engine and evaluation path takes it unchanged. A module whose
``__call__`` takes ``penultimate`` (its last hidden layer when True), or functions with
``features``, can serve the prototype methods (PFLDyn(Proto), CUAG-PFL, ``eval_prototypes``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_dp.models import registry
from fedjax_dp.models.base import Model


@dataclasses.dataclass(frozen=True)
class ModelFunctions:
    """A model as pure functions over a parameter pytree (haiku's and FedJAX's convention).

    Attributes:
      init: ``(key, x) -> params``, ``x`` a batch of one zero example of the data's shape.
      apply: ``(params, x) -> logits`` of shape ``(B, num_classes)``.
      per_example_loss: ``(params, x, y) -> (B,)``, each example's loss; None: softmax
        cross-entropy of ``apply``'s logits. One loss per example, never their mean: DP-SGD clips
        each example's gradient, and local training masks padding examples out.
      features: ``(params, x) -> (B, F)``, the penultimate representation (what prototype methods
        build class means on); None: the model has none.
    """

    init: Callable
    apply: Callable
    per_example_loss: Callable | None = None
    features: Callable | None = None


@dataclasses.dataclass(frozen=True)
class _FunctionModule:
    """``ModelFunctions`` behind the two calls ``Model`` makes of a flax module."""

    functions: ModelFunctions

    def init(self, key, x):
        return {"params": self.functions.init(key, x)}

    def apply(self, variables, x, penultimate: bool = False):
        call = self.functions.features if penultimate else self.functions.apply
        return call(variables["params"], x)


_OBJECTS: dict[str, Any] = {}  # name -> the object registered under it (to reuse the name)


def register_model(
    name: str | None,
    model,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    replace: bool = False,
) -> str:
    """Registers ``model`` under ``name`` (None: the name it already has, else one made from its
    class) and returns the name, for ``model.name`` in a config or ``--config.model.name``.

    Args:
      model: a flax module instance (its output width is the class count), a function of the class
        count returning a module (a module class whose first field is the class count is one), or a
        ``ModelFunctions``.
      input_shape: the shape of one example, where the model takes only one (checked against the
        data); None: the data's.
      num_classes: the class count, where the model has a fixed one; None: the data's (a module
        instance's own output width, checked).
      replace: replace a model of yours registered under ``name`` (a notebook cell run again).
    """
    build, penultimate = _builder(model, input_shape, num_classes)
    if name is None:
        name = _name_for(model)
        if _OBJECTS.get(name) is model:
            return name
    registry.register(
        name,
        functools.partial(build, name),
        penultimate=penultimate,
        checked=True,
        replace=replace,
        summary=f"yours: {_describe(model)}",
    )
    _OBJECTS[name] = model
    return name


def _builder(model, input_shape, num_classes):
    """``(build(name, shape, classes, conv_impl) -> Model, penultimate)`` for what was given; what
    cannot be a model is refused here, at registration."""
    if input_shape is not None:
        input_shape = tuple(int(d) for d in input_shape)
    if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 1):
        raise ValueError(
            f"register_model: num_classes must be an integer >= 1, got {num_classes!r}"
        )
    if isinstance(model, ModelFunctions):
        for field in ("init", "apply"):
            if not callable(getattr(model, field)):
                raise ValueError(f"ModelFunctions.{field} must be a function, got {model!r}")
        module = _FunctionModule(model)

        def build(name, shape, classes, conv_impl):
            shape = _fits(name, input_shape, shape)
            return Model(
                name,
                module,
                shape,
                num_classes or classes,
                loss=model.per_example_loss,
            )

        return build, model.features is not None
    if isinstance(model, nn.Module):
        make = lambda classes: model  # noqa: E731  (its width is its own)
    elif callable(model):
        make = model
        example = model(num_classes or 2)
        if not isinstance(example, nn.Module):
            raise ValueError(
                f"register_model: {_describe(model)}({num_classes or 2}) gave"
                f" {type(example).__name__}, not a flax module; give a module, a function of the"
                " class count returning one, or ModelFunctions(init, apply, ...)"
            )
    else:
        raise ValueError(
            f"register_model: {type(model).__name__} is not a model; give a flax module, a function"
            " of the class count returning one, or ModelFunctions(init, apply, ...)"
        )
    penultimate = "penultimate" in inspect.signature(make(num_classes or 2).__call__).parameters

    def build(name, shape, classes, conv_impl):
        shape = _fits(name, input_shape, shape)
        module = make(num_classes or classes)
        try:
            convolves = _convolves(module, shape)
        except TypeError:  # an unhashable module: fit_to_data refuses it, naming why
            convolves = False
        return Model(name, module, shape, num_classes or classes, has_conv=convolves)

    return build, penultimate


def _fits(name: str, stated, shape: tuple) -> tuple:
    if stated is not None and tuple(stated) != tuple(shape):
        raise ValueError(
            f"model {name!r} takes examples of shape {tuple(stated)} (register_model(input_shape="
            f"...)), but the data's examples have shape {tuple(shape)}"
        )
    return tuple(shape)


@functools.lru_cache(maxsize=64)
def _convolves(module: nn.Module, shape: tuple) -> bool:
    """Whether ``module`` calls a flax convolution (an abstract trace: nothing is computed); the
    cohort engine picks its strategy on CPU by it. False where the module cannot be traced here (the
    checks before training then name why)."""
    seen = []

    def record(next_fun, args, kwargs, context):
        seen.append(isinstance(context.module, (nn.Conv, nn.ConvTranspose, nn.ConvLocal)))
        return next_fun(*args, **kwargs)

    try:
        with nn.intercept_methods(record):
            jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1,) + shape, jnp.float32))
    except Exception:  # noqa: BLE001  (fit_to_data reports the failure itself, in one line)
        return False
    return any(seen)


def _name_for(model) -> str:
    """The name a model is registered under when none is given: its own if it has one, else its
    class's (``CNN``, ``CNN_2`` for another object)."""
    for name, obj in _OBJECTS.items():
        if obj is model:
            return name
    base = (
        "model"
        if isinstance(model, ModelFunctions)
        else getattr(model, "__name__", None) or type(model).__name__
    )
    base = "".join(c if c.isalnum() or c in "_.-" else "_" for c in base) or "model"
    name, k = base, 1
    while registry.is_registered(name):
        k += 1
        name = f"{base}_{k}"
    return name


def _describe(model) -> str:
    if isinstance(model, ModelFunctions):
        return "ModelFunctions"
    return getattr(model, "__name__", None) or type(model).__name__
