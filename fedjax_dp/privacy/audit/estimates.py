"""From canary statistics to epsilon: the one-shot estimate of Andrew et al. and the one-run lower
bound of Steinke et al.

* ``epsilon_hat`` (Andrew, Kairouz, Oh, Oprea, McMahan and Suriyakumar, "One-shot empirical privacy
  estimation for federated learning", ICLR 2024, Sec. 3): fit a Gaussian to the statistics of the
  inserted canaries and one to those of the canaries never inserted, and report the epsilon at the
  run's delta of the mechanism whose output is one Gaussian or the other, the larger of the two
  directions (``gaussian_pair_epsilon``). It is an estimate, not a bound: exact for the Gaussian
  mechanism as the dimension grows (their Thm. 3.1), an approximation elsewhere. Its uncertainty is
  a bootstrap interval over the canaries.
* ``one_run_lower_bound`` (Steinke, Nasr and Jagielski, "Privacy auditing with one (1) training
  run", NeurIPS 2023, Thm. 3.1 with the delta term of their Prop. 5.6): each canary was inserted on
  a fair coin; the auditor guesses "in" for the highest statistics, and the number of correct
  guesses bounds epsilon from below with the stated confidence. jax_privacy's ``CanaryScoreAuditor``
  computes it (threshold chosen with a Bonferroni correction over every threshold).

A lower bound above the formal epsilon, or an estimate above it by more than its uncertainty, says
the code or the accounting is wrong (``AuditEstimate.flagged``). For the two-fit estimate the
uncertainty is the basic (bias-corrected) bootstrap interval, [2 e - q_hi, 2 e - q_lo] from the
percentiles q of the resampled estimates: with ~500 canaries a side the variance ratio is estimated
so loosely that the estimate is biased upwards (for the Gaussian mechanism of exact epsilon 1.84 its
mean is 2.55, its 90th percentile 3.42), and its percentile interval (``interval``, as recorded) lay
wholly above a correct formal epsilon of 2 in 10 of 60 simulated honest audits, the basic interval
in none (``tests/test_in_run_audit.py``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from jax_privacy.auditing import CanaryScoreAuditor
from scipy import optimize

BOOTSTRAP_RESAMPLES = 200
EPSILON_CEILING = 200.0  # an estimate this large is reported as such (the fits barely overlap)


def gaussian_pair_delta(epsilon: float, mu_p, sd_p, mu_q, sd_q) -> float:
    """delta(epsilon) = integral of (p - e^epsilon q)_+ for p = N(mu_p, sd_p^2), q = N(mu_q,
    sd_q^2): P(R) - e^epsilon Q(R) over R = {x: log p(x) - log q(x) > epsilon}, a quadratic
    inequality in x whose region is one or two intervals."""
    a = 0.5 / sd_q**2 - 0.5 / sd_p**2
    b = mu_p / sd_p**2 - mu_q / sd_q**2
    c = 0.5 * mu_q**2 / sd_q**2 - 0.5 * mu_p**2 / sd_p**2 + math.log(sd_q / sd_p) - epsilon
    intervals = _positive_region(a, b, c)

    def mass(mu, sd):
        return sum(_normal_mass((lo - mu) / sd, (hi - mu) / sd) for lo, hi in intervals)

    return max(0.0, mass(mu_p, sd_p) - math.exp(epsilon) * mass(mu_q, sd_q))


def _normal_mass(lo: float, hi: float) -> float:
    """P(lo < Z < hi) for a standard normal Z, from the nearer tail (no cancellation far out)."""
    if lo >= 0:  # both in the upper tail: survival functions
        return 0.5 * (math.erfc(lo / math.sqrt(2)) - math.erfc(hi / math.sqrt(2)))
    if hi <= 0:
        return 0.5 * (math.erfc(-hi / math.sqrt(2)) - math.erfc(-lo / math.sqrt(2)))
    return 1.0 - 0.5 * math.erfc(-lo / math.sqrt(2)) - 0.5 * math.erfc(hi / math.sqrt(2))


def _positive_region(a: float, b: float, c: float) -> list[tuple[float, float]]:
    """The intervals where a x^2 + b x + c > 0."""
    inf = math.inf
    if abs(a) < 1e-12 * max(abs(b), 1e-300):  # linear
        if b == 0:
            return [(-inf, inf)] if c > 0 else []
        root = -c / b
        return [(root, inf)] if b > 0 else [(-inf, root)]
    disc = b * b - 4 * a * c
    if disc <= 0:
        return [(-inf, inf)] if a > 0 else []
    r1, r2 = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
    return [(-inf, r1), (r2, inf)] if a > 0 else [(r1, r2)]


def gaussian_pair_epsilon(mu_in, sd_in, mu_out, sd_out, delta: float) -> float:
    """The least epsilon with delta(epsilon) <= ``delta`` in both directions between N(mu_in,
    sd_in^2) and N(mu_out, sd_out^2) (``EPSILON_CEILING`` where even that is not enough)."""

    def one_way(mu_p, sd_p, mu_q, sd_q):
        def gap(eps):
            return gaussian_pair_delta(eps, mu_p, sd_p, mu_q, sd_q) - delta

        if gap(0.0) <= 0:
            return 0.0
        if gap(EPSILON_CEILING) > 0:
            return EPSILON_CEILING
        return optimize.brentq(gap, 0.0, EPSILON_CEILING, xtol=1e-9)

    return max(one_way(mu_in, sd_in, mu_out, sd_out), one_way(mu_out, sd_out, mu_in, sd_in))


SD_FLOOR = 1e-150  # a statistic with no spread (a model that did not move); its square is finite


def _fit(x: np.ndarray) -> tuple[float, float]:
    return float(np.mean(x)), max(float(np.std(x, ddof=1)), SD_FLOOR)


def equal_variance_epsilon(inserted, unseen, delta: float) -> float:
    """The estimate with one pooled variance: mu-GDP with mu = (mean_in - mean_out) / sd (Dong, Roth
    and Su 2022), what the Gaussian mechanism gives exactly; steadier than two fits, whose
    variance ratio dominates at a small delta."""
    (mu_in, sd_in), (mu_out, sd_out) = _fit(inserted), _fit(unseen)
    pooled = math.sqrt(
        (sd_in**2 * (len(inserted) - 1) + sd_out**2 * (len(unseen) - 1))
        / (len(inserted) + len(unseen) - 2)
    )
    return gaussian_pair_epsilon(mu_in, pooled, mu_out, pooled, delta)


def epsilon_hat(
    inserted,
    unseen,
    delta: float,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> dict:
    """Andrew et al.'s estimate from the two groups' statistics (two Gaussian fits) and the
    equal-variance one, each with a bootstrap interval at ``confidence`` (percentiles of the
    estimate over canaries resampled with replacement)."""
    inserted, unseen = np.asarray(inserted, np.float64), np.asarray(unseen, np.float64)
    if len(inserted) < 2 or len(unseen) < 2:
        raise ValueError(
            f"an estimate needs at least 2 inserted and 2 unseen canaries, got {len(inserted)} and"
            f" {len(unseen)}"
        )

    def two_fits(a, b):
        return gaussian_pair_epsilon(*_fit(a), *_fit(b), delta)

    def pooled(a, b):
        return equal_variance_epsilon(a, b, delta)

    rng = np.random.default_rng(seed)
    samples = [
        (rng.choice(inserted, len(inserted)), rng.choice(unseen, len(unseen)))
        for _ in range(resamples)
    ]
    tail = (1 - confidence) / 2

    def interval(estimator):
        draws = [estimator(a, b) for a, b in samples]
        return [float(q) for q in np.quantile(draws, [tail, 1 - tail])]

    return {
        "epsilon_hat": float(two_fits(inserted, unseen)),
        "interval": interval(two_fits),
        "epsilon_hat_equal_variance": float(pooled(inserted, unseen)),
        "interval_equal_variance": interval(pooled),
        "confidence": confidence,
        "inserted_fit": list(_fit(inserted)),
        "unseen_fit": list(_fit(unseen)),
    }


def one_run_lower_bound(inserted, unseen, delta: float, confidence: float = 0.95) -> float:
    """Steinke et al.'s epsilon lower bound from one run, holding with probability ``confidence``
    (jax_privacy's ``CanaryScoreAuditor.epsilon_one_run``: the guess "in" above a threshold)."""
    auditor = CanaryScoreAuditor(np.asarray(inserted), np.asarray(unseen))
    return float(auditor.epsilon_one_run(significance=1 - confidence, delta=delta))


@dataclasses.dataclass(frozen=True)
class AuditEstimate:
    """One threat model's empirical figures beside the formal epsilon they are compared with."""

    threat_model: str  # "final_model" or "all_iterates"
    statistic: str
    formal_epsilon: float  # what the canaries' participation was accounted at
    estimate: dict  # ``epsilon_hat``'s record
    lower_bound: float
    confidence: float

    @property
    def flagged(self) -> bool:
        """The claim is contradicted: the lower bound exceeds it, or an estimate's whole
        interval lies above it: the equal-variance one's, or the two-fit one's basic interval
        (module docstring)."""
        e = self.estimate
        return (
            self.lower_bound > self.formal_epsilon
            or e["interval_equal_variance"][0] > self.formal_epsilon
            or 2 * e["epsilon_hat"] - e["interval"][1] > self.formal_epsilon
        )

    def record(self) -> dict:
        return {
            "statistic": self.statistic,
            "formal_epsilon": self.formal_epsilon,
            **self.estimate,
            "lower_bound": self.lower_bound,
            "lower_bound_confidence": self.confidence,
            "flagged": self.flagged,
        }


def assess(
    threat_model: str,
    statistic: str,
    scores,
    inserted_mask,
    formal_epsilon: float,
    delta: float,
    confidence: float,
) -> AuditEstimate:
    """Both figures of one threat model from each canary's score and whether it was inserted."""
    scores, mask = np.asarray(scores, np.float64), np.asarray(inserted_mask, bool)
    return AuditEstimate(
        threat_model,
        statistic,
        float(formal_epsilon),
        epsilon_hat(scores[mask], scores[~mask], delta, confidence),
        one_run_lower_bound(scores[mask], scores[~mask], delta, confidence),
        confidence,
    )
