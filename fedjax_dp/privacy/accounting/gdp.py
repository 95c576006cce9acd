"""Gaussian differential privacy (Dong, Roth, Su 2022): the CLT approximation and exact conversions.

* ``mu_clt(q, sigma, T) = q sqrt(T (e^{1/sigma^2} - 1))``: the central-limit approximation of T
  rounds of the Poisson-subsampled Gaussian mechanism (Bu et al. 2020, Eq. 6). It is an
  APPROXIMATION, not an upper bound: it can under-report epsilon, so reports put a PLD or RDP
  epsilon beside it (ALGORITHMS.md Sec. 5).
* ``delta_from_mu(mu, eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``: exact for a mu-GDP
  mechanism (Dong et al., Corollary 2.13), and its inverses ``epsilon_from_mu`` and
  ``mu_from_epsilon``.
"""

from __future__ import annotations

import math

from scipy import optimize, special


def _check_mu(mu: float):
    if not mu > 0 or not math.isfinite(mu):
        raise ValueError(f"mu must be a positive finite number, got {mu}")


def mu_clt(sampling_rate: float, noise_multiplier: float, rounds: int) -> float:
    """CLT mu of ``rounds`` compositions of the Poisson-subsampled Gaussian (an approximation: Bu et
    al. 2020, Theorem 5), mu = q sqrt(T (e^{1/z^2} - 1)).

    >>> round(mu_clt(sampling_rate=0.01, noise_multiplier=1.0, rounds=1000), 4)
    0.4145

    A noise multiplier below about 0.038 (1/z^2 > 709) gives inf, not an overflow error:

    >>> mu_clt(sampling_rate=0.2, noise_multiplier=0.03, rounds=1)
    inf
    """
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling rate must lie in (0, 1], got {sampling_rate}")
    if not noise_multiplier > 0:
        raise ValueError(f"noise multiplier must be > 0, got {noise_multiplier}")
    exponent = noise_multiplier**-2
    if exponent > 709.0:  # e^exponent overflows a float: the CLT figure is unbounded
        return math.inf
    return sampling_rate * math.sqrt(rounds * math.expm1(exponent))


def delta_from_mu(mu: float, epsilon: float) -> float:
    """Exact delta(epsilon) of a mu-GDP mechanism."""
    _check_mu(mu)
    # e^eps Phi(b) computed as exp(eps + log Phi(b)) so large epsilon does not overflow; for a huge
    # mu the
    # sum cancels catastrophically (both terms ~ mu^2 / 2), so it is held at log Phi(a), its true
    # upper
    # bound (delta >= 0), which keeps delta in [0, Phi(a)].
    a, b = -epsilon / mu + mu / 2, -epsilon / mu - mu / 2
    log_cdf_a = float(special.log_ndtr(a))
    return float(
        math.exp(log_cdf_a) - math.exp(min(epsilon + float(special.log_ndtr(b)), log_cdf_a))
    )


def epsilon_from_mu(mu: float, delta: float) -> float:
    """The epsilon at which a mu-GDP mechanism has the given delta (inverse of ``delta_from_mu``;
    Dong, Roth and Su 2022, Corollary 2.13).

    >>> round(epsilon_from_mu(0.5, 1e-5), 3)
    1.993
    >>> round(mu_from_epsilon(epsilon_from_mu(0.5, 1e-5), 1e-5), 6)
    0.5
    """
    _check_mu(mu)
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if delta_from_mu(mu, 0.0) <= delta:
        return 0.0
    high = 1.0
    while delta_from_mu(mu, high) > delta:
        high *= 2
    return float(optimize.brentq(lambda e: delta_from_mu(mu, e) - delta, 0.0, high, xtol=1e-12))


def mu_from_epsilon(epsilon: float, delta: float) -> float:
    """The mu of a mu-GDP mechanism that is exactly (epsilon, delta)-DP."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    high = 1.0
    while delta_from_mu(high, epsilon) < delta:
        high *= 2
    return float(
        optimize.brentq(lambda m: delta_from_mu(m, epsilon) - delta, 1e-9, high, xtol=1e-12)
    )
