"""Poisson batches cut to a cap: the cap, and what the cut costs in delta.

A Poisson step takes each of a client's n_k examples with probability q_k = B / n_k; static shapes
pad the batch to a cap b, and a batch larger than b is cut to b at random. The cut mechanism M'
differs from the Poisson mechanism M only when some step draws more than b examples, so on every
dataset TV(M(D), M'(D)) <= eta(D) = S P(Binomial(|D|, q_k) > b) over the S steps. A neighbour under
add/remove holds n_k or n_k + 1 examples (q_k stays B / n_k: the size n_k is public), so eta is the
larger of the two tails. If M is (epsilon, delta_0)-DP then for every event E

    P[M'(D) in E] <= P[M(D) in E] + eta <= e^eps P[M(D') in E] + delta_0 + eta
                  <= e^eps P[M'(D') in E] + delta_0 + (1 + e^eps) eta,

so M' is (epsilon, delta_0 + (1 + e^eps) eta)-DP. The truncation's charge therefore grows with
epsilon: charging eta alone (the earlier rule) under-reported delta by the factor 1 + e^eps (5.4e-4
for a reported 1e-5 at n_k = 50, B = 16, 300 steps and epsilon 8).

Design: the cap is the least b whose tail over the run's steps, charged at the design epsilon (the
largest per-client threshold, which no client's decisions exceed), is at most ``TRUNCATION_SHARE``
of delta.
Report: a client's epsilon is the least fixed point of eps = eps_M(delta - (1 + e^eps) eta_k) for
the steps it ran (``epsilon_with_truncation``), so the reported (epsilon, delta) holds for the cut
batches.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import stats

TRUNCATION_SHARE = 0.01
"""The share of delta the cut may spend at the design epsilon (``batch_cap``)."""
DESIGN_EPSILON_WITHOUT_THRESHOLD = 16.0
"""The epsilon the cap is designed for where no client has a finite threshold (the report still
charges the epsilon actually spent)."""


def step_tail(cap: int, size: int, batch_size: int) -> float:
    """P(a Poisson step's batch > cap) over a client of ``size`` examples and its add-one neighbour
    (q = B / n)."""
    q = batch_size / size
    return float(max(stats.binom.sf(cap, size, q), stats.binom.sf(cap, size + 1, q)))


def design_epsilon(thresholds) -> float:
    """The epsilon the cap is designed for: the largest finite per-client threshold."""
    finite = np.asarray(thresholds, float)[np.isfinite(thresholds)]
    return float(finite.max()) if len(finite) else DESIGN_EPSILON_WITHOUT_THRESHOLD


def batch_cap(sizes, batch_size: int, max_steps: int, delta: float, epsilon: float) -> int:
    """The least cap b with (1 + e^epsilon) max_steps ``step_tail``(b, n_k) <= TRUNCATION_SHARE
    delta for every client size n_k (module docstring)."""
    sizes = np.asarray(sizes, np.int64)
    small = sizes[sizes < batch_size]
    if len(small):
        raise ValueError(
            f"batch size B={batch_size} is larger than the data of {len(small)} clients (e.g."
            f" {int(small.min())} examples): a Poisson step takes each example with probability B /"
            " n_k, which must be <= 1"
        )
    allowed = TRUNCATION_SHARE * delta / (max(1, max_steps) * (1.0 + math.exp(epsilon)))
    caps = []
    for n in np.unique(sizes).tolist():
        # the add-one neighbour's tail is the larger
        cap = int(stats.binom.isf(allowed, n + 1, batch_size / n))
        while cap > 0 and step_tail(cap - 1, n, batch_size) <= allowed:
            cap -= 1
        while step_tail(cap, n, batch_size) > allowed:
            cap += 1
        caps.append(cap)
    return int(max(caps))


def epsilon_with_truncation(
    epsilon_at: Callable[[float], float], delta: float, eta: float
) -> float:
    """The least epsilon with epsilon >= epsilon_at(delta - (1 + e^epsilon) eta): the cut mechanism
    is then (epsilon, delta)-DP (module docstring); inf where no epsilon leaves a positive delta for
    the uncut one. ``epsilon_at(d)`` is the uncut mechanism's epsilon at delta d (decreasing in
    d)."""
    if eta <= 0:
        return float(epsilon_at(delta))
    epsilon = float(epsilon_at(delta))
    for _ in range(200):  # increasing iterates from below; eta is tiny, so a few steps converge
        left = delta - (1.0 + math.exp(min(epsilon, 700.0))) * eta
        if left <= 0:
            return math.inf
        following = float(epsilon_at(left))
        if following <= epsilon * (1 + 1e-12):
            break
        epsilon = following
    candidate = epsilon * (1 + 1e-9) + 1e-12  # just above the limit, where the inequality holds
    left = delta - (1.0 + math.exp(min(candidate, 700.0))) * eta
    if left <= 0 or float(epsilon_at(left)) > candidate:
        return math.inf
    return candidate
