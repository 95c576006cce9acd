"""Client samplers that carry their own accounting: the object that draws a round's cohort is the one
that says which ``RoundEvent`` (and so which dp_accounting event and neighbouring relation) that round
was, so sampling and accounting cannot be mismatched (issue 19: uniform sampling accounted as Poisson
reported epsilon 1.66 where 8 was spent).

* ``PoissonSampling(K, q)``: each client joins independently with probability q; add/remove-one
  neighbours, sensitivity S; divide the sum by the fixed q K.
* ``FixedSizeSampling(K, m)``: exactly m distinct clients; replace-one neighbours, sensitivity 2S (the
  clipped sum changes by up to 2S when one client's data is replaced): about twice the noise of
  Poisson sampling for the same epsilon.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data import sampling
from fedjax_dp.privacy.accounting.accountant import RoundEvent, calibrate_noise_multiplier
from fedjax_dp.privacy.accounting.participation_sampling import ParticipationSampling
from fedjax_dp.privacy.correlated.participation import SCHEMES, Participation


@dataclasses.dataclass(frozen=True)
class PoissonSampling:
    num_clients: int
    rate: float

    def __post_init__(self):
        if not 0 < self.rate <= 1:
            raise ValueError(f"sampling rate q must lie in (0, 1], got rate={self.rate}")
        if self.num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {self.num_clients}")

    def sample(self, rng: np.random.Generator, eligible: np.ndarray | None = None, t: int = 1) -> np.ndarray:
        return sampling.poisson(self.num_clients, self.rate, rng, eligible)

    def expected_cohort(self) -> float:
        return self.rate * self.num_clients

    def round_event(self, noise_multiplier: float) -> RoundEvent:
        return RoundEvent("poisson", noise_multiplier, sampling_rate=self.rate)

    def calibrate(self, target_epsilon: float, delta: float, rounds: int, accountant: str = "pld") -> float:
        """The least noise multiplier z whose ``rounds`` rounds spend ``target_epsilon`` at ``delta``.

        >>> sampler = PoissonSampling(num_clients=1000, rate=0.1)
        >>> z = sampler.calibrate(target_epsilon=2.0, delta=1e-5, rounds=100)
        >>> round(z, 3)
        2.248
        >>> from fedjax_dp.privacy import Accountant
        >>> round(Accountant("pld").compose(sampler.round_event(z), count=100).epsilon(1e-5), 3)
        2.0
        """
        return calibrate_noise_multiplier(target_epsilon, delta, rounds, "poisson", sampling_rate=self.rate,
                                          kind=accountant)


@dataclasses.dataclass(frozen=True)
class FixedSizeSampling:
    num_clients: int
    cohort_size: int

    def __post_init__(self):
        if not 1 <= self.cohort_size <= self.num_clients:
            raise ValueError(f"cohort_size must lie in [1, num_clients={self.num_clients}], got {self.cohort_size}")

    def sample(self, rng: np.random.Generator, eligible: np.ndarray | None = None, t: int = 1) -> np.ndarray:
        return sampling.uniform(self.num_clients, self.cohort_size, rng, eligible)

    def expected_cohort(self) -> float:
        return float(self.cohort_size)

    def round_event(self, noise_multiplier: float, population: int | None = None) -> RoundEvent:
        """``population``: the clients the m were drawn from, if fewer than all (budget-stopped clients)."""
        return RoundEvent("fixed", noise_multiplier, population=population or self.num_clients,
                          cohort_size=self.cohort_size)

    def calibrate(self, target_epsilon: float, delta: float, rounds: int, accountant: str = "pld") -> float:
        return calibrate_noise_multiplier(target_epsilon, delta, rounds, "fixed", population=self.num_clients,
                                          cohort_size=self.cohort_size, kind=accountant)


def participation(sampling_cfg) -> Participation:
    """The participation scheme a config's ``sampling`` section states (min_separation, single, cyclic,
    cyclic_poisson)."""
    method = sampling_cfg.method
    return Participation(method, int(sampling_cfg.min_separation), int(sampling_cfg.max_participations),
                         rate=float(sampling_cfg.rate) if method == "cyclic_poisson" else 1.0)


def client_sampler(sampling_cfg, num_clients: int) -> PoissonSampling | FixedSizeSampling | ParticipationSampling:
    """The sampler a config's ``sampling`` section describes (``uniform``: fixed-size; a participation scheme: the
    sampler that enforces it, ``participation_sampling``)."""
    if sampling_cfg.method in SCHEMES:
        return ParticipationSampling(num_clients, participation(sampling_cfg), int(sampling_cfg.cohort_size),
                                     float(sampling_cfg.check_in_rate))
    if sampling_cfg.method == "uniform":
        return FixedSizeSampling(num_clients, sampling_cfg.cohort_size)
    return PoissonSampling(num_clients, sampling_cfg.rate)
