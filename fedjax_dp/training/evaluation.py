"""Evaluation of a global model: central test accuracy and mean per-client accuracy."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.models.base import Model


@functools.partial(jax.jit, static_argnums=0)
def _batch_stats(model: Model, params, x, y, mask):
    batch = {"x": x, "y": y}
    loss = jnp.where(mask, model.per_example_loss(params, batch), 0.0)
    correct = jnp.where(mask, model.per_example_correct(params, batch), 0.0)
    return loss, correct


def per_example_stats(model: Model, params, x: np.ndarray, y: np.ndarray, batch_size: int = 1000):
    """Loss and correctness of every example, in fixed-size padded batches (one compilation)."""
    n = len(y)
    losses, corrects = np.zeros(n, np.float32), np.zeros(n, np.float32)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        xb = np.zeros((batch_size,) + x.shape[1:], x.dtype)
        yb = np.zeros((batch_size,) + y.shape[1:], np.int32)
        xb[: stop - start], yb[: stop - start] = x[start:stop], y[start:stop]
        mask = np.arange(batch_size) < stop - start
        loss, correct = _batch_stats(model, params, xb, yb, mask)
        losses[start:stop], corrects[start:stop] = np.asarray(loss)[: stop - start], np.asarray(correct)[: stop - start]
    return losses, corrects


def evaluate(model: Model, params, dataset: FederatedDataset, batch_size: int = 1000) -> dict:
    """``test_accuracy``/``test_loss`` on the central test set and the unweighted mean over clients
    of each client's accuracy on its own test data (``client_accuracy``)."""
    central = dataset.central_test
    client_idx = [i for i in dataset.client_test if len(i)]
    needed = np.unique(np.concatenate([central] + client_idx)) if client_idx else central
    losses, corrects = per_example_stats(model, params, dataset.x[needed], dataset.y[needed], batch_size)
    pick = lambda idx: np.searchsorted(needed, idx)  # noqa: E731  (needed is sorted and unique)
    central_pos = pick(central)
    metrics = {
        "test_accuracy": float(corrects[central_pos].mean()),
        "test_loss": float(losses[central_pos].mean()),
    }
    if client_idx:
        metrics["client_accuracy"] = float(np.mean([corrects[pick(i)].mean() for i in client_idx]))
    return metrics


def evaluate_state(model: Model, algorithm, state, dataset: FederatedDataset, client_states=None,
                   validation_set=None) -> dict:
    """``evaluate`` of the global model, and for an algorithm with ``requirements.personalized`` the
    unweighted mean over clients of each personalised model's accuracy on that client's own test data
    (``personalized_accuracy``; ``client_states``: the loop's per-client state store, or None). With a
    ``validation_set`` (a server-held set with ``x``, ``y``), its accuracy: ``validation_accuracy``."""
    metrics = evaluate(model, state.params, dataset)
    if validation_set is not None:
        correct = per_example_stats(model, state.params, validation_set.x, validation_set.y)[1]
        metrics["validation_accuracy"] = float(correct.mean())
    if not algorithm.requirements.personalized:
        return metrics
    accuracies = []
    for k, test in enumerate(dataset.client_test):
        if not len(test):
            continue
        train = dataset.client_train[k]
        own_state = client_states.get(k) if client_states is not None else None
        params = algorithm.personalize(state, {"x": dataset.x[train], "y": dataset.y[train]}, own_state)
        accuracies.append(float(per_example_stats(model, params, dataset.x[test], dataset.y[test])[1].mean()))
    return {**metrics, "personalized_accuracy": float(np.mean(accuracies))}
