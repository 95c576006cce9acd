"""What a data source's name alone says of its examples: their shape and the number of classes, so
that a model that cannot take them, or a mechanism no ledger can account, is refused before any data
loads."""

from __future__ import annotations

KNOWN_INPUT_SHAPES = {
    "mnist_5k": (28, 28, 1),
    "mnist": (28, 28, 1),
    "femnist": (28, 28, 1),
    "fashion_mnist": (28, 28, 1),
    "cifar10": (32, 32, 3),
    "cifar100": (32, 32, 3),
}
KNOWN_CLASSES = {
    "mnist_5k": 10,
    "mnist": 10,
    "fashion_mnist": 10,
    "cifar10": 10,
    "cifar100": 100,
}


def known_shapes(source: str) -> tuple[tuple | None, int | None]:
    """(input shape, classes) of ``source`` (a ``tfds:`` name too) where its name says, else
    (None, None); femnist's classes depend on its files (digits only or all 62)."""
    name = source.removeprefix("tfds:")
    shape, classes = KNOWN_INPUT_SHAPES.get(name), KNOWN_CLASSES.get(name)
    return (shape, classes) if shape is not None and classes is not None else (None, None)
