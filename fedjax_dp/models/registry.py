"""The model registry: a name -> how to build its ``Model`` for the data's example shape and class
count.

The shipped models (``models/__init__.py``) and a user's (``models/user_model.py``:
``register_model``) are entries of this one registry, so the configuration check, the command line
(``--config.model.name``) and the run's build ask it, never a fixed list. An entry says what it can
give beyond logits (``penultimate``: the last hidden layer, which prototype methods build on) and
whether it must be checked against the data before training (``checked``: a model from outside the
package, ``training.fit_to_data``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

from fedjax_dp.models.base import Model

NAME = re.compile(r"[A-Za-z0-9_][\w.-]*")
"""A model or data source name: one token the command line can carry (``--config.model.name=X``)."""


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered model.

    Attributes:
      name: what ``model.name`` says.
      build: ``(input_shape, num_classes, conv_impl) -> Model`` (``conv_impl`` resolved: 'xla',
        'im2col', ...; a model without convolutions of the package's own ignores it).
      penultimate: ``Model.apply(..., penultimate=True)`` gives the last hidden layer.
      check_input_shape: raises ``ValueError`` for an example shape the model cannot take (before
        any data loads where a source's shape is known from its name), or None.
      checked: from outside the package: checked against the data before training.
      summary: one line for listings.
    """

    name: str
    build: Callable[[tuple, int, str], Model]
    penultimate: bool = False
    check_input_shape: Callable[[tuple], None] | None = None
    checked: bool = False
    summary: str = ""


_ENTRIES: dict[str, ModelEntry] = {}


def register(
    name: str,
    build: Callable[[tuple, int, str], Model],
    *,
    penultimate: bool = False,
    check_input_shape=None,
    checked: bool = False,
    summary: str = "",
    replace: bool = False,
) -> ModelEntry:
    """Adds ``name``; a name already taken is refused unless ``replace`` (a notebook cell run
    again), and a shipped model is never replaced."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(
            f"model name {name!r} must be one word of letters, digits, '_', '.' or '-' (it is"
            " written as --config.model.name=NAME)"
        )
    old = _ENTRIES.get(name)
    if old is not None and (not replace or not old.checked):
        raise ValueError(
            f"model {name!r} is already registered"
            + (" (a shipped model)" if not old.checked else "; pass replace=True to replace it")
        )
    _ENTRIES[name] = ModelEntry(
        name, build, bool(penultimate), check_input_shape, bool(checked), summary
    )
    return _ENTRIES[name]


def unregister(name: str) -> None:
    """Removes a model registered from outside the package (tests clean up with this)."""
    if name in _ENTRIES and _ENTRIES[name].checked:
        del _ENTRIES[name]


def names() -> tuple[str, ...]:
    """Every registered model, the shipped ones first."""
    return tuple(_ENTRIES)


def is_registered(name) -> bool:
    return isinstance(name, str) and name in _ENTRIES


def get(name: str) -> ModelEntry:
    if not is_registered(name):
        raise ValueError(f"model {name!r} unknown; available: {names()}")
    return _ENTRIES[name]


def has_penultimate(name: str) -> bool:
    """Whether ``name`` (registered) gives its penultimate features; False for an unknown name
    (the configuration check names that separately)."""
    return is_registered(name) and _ENTRIES[name].penultimate
