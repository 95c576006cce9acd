"""Calibrating client-level LOCAL Gaussian noise to a per-client GDP budget mu (CUAG-PFL's sound
mode, UDP's sound variant).

Each participation of a client releases its clipped upload (replace-one sensitivity 2C) plus
N(0, (z_t C)^2 I): a (2 / z_t)-GDP mechanism, and a client's participations compose exactly,
mu^2 = sum over them of (2 / z_t)^2 (Dong, Roth, Su 2019, Cor. 3.3). Calibrated for K planned
participations:

* constant z: sqrt(K) 2 / z = mu (``constant_multipliers``);
* a per-round shape s_t (Alg. 4's sigma_t, UDP's sqrt(t)): z_t = kappa s_t with
  kappa = (2 / mu) sqrt(sum of the K largest s_t^-2) (``worst_case_multipliers``), so that ANY K
  participations spend at most mu (the costliest K rounds included): every client can take part K
  times wherever it is sampled, at the price of more noise in the other rounds. (Calibrating K
  participations at uniformly drawn rounds to mu in expectation, kappa = (2 / mu) sqrt(K mean_t
  s_t^-2), is cheaper on average but, for a rising shape, prices one participation in the first
  rounds above mu on its own when K mean_t s_t^-2 < s_1^-2: no client could take part then, and
  CUAG-PFL's Table 2 run and UDP's both stopped before round 1; not offered.)

A participation may release something else beside the upload (the local counts of a per-layer
adaptive clip: L / sigma_b^2 of mu^2 each). ``reserved`` is that per-participation mu^2; the
upload's noise is calibrated to what is left, mu_u^2 = mu^2 - K reserved, and a budget the other
releases of K participations already spend is refused.
"""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp.privacy.mechanisms.upload_cuag_noise import piecewise_schedule


def expected_participations(sampling, rounds: int, num_clients: int, fixed: int = 0) -> int:
    """K: ``fixed`` when > 0, else ceil(lambda T) with lambda the chance a client is in a round's
    cohort."""
    if fixed:
        return int(fixed)
    rate = sampling.cohort_size / num_clients if sampling.method == "uniform" else sampling.rate
    return max(1, math.ceil(rate * rounds))


def upload_mus(mus, participations: int, reserved: float = 0.0) -> np.ndarray:
    """mu_u = sqrt(mu^2 - K reserved): what the uploads' noise may spend once K participations'
    other releases (``reserved`` mu^2 each) are paid for; a budget they alone exhaust is refused."""
    mus = np.asarray(mus, float)
    left = mus**2 - participations * reserved
    if np.any(left <= 0):
        raise ValueError(
            f"the other releases of {participations} participations ({reserved:.4g} of mu^2 each, "
            f"{participations * reserved:.4g} in all) spend the whole budget mu^2 = "
            f"{float(mus.min()) ** 2:.4g}: nothing is left for the upload's noise"
        )
    return np.sqrt(left)


def constant_multipliers(mus: np.ndarray, participations: int, reserved: float = 0.0) -> np.ndarray:
    """z_n with sqrt(K) * 2 / z_n = mu_n (of what ``reserved`` leaves; a hair above, so that the
    K-th participation fits the budget after the ledger's epsilon <-> mu round trip)."""
    return 2.0 * math.sqrt(participations) / upload_mus(mus, participations, reserved) * (1 + 1e-9)


def worst_case_multipliers(shape, mu: float, participations: int, reserved: float = 0.0) -> tuple:
    """((first round, z_t), ...) with z_t = kappa s_t, kappa = (2 / mu) sqrt(sum of the K largest
    s_t^-2): K participations in any rounds spend at most mu (of what ``reserved`` leaves; kappa a
    hair above, as ``constant_multipliers``)."""
    shape = np.asarray(shape, float)
    costliest = np.sort(shape**-2.0)[::-1][:participations]
    mu_upload = float(upload_mus([mu], participations, reserved)[0])
    kappa = 2.0 / mu_upload * math.sqrt(float(np.sum(costliest))) * (1 + 1e-9)
    return piecewise_schedule(kappa * shape)
