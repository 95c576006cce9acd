"""The sampler of correlated-noise runs: it draws cohorts under a stated participation scheme
(``privacy.correlated.participation``) and enforces it, so the sensitivity the noise was calibrated
for holds.

* ``min_separation`` (b, k) and ``single`` (k = 1): every client checks in with probability
  ``check_in_rate`` (available: idle, charging, on Wi-Fi); the server refuses those inside their
  separation window (fewer than b rounds since their last participation) or with k participations,
  and takes at most ``cohort_size`` of the rest, uniformly (Kairouz et al. 2021, Sec. 5; McMahan et
  al. 2024's Gboard deployment). Who is inside a window is the ledger's history of the rounds run
  (``privacy.ledgers.correlated``), replayed on resume.
* ``cyclic`` (b): client i belongs to group i mod b, and round t takes the whole group (t - 1) mod
  b.
* ``cyclic_poisson`` (b, q): the same groups, each member of the round's group drawn with
  probability q.

The denominator of the update is fixed (never the realised count): the cohort cap, the group size K
/ b, or q K / b.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_dp.privacy.correlated.participation import Participation


@dataclasses.dataclass(frozen=True)
class ParticipationSampling:
    num_clients: int
    participation: Participation
    cohort_size: int = 0  # min_separation / single: the most clients a round takes
    check_in_rate: float = 1.0  # min_separation / single: the chance a client checks in

    def __post_init__(self):
        p = self.participation
        if self.num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {self.num_clients}")
        if p.scheme in ("cyclic", "cyclic_poisson") and p.min_separation > self.num_clients:
            raise ValueError(
                f"{p.min_separation} cyclic groups need at least as many clients, got"
                f" {self.num_clients}"
            )
        if p.scheme in ("min_separation", "single"):
            if not 1 <= self.cohort_size <= self.num_clients:
                raise ValueError(
                    f"cohort_size must lie in [1, num_clients={self.num_clients}], got"
                    f" {self.cohort_size}"
                )
            if not 0 < self.check_in_rate <= 1:
                raise ValueError(f"check_in_rate must lie in (0, 1], got {self.check_in_rate}")

    @property
    def cyclic(self) -> bool:
        return self.participation.scheme in ("cyclic", "cyclic_poisson")

    def group_of_round(self, t: int) -> np.ndarray:
        """Which clients belong to round t's group (cyclic schemes; every client otherwise)."""
        if not self.cyclic:
            return np.ones(self.num_clients, bool)
        b = self.participation.min_separation
        return np.arange(self.num_clients) % b == (t - 1) % b

    def allowed(self, t: int, last_round: np.ndarray, participations: np.ndarray) -> np.ndarray:
        """The clients the scheme lets take part in round t, given each one's last round (0: never)
        and count."""
        p = self.participation
        allowed = self.group_of_round(t)
        if p.scheme == "single":
            return allowed & (participations == 0)
        if p.scheme == "min_separation":
            allowed = allowed & ((last_round == 0) | (t - last_round >= p.min_separation))
            if p.max_participations:
                allowed &= participations < p.max_participations
        return allowed

    def sample(
        self, rng: np.random.Generator, eligible: np.ndarray | None = None, t: int = 1
    ) -> np.ndarray:
        """Round t's sorted client ids among ``eligible`` (the ledger's ``allowed`` and budgets;
        None: the group of round t, for a cyclic scheme, and everyone else)."""
        pool = (
            self.group_of_round(t)
            if eligible is None
            else np.asarray(eligible, bool) & self.group_of_round(t)
        )
        p = self.participation
        if p.scheme == "cyclic":
            return np.flatnonzero(pool)
        if p.scheme == "cyclic_poisson":
            return np.flatnonzero(pool & (rng.random(self.num_clients) < p.rate))
        checked_in = np.flatnonzero(pool & (rng.random(self.num_clients) < self.check_in_rate))
        if len(checked_in) > self.cohort_size:
            checked_in = np.sort(rng.choice(checked_in, size=self.cohort_size, replace=False))
        return checked_in

    def expected_cohort(self) -> float:
        """The fixed denominator: the cohort cap, or the (expected) group size."""
        p = self.participation
        if p.scheme == "cyclic":
            return self.num_clients / p.min_separation
        if p.scheme == "cyclic_poisson":
            return p.rate * self.num_clients / p.min_separation
        return float(self.cohort_size)

    def slots(self, drawn: int = 0) -> int:
        """The cohort capacity a round is packed into (one compiled program for the run; ``drawn``:
        the round's cohort, which a rare large Poisson draw may push above the usual capacity)."""
        p = self.participation
        group = math.ceil(self.num_clients / p.min_separation)
        if p.scheme == "cyclic":
            return group
        if p.scheme == "cyclic_poisson":
            base = p.rate * group + 4 * math.sqrt(group * p.rate * (1 - p.rate))
            return max(drawn, min(group, max(8, 8 * math.ceil(base / 8))))
        return self.cohort_size
