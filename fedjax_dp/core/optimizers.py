"""Optax optimizers from configuration values."""

from __future__ import annotations

import optax

OPTIMIZERS = ("sgd", "adam")


def build_optimizer(
    name: str,
    learning_rate: float,
    momentum: float = 0.0,
    decay: float = 1.0,
    weight_decay: float = 0.0,
    grad_clip_norm: float = 0.0,
) -> optax.GradientTransformation:
    """``sgd`` (optional momentum) or ``adam``; ``decay`` < 1 multiplies the learning rate every
    step.

    ``grad_clip_norm`` > 0 first clips each step's gradient (the loss's and any algorithm term's) to
    that global L2 norm, then ``weight_decay`` > 0 adds ``weight_decay * w`` to it: the order of
    PyTorch's ``clip_grad_norm_`` followed by ``SGD(weight_decay=...)``, as in the local training of
    FedDyn's code (Acar et al. 2021, ``max_norm = 10``) on which seed 004's baselines build. Both
    are off by default (the optimizer is then the plain one). Training-side only: the DP mechanisms
    clip and noise the update or the per-example gradients themselves.
    """
    if not learning_rate > 0:
        raise ValueError(f"learning rate must be > 0, got {learning_rate}")
    if not 0 < decay <= 1:
        raise ValueError(f"learning-rate decay must lie in (0, 1], got {decay}")
    if not (weight_decay >= 0 and grad_clip_norm >= 0):
        raise ValueError(
            f"weight_decay and grad_clip_norm must be >= 0, got {weight_decay}, {grad_clip_norm}"
        )
    schedule = learning_rate if decay == 1 else optax.exponential_decay(learning_rate, 1, decay)
    if name == "sgd":
        step = optax.sgd(schedule, momentum=momentum or None)
    elif name == "adam":
        step = optax.adam(schedule)
    else:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
    before = ([optax.clip_by_global_norm(grad_clip_norm)] if grad_clip_norm else []) + (
        [optax.add_decayed_weights(weight_decay)] if weight_decay else []
    )
    return optax.chain(*before, step) if before else step
