"""What a run takes from its data before it builds anything, and the checks of your model against
your data before any training.

A source that gives its own clients (``data.sources``, kind ``clients``) decides how many there are:
``data.num_clients`` becomes that count (``adopt_source_clients``, before the configuration check
where the count is known without loading; ``fit_to_data`` after loading otherwise, checking the
configuration again with it). A model registered from outside the package (``register_model``) is
traced abstractly on the data's shapes (nothing is computed) and refused in one line, naming what
does not fit, where:

* it cannot be initialised or applied to a batch of the data's examples, or its module cannot be
  hashed (the engine compiles it as a static argument);
* it keeps variables beyond ``params`` (batch statistics: a federated round averages parameters
  only);
* a parameter is not a float array (gradients, clipping and noise are float);
* its logits are not ``(B, num_classes)`` (``(B, T, num_classes)`` for per-token targets), or a
  client holds a label outside its classes (the client id named);
* its per-example loss is not one number per example (local training masks padding per example and
  DP-SGD clips each example's gradient), or has no gradient.
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp

from fedjax_dp.data import sources
from fedjax_dp.models import get_model
from fedjax_dp.models import registry as models


def adopt_source_clients(cfg, overridden=()) -> None:
    """Sets ``cfg.data.num_clients`` to the number of clients ``data.source`` gives, where it is
    known before loading; an override that says otherwise is refused."""
    entry = sources.find(cfg.data.source)
    if entry is None or entry.kind != "clients" or entry.num_clients is None:
        return
    if "data.num_clients" in tuple(overridden) and cfg.data.num_clients != entry.num_clients:
        raise ValueError(
            f"data.num_clients={cfg.data.num_clients}, but data.source={entry.name!r} gives"
            f" {entry.num_clients} clients and a run takes them all: drop data.num_clients"
        )
    cfg.data.num_clients = entry.num_clients


def fit_to_data(cfg, dataset):
    """``(cfg, dataset)`` fitted to each other before anything is built (module docstring): the
    source's client count in ``cfg``, and a user's model checked against ``dataset`` (whose class
    count widens to the model's output where it was only inferred from the labels)."""
    if sources.kind(cfg.data.source) == "clients" and cfg.data.num_clients != dataset.num_clients:
        from fedjax_dp.training.config_validation import validate_config

        cfg = copy.deepcopy(cfg)
        cfg.data.num_clients = dataset.num_clients
        validate_config(cfg)
    if models.get(cfg.model.name).checked:
        dataset = check_model(cfg.model.name, dataset)
    return cfg, dataset


def check_model(name: str, dataset):
    """Raises ``ValueError`` in one line where model ``name`` does not fit ``dataset`` (module
    docstring); returns the dataset, its class count widened to the model's output width where it
    was inferred from the labels."""
    shape = dataset.example_shape
    try:
        model = get_model(name, shape, dataset.num_classes, conv_impl="xla")
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001  (the user's factory: one line)
        raise ValueError(
            f"model {name!r} cannot be built: {type(error).__name__}: {error}"
        ) from None
    try:
        hash(model.module)
    except TypeError:
        raise ValueError(
            f"model {name!r}: its module cannot be hashed: give it tuples, not lists or dicts, as"
            " fields (the engine compiles it as a static argument)"
        ) from None
    n = min(2, len(dataset.x))
    x = jax.ShapeDtypeStruct((n,) + shape, jnp.float32)
    x1 = jax.ShapeDtypeStruct((1,) + shape, jnp.float32)
    y = jax.ShapeDtypeStruct((n,) + dataset.y.shape[1:], jnp.int32)
    key = jax.random.key(0)
    where = f"examples of shape {shape}"
    variables = _trace(name, f"cannot be initialised on {where}", model.module.init, key, x1)
    extra = sorted(set(variables) - {"params"}) if isinstance(variables, dict) else []
    if extra:
        raise ValueError(
            f"model {name!r} keeps variables {extra} beside 'params' (batch statistics?): a"
            " federated round averages parameters only; use GroupNorm or LayerNorm"
        )
    params = _trace(name, f"cannot be initialised on {where}", model.init, key)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise ValueError(
                f"model {name!r}: parameter {jax.tree_util.keystr(path)} is {leaf.dtype};"
                " parameters must be float arrays (gradients, clipping and DP noise are float)"
            )
    logits = _trace(name, f"cannot be applied to a batch of {where}", model.apply, params, x)
    wanted = (n,) + dataset.y.shape[1:]
    if not hasattr(logits, "shape") or tuple(logits.shape[:-1]) != wanted:
        raise ValueError(
            f"model {name!r} gives logits of shape {getattr(logits, 'shape', type(logits))} for a"
            f" batch of {n}; labels of shape {wanted} need {wanted + ('num_classes',)}"
        )
    dataset = _fit_classes(name, dataset, int(logits.shape[-1]))
    losses = _trace(
        name, "per_example_loss fails", model.per_example_loss, params, {"x": x, "y": y}
    )
    if tuple(getattr(losses, "shape", ())) != (n,):
        raise ValueError(
            f"model {name!r}: per_example_loss gives shape {getattr(losses, 'shape', ())} for a"
            f" batch of {n}; it must give one loss per example, ({n},) (local training masks"
            " padding per example; DP-SGD clips each example's gradient)"
        )

    def one(p, xi, yi):
        return model.per_example_loss(p, {"x": xi[None], "y": yi[None]})[0]

    _trace(name, "has no per-example gradient", jax.vmap(jax.grad(one), (None, 0, 0)), params, x, y)
    return dataset


def _fit_classes(name: str, dataset, width: int):
    """The dataset with ``width`` classes, or the one-line refusal naming the client whose label the
    model cannot give."""
    if width == dataset.num_classes:
        return dataset
    if width > dataset.num_classes and dataset.metadata.get("num_classes_inferred", False):
        return dataclasses.replace(dataset, num_classes=width)
    ids = dataset.metadata.get("client_ids", range(dataset.num_clients))
    for client, train, test in zip(ids, dataset.client_train, dataset.client_test):
        for part, idx in (("train", train), ("test", test)):
            labels = dataset.y[idx]
            if len(labels) and labels.max() >= width:
                raise ValueError(
                    f"client {client!r} ({part}): label {int(labels.max())} is outside the"
                    f" {width} classes of model {name!r} (it gives {width} logits)"
                )
    raise ValueError(
        f"model {name!r} gives {width} logits, but the data has {dataset.num_classes} classes"
    )


def _trace(name: str, what: str, fun, *args):
    """``jax.eval_shape(fun, *args)``; a failure becomes one line naming the model."""
    try:
        return jax.eval_shape(fun, *args)
    except Exception as error:  # noqa: BLE001  (whatever the user's code raises: one line)
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(f"model {name!r} {what}: {type(error).__name__}: {first}"[:400]) from None
