"""Client sampling per round; the accountant must be told which one was used.

* ``uniform``: exactly m distinct clients, uniformly without replacement (replace-one neighbours).
* ``poisson``: every client independently with probability q (add/remove-one neighbours); the
  cohort size varies, and DP aggregation must divide by the fixed expected size q K.
"""

from __future__ import annotations

import numpy as np


def uniform(
    num_clients: int, cohort_size: int, rng: np.random.Generator, eligible: np.ndarray | None = None
) -> np.ndarray:
    """Sorted ids of ``cohort_size`` distinct clients (among ``eligible`` ones if given)."""
    pool = np.arange(num_clients) if eligible is None else np.flatnonzero(eligible)
    if cohort_size < 1:
        raise ValueError(f"cohort size must be >= 1, got {cohort_size}")
    if cohort_size > len(pool):
        raise ValueError(
            f"cohort size {cohort_size} exceeds the {len(pool)} clients available to sample"
        )
    return np.sort(rng.choice(pool, size=cohort_size, replace=False))


def poisson(
    num_clients: int, rate: float, rng: np.random.Generator, eligible: np.ndarray | None = None
) -> np.ndarray:
    """Sorted ids of the clients drawn, each independently with probability ``rate``."""
    if not 0 < rate <= 1:
        raise ValueError(f"sampling rate q must lie in (0, 1], got {rate}")
    chosen = rng.random(num_clients) < rate
    if eligible is not None:
        chosen &= eligible
    return np.flatnonzero(chosen)
