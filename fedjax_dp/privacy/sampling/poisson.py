"""Poisson sampling (McMahan et al. 2018's DP-FedAvg): each client joins a round independently with
probability q; add/remove-one neighbours, sensitivity S; the server divides the sum by the fixed
q K, never the realised count. With ``schedule`` ((first round, q_t), ...), round t samples at q_t
(Geyer et al. 2017's m_t = q_t K, adapted over training): each round is still a Poisson-subsampled
mechanism, at its own rate, and the accountant composes the rounds' different events.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_dp.core.schedules import parse_schedule, schedule_value
from fedjax_dp.data import sampling
from fedjax_dp.privacy.accounting import calibration
from fedjax_dp.privacy.accounting.accountant import RoundEvent
from fedjax_dp.privacy.sampling.registry import register_sampler


@dataclasses.dataclass(frozen=True)
class PoissonSampling:
    num_clients: int
    rate: float
    schedule: tuple = ()  # ((first round, q_t), ...) from round 1; empty: q in every round

    relation = "add/remove-one"

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

    def slots(self, drawn: int = 0) -> int:
        """Fixed cohort capacity: mean + 4 sd at the largest rate, rounded up to a multiple of 8
        (one compiled program for the run), or the round's draw where a rare one is larger."""
        q, k = self.max_rate, self.num_clients
        base = q * k + 4 * math.sqrt(k * q * (1 - q))
        return max(8, 8 * math.ceil(max(base, drawn) / 8))

    def capacity(self) -> int:
        return self.slots(0)

    def sized_by(self) -> str:
        return f"sampling.rate={self.max_rate:g} (up to {self.capacity()} clients)"

    def can_draw(self, eligible: np.ndarray) -> bool:
        return True

    def round_event(self, mechanism, t: int | None = None, eligible: int | None = None):
        """Round t's event: ``mechanism`` (a dp_accounting event, or a Gaussian's z) sampled at
        q_t."""
        if isinstance(mechanism, (int, float)):
            return RoundEvent("poisson", mechanism, sampling_rate=self.rate_at(t))
        return RoundEvent("poisson", sampling_rate=self.rate_at(t), mechanism=mechanism)

    def describe(self) -> str:
        return "Poisson"

    def accounting_notes(self) -> tuple[str, ...]:
        return ()

    def calibrate(
        self, target_epsilon: float, delta: float, rounds: int, accountant: str = "pld"
    ) -> float:
        """The least noise multiplier z whose ``rounds`` rounds of the sampled Gaussian spend
        ``target_epsilon`` at ``delta`` (``calibration.calibrate``).

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
        return calibration.calibrate(
            lambda z: [(self.round_event(z, 1), rounds)], target_epsilon, delta, accountant
        )


def build(section, num_clients: int) -> PoissonSampling:
    schedule = section.get("rate_schedule", "")
    if schedule:
        schedule = parse_schedule(schedule, section.rate, key="sampling.rate_schedule", unit="q")
    return PoissonSampling(num_clients, section.rate, schedule or ())


def check(cfg, need) -> None:
    s = cfg.sampling
    need(0 < s.rate <= 1, f"sampling.rate q must lie in (0, 1], got {s.rate}")
    if not s.rate_schedule:
        return
    try:
        for _, q in parse_schedule(s.rate_schedule, s.rate, key="sampling.rate_schedule", unit="q"):
            need(
                0 < q <= 1,
                f"sampling.rate_schedule={s.rate_schedule!r}: every q must lie in (0, 1], got {q}",
            )
    except ValueError as error:
        need(False, str(error))


RATE_DOC = "the probability q that a client takes part in a round"
register_sampler(
    "poisson",
    build=build,
    keys={
        "rate": (0.1, RATE_DOC),
        "rate_schedule": (
            "",
            "per-round rates '1:q1,t2:q2,...' (from round t on, replacing sampling.rate; Geyer et"
            " al. 2017's m_t = q_t K), each round accounted at its own q_t; DP-FedAvg divides by"
            " q_t K",
        ),
    },
    validate=check,
    summary="each client with probability q, add/remove-one",
)
