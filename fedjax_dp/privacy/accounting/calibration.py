"""The one path from a privacy budget to a noise parameter.

Every budget-to-noise decision of the project is one of three solves, here:

* ``calibrate``: the least noise parameter z whose schedule of round events (``RoundEvent``s as a
  ledger composes them: the releases of a round as a function of z, wrapped in the sampler's event)
  spends the target epsilon at delta by dp_accounting's RDP or PLD accountant
  (``dp_accounting.calibrate_dp_mechanism``, Brent's method over fresh accountants). The ledgers
  build the schedule (``privacy.tracker.calibrate_for``): what is calibrated is what is accounted.
* ``gdp_multiplier``: the per-client Gaussian-DP books (local noise) compose Gaussian releases
  exactly, mu = sqrt(sum_t (c_t / z)^2) = c / z, so the solve is closed-form: z = c / mu(epsilon,
  delta) (Dong, Roth and Su 2022, Cor. 3.3). A client's K planned participations of sensitivity 2C
  each: ``constant_multipliers`` (one z for every round) and ``worst_case_multipliers`` (a per-round
  shape s_t, z_t = kappa s_t, so that ANY K participations spend at most mu, the costliest K rounds
  included: every client can take part K times wherever it is sampled. Calibrating K participations
  at uniformly drawn rounds to mu in expectation is cheaper on average but, for a rising shape,
  prices one participation in the first rounds above mu on its own; not offered). A participation
  may release something else beside the upload (the local counts of a per-layer adaptive clip):
  ``reserved`` is that per-participation mu^2, and the upload's noise is calibrated to what is left,
  mu_u^2 = mu^2 - K reserved (``upload_mus``).
* ``classical_gaussian_multiplier``: the classical Gaussian mechanism's sigma = sqrt(2 ln(1.25 /
  delta)) Delta / epsilon (Dwork and Roth 2014, Thm. A.1, proven for epsilon < 1 only), for methods
  whose papers calibrate with it (UDP's paper mode); their releases are ``formal: false``.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import dp_accounting
import numpy as np

from fedjax_dp.privacy.accounting import events, gdp
from fedjax_dp.privacy.accounting.accountant import (
    RoundEvent,
    _unconverged_orders_silenced,
    check_delta,
    check_epsilon,
    epsilon_of,
    make_accountant,
    supports,
)

Schedule = Sequence[tuple[RoundEvent, int]]
MAX_NOISE = 1e3
TOLERANCE = 1e-4  # on z
PROBES = (1.0, 2.0, 3.7)  # where a schedule is read to tell one calibration question from another


def calibrate(
    schedule_of: Callable[[float], Schedule],
    target_epsilon: float,
    delta: float,
    accountant: str = "pld",
    max_noise: float = MAX_NOISE,
) -> float:
    """The least noise parameter z whose schedule ``schedule_of(z)`` ((round event, rounds), ...)
    spends ``target_epsilon`` at ``delta`` by ``accountant`` (module docstring).

    Cached on the schedule read at ``PROBES``: a config's validation and its build ask the same
    question once.
    """
    key = tuple(tuple(schedule_of(z)) for z in PROBES)
    return _calibrate(key, schedule_of, target_epsilon, delta, accountant, max_noise)


def _calibrate(key, schedule_of, target_epsilon, delta, accountant, max_noise) -> float:
    return _cached(key, target_epsilon, delta, accountant, max_noise, _Holder(schedule_of))


class _Holder:
    """Carries the schedule function through the cache without being part of its key."""

    def __init__(self, schedule_of):
        self.schedule_of = schedule_of

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


@functools.lru_cache(maxsize=64)
def _cached(key, target_epsilon, delta, accountant, max_noise, holder) -> float:
    return _solve(holder.schedule_of, target_epsilon, delta, accountant, max_noise)


def clear_cache() -> None:
    """Forgets every cached calibration (benchmarks time a cold one)."""
    _cached.cache_clear()


def _solve(schedule_of, target_epsilon, delta, kind, max_noise) -> float:
    check_epsilon(target_epsilon)
    check_delta(delta)
    probe = list(schedule_of(1.0))
    if not probe or any(count < 1 for _, count in probe):
        raise ValueError(f"a calibration needs at least one round, got {probe}")
    rate = min(event.rate for event, _ in probe)
    if rate < 1 and delta >= rate:
        raise ValueError(
            f"delta={delta} >= the sampling rate q={rate:.6g}: any noise meets it (a client "
            "is in a round with probability q), so there is nothing to calibrate; choose delta < q"
        )
    rounds = sum(count for _, count in probe)
    if epsilon_of(schedule_of(max_noise), delta, kind) > target_epsilon:
        raise ValueError(
            f"no noise multiplier <= {max_noise} reaches epsilon={target_epsilon} at"
            f" delta={delta} over {rounds} rounds"
        )
    bracket = dp_accounting.ExplicitBracketInterval(1e-3, max_noise)
    if kind == "pld":
        bracket = _pld_bracket_for(schedule_of, target_epsilon, delta, max_noise)
    relation = probe[0][0].neighboring_relation
    with _unconverged_orders_silenced():
        return float(
            dp_accounting.calibrate_dp_mechanism(
                lambda: make_accountant(kind, relation),
                lambda z: composed(schedule_of(z), kind),
                target_epsilon,
                delta,
                bracket,
                tol=TOLERANCE,
            )
        )


def composed(schedule: Schedule, kind: str) -> dp_accounting.DpEvent:
    """One dp_accounting event for a schedule (a single run of equal rounds: self-composed)."""
    parts = [dp_accounting.SelfComposedDpEvent(e.dp_event(kind), n) for e, n in schedule]
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


def pld_twin(event: RoundEvent) -> tuple[RoundEvent, float]:
    """The Poisson event the PLD accountant composes for ``event`` (fixed-size sampling: the
    Dong-Roth-Su reduction, rate m / K at twice the sensitivity) and the factor between the two
    events' noise parameters (2 for a fixed-size Gaussian, else 1)."""
    if event.sampling != "fixed":
        return event, 1.0
    doubled = events.at_double_sensitivity(event.mechanism)
    scale = 2.0 if event.gaussian else 1.0
    return RoundEvent("poisson", sampling_rate=event.rate, mechanism=doubled), scale


def _pld_bracket_for(schedule_of, target_epsilon, delta, max_noise):
    """A bracket of the PLD solve: from RDP's answer for the events the PLD composes where RDP can
    compose them (``pld_bracket``), else by steps of 4 down from ``max_noise``."""
    overspends = lambda z: epsilon_of(schedule_of(z), delta, "pld") > target_epsilon  # noqa: E731
    scale = pld_twin(schedule_of(1.0)[0][0])[1]
    twins = lambda w: [(pld_twin(e)[0], n) for e, n in schedule_of(scale * w)]  # noqa: E731
    if all(supports(e, "rdp") for e, _ in twins(1.0)):
        z_rdp = scale * calibrate(twins, target_epsilon, delta, "rdp", max_noise)
        return pld_bracket(overspends, z_rdp)
    upper = max_noise
    while upper > 1e-3 and not overspends(upper / 4):
        upper /= 4
    return dp_accounting.ExplicitBracketInterval(max(upper / 4, 1e-3), upper)


PLD_BRACKET_FACTORS = (0.9, 0.75, 0.5, 0.25)
"""Lower ends tried, as fractions of the RDP answer, until one spends more than the target
(``pld_bracket``)."""


def pld_bracket(overspends, z_rdp: float) -> dp_accounting.ExplicitBracketInterval:
    """A bracket of the PLD calibration's root from the RDP answer z_rdp for the same dp_accounting
    event: RDP over-states epsilon, so z_pld <= z_rdp, and the PLD answer is usually within 10 % of
    it (0.94 z_rdp at q = 0.2, z ~ 1; for fixed-size sampling RDP's own replace-one bound is looser,
    0.6, hence the Poisson event of the Dong-Roth-Su reduction). A PLD of little noise is costly to
    build, so the lower end steps down from 0.9 z_rdp (``PLD_BRACKET_FACTORS``) instead of starting
    at 0.25 z_rdp, and a step that does not overspend becomes the upper end
    (``benchmarks/pld_calibration.py`` measures the gain; z is the same to the tolerance, 1e-4)."""
    upper = z_rdp * 1.001
    for factor in PLD_BRACKET_FACTORS:
        if overspends(factor * z_rdp):
            return dp_accounting.ExplicitBracketInterval(factor * z_rdp, upper)
        upper = factor * z_rdp
    raise ValueError(
        f"the PLD accountant reaches the target epsilon below {PLD_BRACKET_FACTORS[-1]} x the RDP "
        f"calibration's z = {z_rdp:.6g}: no bracket"
    )


def calibrate_noise_multiplier(
    target_epsilon: float,
    target_delta: float,
    rounds: int,
    sampling: str,
    sampling_rate: float = 1.0,
    population: int = 0,
    cohort_size: int = 0,
    kind: str = "rdp",
    max_noise: float = MAX_NOISE,
) -> float:
    """The least z whose ``rounds`` rounds of the ``sampling``-sampled Gaussian of multiplier z
    spend ``target_epsilon`` at ``target_delta`` (``calibrate`` over that schedule).

    >>> round(calibrate_noise_multiplier(2.0, 1e-5, 100, "poisson", sampling_rate=0.1,
    ...                                  kind="pld"), 3)
    2.248
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    check_epsilon(target_epsilon)

    def schedule_of(z):
        return [(RoundEvent(sampling, z, sampling_rate, population, cohort_size), rounds)]

    return calibrate(schedule_of, target_epsilon, target_delta, kind, max_noise)


def gdp_multiplier(sensitivity_sum: float, target_epsilon: float, delta: float) -> float:
    """z with mu = sensitivity_sum / z equal to mu(target_epsilon, delta): the exact solve of a
    Gaussian-DP book whose releases compose to mu = sqrt(sum_t c_t^2) / z (``sensitivity_sum``:
    sqrt(sum_t c_t^2), each c_t a participation's sensitivity over its noise unit)."""
    return sensitivity_sum / gdp.mu_from_epsilon(target_epsilon, delta)


def classical_gaussian_multiplier(epsilon: float, delta: float, sensitivity: float) -> float:
    """sigma = sqrt(2 ln(1.25 / delta)) sensitivity / epsilon (module docstring: a paper's
    calibration, not a guarantee for epsilon >= 1)."""
    return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """One-shot Gaussian noise std for (epsilon, delta)-DP by the analytic Gaussian mechanism
    (Balle and Wang 2018, in dp_accounting), valid for every epsilon > 0 (unlike the classic
    sqrt(2 ln(1.25/delta)) / epsilon, proven only for epsilon < 1)."""
    check_epsilon(epsilon)
    check_delta(delta)
    return sensitivity * float(dp_accounting.get_sigma_gaussian(epsilon, delta))


def expected_participations(rate: float, rounds: int, fixed: int = 0) -> int:
    """K: ``fixed`` when > 0, else ceil(lambda T), lambda = ``rate`` the chance a client is in a
    round's cohort."""
    if fixed:
        return int(fixed)
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


def worst_case_multipliers(
    shape, mu: float, participations: int, reserved: float = 0.0
) -> np.ndarray:
    """z_t = kappa s_t for each round t, kappa = (2 / mu) sqrt(sum of the K largest s_t^-2): K
    participations in any rounds spend at most mu (of what ``reserved`` leaves; kappa a hair above,
    as ``constant_multipliers``)."""
    shape = np.asarray(shape, float)
    costliest = np.sort(shape**-2.0)[::-1][:participations]
    mu_upload = float(upload_mus([mu], participations, reserved)[0])
    kappa = 2.0 / mu_upload * math.sqrt(float(np.sum(costliest))) * (1 + 1e-9)
    return kappa * shape
