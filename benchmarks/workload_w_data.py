"""Workload W's definition, shared by every framework's runner: the synthetic population, cohort
sampling, hyper-parameters and FLOP counts. numpy only, so a PyTorch-only environment can import it.

1000 synthetic MNIST-shaped clients (more for cohorts over 1000) x 60 examples (seed 0, the same
numpy draws as the peers' ``common.py``); 1 local epoch of batch 10 (6 SGD steps, lr 0.1); server:
clip each flattened delta to L2 norm 1, sum, add N(0, 1) to the sum, divide by the cohort size,
apply.
"""

from __future__ import annotations

import numpy as np

POPULATION, EXAMPLES, BATCH, LR, CLIP, SIGMA = 1000, 60, 10, 0.1, 1.0, 1.0
STEPS = EXAMPLES // BATCH
MODELS = {"cnn": "cnn_fedavg", "mlp": "mlp_2nn"}
# Forward conv/dense multiply-adds x 2, x 3 for forward + backward, x 60 examples (peers' count).
FLOPS_PER_CLIENT_UPDATE = {
    "cnn": (
        3 * 2 * (28 * 28 * 32 * 25 + 14 * 14 * 64 * 800 + 7 * 7 * 64 * 512 + 512 * 10) * EXAMPLES
    ),
    "mlp": 3 * 2 * (784 * 200 + 200 * 200 + 200 * 10) * EXAMPLES,
}


def make_population(seed: int = 0, population: int = POPULATION):
    """The peers' population; a larger one (cohorts over 1000) extends it with more draws of the
    same generator, so its first 1000 clients are the peers' 1000."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((POPULATION, EXAMPLES, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=(POPULATION, EXAMPLES)).astype(np.int32)
    if population > POPULATION:
        extra = population - POPULATION
        x = np.concatenate([x, rng.standard_normal((extra, EXAMPLES, 28, 28, 1), dtype=np.float32)])
        y = np.concatenate([y, rng.integers(0, 10, size=(extra, EXAMPLES)).astype(np.int32)])
    return x, y


def cohort_ids(round_index: int, cohort: int, population: int = POPULATION) -> np.ndarray:
    rng = np.random.default_rng(10_000 + round_index)
    return np.sort(rng.choice(max(population, cohort), size=cohort, replace=False))
