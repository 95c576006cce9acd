"""Optax optimizers from configuration values."""

from __future__ import annotations

import optax

OPTIMIZERS = ("sgd", "adam")


def build_optimizer(name: str, learning_rate: float, momentum: float = 0.0, decay: float = 1.0) -> optax.GradientTransformation:
    """``sgd`` (optional momentum) or ``adam``; ``decay`` < 1 multiplies the learning rate every step."""
    if not learning_rate > 0:
        raise ValueError(f"learning rate must be > 0, got {learning_rate}")
    if not 0 < decay <= 1:
        raise ValueError(f"learning-rate decay must lie in (0, 1], got {decay}")
    schedule = learning_rate if decay == 1 else optax.exponential_decay(learning_rate, 1, decay)
    if name == "sgd":
        return optax.sgd(schedule, momentum=momentum or None)
    if name == "adam":
        return optax.adam(schedule)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
