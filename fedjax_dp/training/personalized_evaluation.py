"""Personalised evaluation of every client in one compiled pass (the papers' metric for
PFLDyn(Proto) and CUAG-PFL, seed 004 §7.2: the mean over clients of each client's personalised model
on its own test data).

Each of the N clients builds its own model from the global state, its stored state and its whole
training data (``algorithm.personalized_correct``) and is scored on its own test data. The clients'
example indices are padded once into (N, n_max) arrays with masks; the data stays on the device once
and each client's examples are gathered inside ``lax.map`` (``chunk`` clients vmapped at a time), so
there is no Python loop over clients and memory is bounded by the chunk, not N.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _padded(indices: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    width = max([len(i) for i in indices] + [1])
    idx, mask = np.zeros((len(indices), width), np.int32), np.zeros((len(indices), width), bool)
    for k, i in enumerate(indices):
        idx[k, : len(i)], mask[k, : len(i)] = i, True
    return idx, mask


@functools.partial(jax.jit, static_argnums=(0, 1))
def _correct_counts(
    algorithm, chunk: int, state, client_states, x, y, train_idx, train_mask, test_idx, test_mask
):
    def one(args):
        own_state, ti, tm, si, sm = args
        train, test = {"x": x[ti], "y": y[ti], "mask": tm}, {"x": x[si], "y": y[si], "mask": sm}
        correct = algorithm.personalized_correct(state, own_state, train, test)
        return jnp.sum(jnp.where(sm, correct, 0.0))

    return jax.lax.map(
        one, (client_states, train_idx, train_mask, test_idx, test_mask), batch_size=chunk
    )


class PersonalizedEvaluator:
    """``evaluator(algorithm, state, client_states) -> metrics`` for one dataset (built once per
    run). ``scorer``: what builds the personalised models when the algorithm has none of its own (a
    ``training.prototype_adaptation.PrototypeAdaptation`` of a global classifier)."""

    def __init__(self, dataset, chunk: int = 4, scorer=None):
        self.chunk, self.scorer = chunk, scorer
        self.train_idx, self.train_mask = _padded(dataset.client_train)
        self.test_idx, self.test_mask = _padded(dataset.client_test)
        self.test_sizes = self.test_mask.sum(axis=1)
        self.x, self.y = jnp.asarray(dataset.x), jnp.asarray(dataset.y, jnp.int32)
        unseen = [
            np.isin(dataset.y[te], dataset.y[tr], invert=True).sum()
            for tr, te in zip(dataset.client_train, dataset.client_test)
        ]
        self.unseen_fraction = float(np.sum(unseen) / max(self.test_sizes.sum(), 1))

    def per_client_accuracy(self, algorithm, state, client_states=None) -> np.ndarray:
        """Each client's personalised test accuracy (NaN for a client without test data)."""
        stacked = None
        if algorithm.requirements.client_state:
            stacked = (
                client_states.gather(range(len(self.test_sizes)))
                if client_states is not None
                else jax.tree_util.tree_map(
                    lambda a: jnp.broadcast_to(a, (len(self.test_sizes),) + a.shape),
                    algorithm.client_state_init(state.params),
                )
            )
        if hasattr(algorithm, "evaluation_state"):
            state = algorithm.evaluation_state(state, stacked)
        counts = np.asarray(
            _correct_counts(
                algorithm,
                self.chunk,
                state,
                stacked,
                self.x,
                self.y,
                self.train_idx,
                self.train_mask,
                self.test_idx,
                self.test_mask,
            )
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.test_sizes > 0, counts / self.test_sizes, np.nan)

    def __call__(self, algorithm, state, client_states=None) -> dict:
        return self.summary(self.per_client_accuracy(algorithm, state, client_states))

    def summary(self, accuracy: np.ndarray) -> dict:
        """Mean and distribution over the clients with test data of ``per_client_accuracy``'s
        values."""
        scored = accuracy[np.isfinite(accuracy)]
        if not len(scored):
            return {}
        p10, p50, p90 = np.percentile(scored, [10, 50, 90])
        return {
            "personalized_accuracy": float(scored.mean()),
            "personalized_accuracy_std": float(scored.std()),
            "personalized_accuracy_min": float(scored.min()),
            "personalized_accuracy_p10": float(p10),
            "personalized_accuracy_p50": float(p50),
            "personalized_accuracy_p90": float(p90),
            "personalized_unseen_fraction": self.unseen_fraction,
        }
