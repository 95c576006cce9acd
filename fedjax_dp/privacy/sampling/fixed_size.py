"""Fixed-size sampling: exactly m distinct clients a round, uniformly without replacement;
replace-one neighbours, sensitivity 2S (the clipped sum changes by up to 2S when one client's data
is replaced): about twice the noise of Poisson sampling for the same epsilon. Accounted as
dp_accounting's sampled-without-replacement event under RDP and by the Dong-Roth-Su reduction
under PLD (``privacy.accounting.accountant``), over the clients still eligible.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data import sampling
from fedjax_dp.privacy.accounting import calibration
from fedjax_dp.privacy.accounting.accountant import RoundEvent
from fedjax_dp.privacy.sampling.registry import register_sampler


@dataclasses.dataclass(frozen=True)
class FixedSizeSampling:
    num_clients: int
    cohort_size: int

    relation = "replace-one"

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

    def expected_cohort(self, t: int | None = None) -> float:
        return float(self.cohort_size)

    def denominators(self) -> tuple:
        return ()

    def slots(self, drawn: int = 0) -> None:
        return None  # exactly the cohort

    def capacity(self) -> int:
        return self.cohort_size

    def sized_by(self) -> str:
        return f"sampling.cohort_size={self.cohort_size}"

    def can_draw(self, eligible: np.ndarray) -> bool:
        """Whether m clients are still eligible (budget-stopped clients leave the population)."""
        return int(np.sum(eligible)) >= self.cohort_size

    def rate_at(self, t: int | None) -> float:
        return self.cohort_size / self.num_clients

    def round_event(self, mechanism, t: int | None = None, eligible: int | None = None):
        """The round's event: m of the ``eligible`` clients still eligible (all K where not
        given), ``mechanism`` a dp_accounting event or a Gaussian's z."""
        population = max(eligible, self.cohort_size) if eligible is not None else self.num_clients
        if isinstance(mechanism, (int, float)):
            return RoundEvent(
                "fixed", mechanism, population=population, cohort_size=self.cohort_size
            )
        return RoundEvent(
            "fixed", population=population, cohort_size=self.cohort_size, mechanism=mechanism
        )

    def describe(self) -> str:
        return "fixed-size without replacement"

    def accounting_notes(self) -> tuple[str, ...]:
        return (
            "fixed-size sampling: replace-one neighbours, sensitivity 2S; RDP with the"
            " dp_accounting replace-one normalisation corrected (google/differential-privacy#378);"
            " PLD by the Dong-Roth-Su reduction (a Poisson-subsampled Gaussian of rate m/K and"
            " multiplier z/2)",
        )

    def calibrate(
        self, target_epsilon: float, delta: float, rounds: int, accountant: str = "pld"
    ) -> float:
        """The least z whose ``rounds`` rounds spend ``target_epsilon`` at ``delta``."""
        return calibration.calibrate(
            lambda z: [(self.round_event(z), rounds)], target_epsilon, delta, accountant
        )


def check(cfg, need) -> None:
    s, clients = cfg.sampling, cfg.data.num_clients
    need(
        1 <= s.cohort_size <= clients,
        f"sampling.cohort_size must lie in [1, data.num_clients={clients}], got {s.cohort_size}",
    )


register_sampler(
    "uniform",
    build=lambda section, num_clients: FixedSizeSampling(num_clients, section.cohort_size),
    keys={"cohort_size": (10, "uniform: clients per round m")},
    validate=check,
    summary="exactly m clients, replace-one",
)
