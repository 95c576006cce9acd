"""Evaluation of a global model: central test accuracy and mean per-client accuracy; personalised
accuracy through ``personalized_evaluation``."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.models import evaluation_model
from fedjax_dp.models.base import Model
from fedjax_dp.training.personalized_evaluation import PersonalizedEvaluator

EVAL_BATCH = 250
"""Examples per evaluation batch: the fastest of 100-2000 for the conv models on a CPU, and it
compiles faster (``benchmarks/evaluation_pass.py``)."""


@functools.partial(jax.jit, static_argnums=0)
def _batch_stats(model: Model, params, x, y, mask):
    batch = {"x": x, "y": y}
    loss = jnp.where(mask, model.per_example_loss(params, batch), 0.0)
    correct = jnp.where(mask, model.per_example_correct(params, batch), 0.0)
    return loss, correct


def per_example_stats(
    model: Model, params, x: np.ndarray, y: np.ndarray, batch_size: int = EVAL_BATCH
):
    """Loss and correctness of every example, in fixed-size padded batches (one compilation), with
    the forward-only pass's convolutions (``models.evaluation_model``: XLA's, whatever form training
    chose; on XLA:CPU im2col's patches of a batch of images are memory-bound,
    ``benchmarks/evaluation_pass.py``)."""
    model = evaluation_model(model)
    n = len(y)
    losses, corrects = np.zeros(n, np.float32), np.zeros(n, np.float32)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        xb = np.zeros((batch_size,) + x.shape[1:], x.dtype)
        yb = np.zeros((batch_size,) + y.shape[1:], np.int32)
        xb[: stop - start], yb[: stop - start] = x[start:stop], y[start:stop]
        mask = np.arange(batch_size) < stop - start
        loss, correct = _batch_stats(model, params, xb, yb, mask)
        losses[start:stop], corrects[start:stop] = (
            np.asarray(loss)[: stop - start],
            np.asarray(correct)[: stop - start],
        )
    return losses, corrects


class Evaluation(NamedTuple):
    """One evaluation: the logged metrics and each client's accuracy on its own test data (clients
    without test data left out), with what that accuracy measured."""

    metrics: dict
    per_client: np.ndarray
    per_client_label: str


def _global_evaluation(
    model: Model,
    params,
    dataset: FederatedDataset,
    batch_size: int = EVAL_BATCH,
    clients: bool = True,
):
    """(metrics, per-client accuracies) of the global model, from ONE pass over the examples needed
    (``clients=False``: the central test set only)."""
    central = dataset.central_test
    client_idx = [i for i in dataset.client_test if len(i)] if clients else []
    needed = np.unique(np.concatenate([central] + client_idx)) if client_idx else central
    losses, corrects = per_example_stats(
        model, params, dataset.x[needed], dataset.y[needed], batch_size
    )
    pick = lambda idx: np.searchsorted(needed, idx)  # noqa: E731  (needed is sorted and unique)
    central_pos = pick(central)
    metrics = {
        "test_accuracy": float(corrects[central_pos].mean()),
        "test_loss": float(losses[central_pos].mean()),
    }
    per_client = np.asarray([corrects[pick(i)].mean() for i in client_idx])
    if client_idx:
        metrics["client_accuracy"] = float(per_client.mean())
    return metrics, per_client


def evaluate(model: Model, params, dataset: FederatedDataset, batch_size: int = EVAL_BATCH) -> dict:
    """``test_accuracy``/``test_loss`` on the central test set and the unweighted mean over clients
    of each client's accuracy on its own test data (``client_accuracy``)."""
    return _global_evaluation(model, params, dataset, batch_size)[0]


def evaluate_state(
    model: Model,
    algorithm,
    state,
    dataset: FederatedDataset,
    client_states=None,
    validation_set=None,
    personalized=None,
    client_data: bool = True,
) -> Evaluation:
    """``evaluate`` of the global model (where ``requirements.global_classifier``), and for an
    algorithm with ``requirements.personalized`` the mean and distribution over clients of each
    personalised model's accuracy on that client's own test data (``personalized``: the run's
    ``PersonalizedEvaluator``, built here if None; one with a ``scorer`` personalises a global
    classifier, ``eval_prototypes``); ``client_states``: the loop's per-client state
    store). With a ``validation_set`` (a server-held set with ``x``, ``y``),
    ``validation_accuracy``. The per-client accuracies are the personalised ones where the algorithm
    has them, else the global model's: computed once here, not again for ``client_accuracies.json``.
    ``client_data=False`` (``eval_client_data``): nothing is computed from the clients' own data (no
    per-client or personalised figures), so every published number stays inside the guarantee."""
    requirements = algorithm.requirements
    metrics, per_client, label = {}, np.zeros(0), ""
    if requirements.global_classifier:
        metrics, per_client = _global_evaluation(model, state.params, dataset, clients=client_data)
        label = "final global-model accuracy per client (own test data)" if len(per_client) else ""
    if validation_set is not None:
        correct = per_example_stats(model, state.params, validation_set.x, validation_set.y)[1]
        metrics["validation_accuracy"] = float(correct.mean())
    scorer = algorithm if requirements.personalized else getattr(personalized, "scorer", None)
    if scorer is not None and client_data:
        personalized = PersonalizedEvaluator(dataset) if personalized is None else personalized
        accuracy = personalized.per_client_accuracy(scorer, state, client_states)
        metrics = {**metrics, **personalized.summary(accuracy)}
        per_client, label = (
            accuracy[np.isfinite(accuracy)],
            "final personalised accuracy per client",
        )
    return Evaluation(metrics, per_client, label)


def headline_accuracy(metrics: dict) -> float:
    """The accuracy a run is judged by: personalised where there is one, else central test
    accuracy."""
    return metrics.get("personalized_accuracy", metrics.get("test_accuracy", float("nan")))
