"""Client samplers that carry their own accounting: the object that draws a round's cohort is the
one that says which ``RoundEvent`` (and so which dp_accounting event and neighbouring relation) that
round was, so sampling and accounting cannot be mismatched (issue 19: uniform sampling accounted as
Poisson reported epsilon 1.66 where 8 was spent).

* ``PoissonSampling(K, q)``: each client joins independently with probability q; add/remove-one
  neighbours, sensitivity S; divide the sum by the fixed q K. With ``schedule`` ((first round, q_t),
  ...), round t samples at q_t (Geyer et al. 2017's m_t = q_t K, adapted over training): each round
  is still a Poisson-subsampled Gaussian, at its own rate, and the accountant composes the rounds'
  different events.
* ``FixedSizeSampling(K, m)``: exactly m distinct clients; replace-one neighbours, sensitivity 2S
  (the clipped sum changes by up to 2S when one client's data is replaced): about twice the noise of
  Poisson sampling for the same epsilon.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.core.schedules import parse_schedule, schedule_value
from fedjax_dp.data import sampling
from fedjax_dp.privacy.accounting.accountant import RoundEvent, calibrate_noise_multiplier
from fedjax_dp.privacy.accounting.participation_sampling import ParticipationSampling
from fedjax_dp.privacy.correlated.participation import SCHEMES, Participation


@dataclasses.dataclass(frozen=True)
class PoissonSampling:
    num_clients: int
    rate: float
    schedule: tuple = ()  # ((first round, q_t), ...) from round 1; empty: q in every round

    def __post_init__(self):
        for q in (self.rate, *(q for _, q in self.schedule)):
            if not 0 < q <= 1:
                raise ValueError(f"sampling rate q must lie in (0, 1], got rate={q}")
        if self.schedule and self.schedule[0][0] != 1:
            raise ValueError(f"a sampling-rate schedule starts at round 1, got {self.schedule!r}")
        if self.num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {self.num_clients}")

    def rate_at(self, t: int | None) -> float:
        """q_t, the rate of round t (``rate`` without a schedule, or where t is not given)."""
        return schedule_value(self.schedule, t) if self.schedule and t is not None else self.rate

    @property
    def max_rate(self) -> float:
        """The largest q any round samples at (what a round's packed cohort must hold)."""
        return max(q for _, q in self.schedule) if self.schedule else self.rate

    def sample(
        self, rng: np.random.Generator, eligible: np.ndarray | None = None, t: int = 1
    ) -> np.ndarray:
        return sampling.poisson(self.num_clients, self.rate_at(t), rng, eligible)

    def expected_cohort(self, t: int | None = None) -> float:
        """q_t K: the fixed denominator of round t (of round 1 where t is not given)."""
        return self.rate_at(t if t is not None else 1) * self.num_clients

    def denominators(self) -> tuple:
        """((first round, q_t K), ...): the schedule of fixed denominators (empty without a rate
        schedule)."""
        return tuple((t, q * self.num_clients) for t, q in self.schedule)

    def round_event(self, noise_multiplier: float, t: int | None = None) -> RoundEvent:
        return RoundEvent("poisson", noise_multiplier, sampling_rate=self.rate_at(t))

    def calibrate(
        self, target_epsilon: float, delta: float, rounds: int, accountant: str = "pld"
    ) -> float:
        """The least noise multiplier z whose ``rounds`` rounds spend ``target_epsilon`` at
        ``delta``.

        >>> sampler = PoissonSampling(num_clients=1000, rate=0.1)
        >>> z = sampler.calibrate(target_epsilon=2.0, delta=1e-5, rounds=100)
        >>> round(z, 3)
        2.248
        >>> from fedjax_dp.privacy import Accountant
        >>> round(Accountant("pld").compose(sampler.round_event(z), count=100).epsilon(1e-5), 3)
        2.0
        """
        if len(self.schedule) > 1:
            raise ValueError(
                "calibrating one noise multiplier to a sampling-rate schedule is not supported: set"
                " dp.noise_multiplier (the accountant composes each round at its own rate)"
            )
        return calibrate_noise_multiplier(
            target_epsilon, delta, rounds, "poisson", sampling_rate=self.rate_at(1), kind=accountant
        )


@dataclasses.dataclass(frozen=True)
class FixedSizeSampling:
    num_clients: int
    cohort_size: int

    def __post_init__(self):
        if not 1 <= self.cohort_size <= self.num_clients:
            raise ValueError(
                f"cohort_size must lie in [1, num_clients={self.num_clients}], got"
                f" {self.cohort_size}"
            )

    def sample(
        self, rng: np.random.Generator, eligible: np.ndarray | None = None, t: int = 1
    ) -> np.ndarray:
        return sampling.uniform(self.num_clients, self.cohort_size, rng, eligible)

    def expected_cohort(self) -> float:
        return float(self.cohort_size)

    def round_event(self, noise_multiplier: float, population: int | None = None) -> RoundEvent:
        """``population``: the clients the m were drawn from, if fewer than all (budget-stopped
        clients)."""
        return RoundEvent(
            "fixed",
            noise_multiplier,
            population=population or self.num_clients,
            cohort_size=self.cohort_size,
        )

    def calibrate(
        self, target_epsilon: float, delta: float, rounds: int, accountant: str = "pld"
    ) -> float:
        return calibrate_noise_multiplier(
            target_epsilon,
            delta,
            rounds,
            "fixed",
            population=self.num_clients,
            cohort_size=self.cohort_size,
            kind=accountant,
        )


def participation(sampling_cfg) -> Participation:
    """The participation scheme a config's ``sampling`` section states (min_separation, single,
    cyclic, cyclic_poisson)."""
    method = sampling_cfg.method
    return Participation(
        method,
        int(sampling_cfg.min_separation),
        int(sampling_cfg.max_participations),
        rate=float(sampling_cfg.rate) if method == "cyclic_poisson" else 1.0,
    )


def client_sampler(
    sampling_cfg, num_clients: int
) -> PoissonSampling | FixedSizeSampling | ParticipationSampling:
    """The sampler a config's ``sampling`` section describes (``uniform``: fixed-size; a
    participation scheme: the sampler that enforces it, ``participation_sampling``)."""
    if sampling_cfg.method in SCHEMES:
        return ParticipationSampling(
            num_clients,
            participation(sampling_cfg),
            int(sampling_cfg.cohort_size),
            float(sampling_cfg.check_in_rate),
        )
    if sampling_cfg.method == "uniform":
        return FixedSizeSampling(num_clients, sampling_cfg.cohort_size)
    schedule = (
        parse_schedule(
            sampling_cfg.get("rate_schedule", ""),
            sampling_cfg.rate,
            key="sampling.rate_schedule",
            unit="q",
        )
        if sampling_cfg.get("rate_schedule", "")
        else ()
    )
    return PoissonSampling(num_clients, sampling_cfg.rate, schedule)
