"""Workload W, the reference benchmark shared with the peer harness (``../shared/bench/peers``).

1000 synthetic MNIST-shaped clients x 60 examples (seed 0, the same numpy draws as the peers'
``common.py``); 1 local epoch of batch 10 (6 SGD steps, lr 0.1); server: clip each flattened delta
to L2 norm 1, sum, add N(0, 1) to the sum, divide by the cohort size, apply.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.core.cohort import CohortEngine
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.models import get_model
from fedjax_dp.privacy.clipping import clip_by_global_norm

POPULATION, EXAMPLES, BATCH, LR, CLIP, SIGMA = 1000, 60, 10, 0.1, 1.0, 1.0
STEPS = EXAMPLES // BATCH
MODELS = {"cnn": "cnn_fedavg", "mlp": "mlp_2nn"}
# Forward conv/dense multiply-adds x 2, x 3 for forward + backward, x 60 examples (peers' count).
FLOPS_PER_CLIENT_UPDATE = {
    "cnn": 3 * 2 * (28 * 28 * 32 * 25 + 14 * 14 * 64 * 800 + 7 * 7 * 64 * 512 + 512 * 10) * EXAMPLES,
    "mlp": 3 * 2 * (784 * 200 + 200 * 200 + 200 * 10) * EXAMPLES,
}


def make_population(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((POPULATION, EXAMPLES, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=(POPULATION, EXAMPLES)).astype(np.int32)
    return x, y


def cohort_ids(round_index: int, cohort: int) -> np.ndarray:
    return np.sort(np.random.default_rng(10_000 + round_index).choice(POPULATION, size=cohort, replace=False))


class WorkloadW:
    """One DP-FedAvg round of workload W with a chosen engine formulation."""

    def __init__(self, model: str, strategy: str, chunk_size, unroll, conv_impl: str):
        self.model = get_model(MODELS[model], conv_impl=conv_impl)
        train = make_local_trainer(self.model.per_example_loss, optax.sgd(LR), unroll=unroll)

        def client_fn(params, client):
            trained, _ = train(params, client["batches"], client["mask"], client["key"])
            delta = jax.tree_util.tree_map(jnp.subtract, trained, params)
            result = clip_by_global_norm(delta, CLIP)
            return result.clipped, result.norm

        self.engine = CohortEngine(client_fn, strategy, chunk_size)
        self.params = self.model.init(jax.random.key(0))
        self.x, self.y = make_population()

        @jax.jit
        def server(params, clipped_sum, key, cohort):
            leaves, treedef = jax.tree_util.tree_flatten(clipped_sum)
            keys = jax.random.split(key, len(leaves))
            noisy = [s + SIGMA * CLIP * jax.random.normal(k, s.shape, s.dtype) for s, k in zip(leaves, keys)]
            mean = jax.tree_util.tree_unflatten(treedef, noisy)
            return jax.tree_util.tree_map(lambda p, m: p + m / cohort, params, mean)

        self.server = server

    def round(self, round_index: int, cohort: int):
        ids = cohort_ids(round_index, cohort)
        clients = {
            "batches": {"x": self.x[ids].reshape(cohort, STEPS, BATCH, 28, 28, 1),
                        "y": self.y[ids].reshape(cohort, STEPS, BATCH)},
            "mask": np.ones((cohort, STEPS, BATCH), bool),
            "key": jax.random.split(jax.random.key(round_index), cohort),
        }
        clipped_sum, norms = self.engine(self.params, clients)
        self.params = self.server(self.params, clipped_sum, jax.random.key(10**6 + round_index), float(cohort))
        jax.block_until_ready(self.params)
        return norms
