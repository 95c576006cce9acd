"""The samplers of correlated-noise runs: it draws cohorts under a stated participation scheme
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

from fedjax_dp.privacy.accounting.accountant import RoundEvent
from fedjax_dp.privacy.correlated.participation import SCHEMES, Participation
from fedjax_dp.privacy.sampling.registry import register_sampler


@dataclasses.dataclass(frozen=True)
class ParticipationSampling:
    num_clients: int
    participation: Participation
    cohort_size: int = 0  # min_separation / single: the most clients a round takes
    check_in_rate: float = 1.0  # min_separation / single: the chance a client checks in

    relation = "zero-out (participation schedule fixed)"

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

    def expected_cohort(self, t: int | None = None) -> float:
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

    def capacity(self) -> int:
        return self.slots(0)

    def denominators(self) -> tuple:
        return ()

    def sized_by(self) -> str:
        p = self.participation
        if p.scheme in ("min_separation", "single"):
            return f"sampling.cohort_size={self.cohort_size}"
        return (
            f"sampling.min_separation={p.min_separation} groups (up to {self.capacity()} clients)"
        )

    def can_draw(self, eligible: np.ndarray) -> bool:
        return True

    def rate_at(self, t: int | None) -> float:
        """The chance a client is in a round's cohort (its group's, for the cyclic schemes)."""
        return self.expected_cohort() / self.num_clients

    def round_event(self, mechanism, t: int | None = None, eligible: int | None = None):
        """A round alone is not what correlated noise is accounted by (the ledger composes the
        stream's event); this is the round's mechanism, unsampled (no amplification assumed)."""
        if isinstance(mechanism, (int, float)):
            return RoundEvent("full", mechanism)
        return RoundEvent("full", mechanism=mechanism)

    def describe(self) -> str:
        return self.participation.describe()

    def accounting_notes(self) -> tuple[str, ...]:
        return ()


def participation_of(section) -> Participation:
    """The participation scheme a config's ``sampling`` section states."""
    method = section.method
    return Participation(
        method,
        int(section.min_separation),
        int(section.max_participations),
        rate=float(section.rate) if method == "cyclic_poisson" else 1.0,
    )


def build(section, num_clients: int) -> ParticipationSampling:
    return ParticipationSampling(
        num_clients,
        participation_of(section),
        int(section.cohort_size),
        float(section.check_in_rate),
    )


def _check_cohort(cfg, need) -> None:
    s, clients = cfg.sampling, cfg.data.num_clients
    need(
        1 <= s.cohort_size <= clients,
        f"sampling.cohort_size must lie in [1, data.num_clients={clients}], got {s.cohort_size}",
    )
    need(
        0 < s.check_in_rate <= 1,
        f"sampling.check_in_rate must lie in (0, 1], got {s.check_in_rate}",
    )


def _check_separation(cfg, need) -> None:
    s = cfg.sampling
    need(
        isinstance(s.min_separation, int) and 1 <= s.min_separation <= max(cfg.rounds, 1),
        f"sampling.min_separation b must be an integer in [1, rounds={cfg.rounds}], got"
        f" {s.min_separation!r}",
    )


def _check_groups(cfg, need) -> None:
    s, clients = cfg.sampling, cfg.data.num_clients
    _check_separation(cfg, need)
    need(
        not isinstance(s.min_separation, int) or s.min_separation <= clients,
        f"sampling.min_separation={s.min_separation} cyclic groups need at least as many"
        f" clients (data.num_clients={clients})",
    )


def _check_min_separation(cfg, need) -> None:
    _check_cohort(cfg, need)
    _check_separation(cfg, need)
    s = cfg.sampling
    need(
        isinstance(s.max_participations, int) and s.max_participations >= 0,
        "sampling.max_participations k must be an integer >= 0 (0 = no limit), got"
        f" {s.max_participations!r}",
    )


def _check_cyclic_poisson(cfg, need) -> None:
    _check_groups(cfg, need)
    need(0 < cfg.sampling.rate <= 1, f"sampling.rate q must lie in (0, 1], got {cfg.sampling.rate}")


COHORT = (10, "min_separation / single: the most clients a round takes (and the fixed denominator)")
CHECK_IN = (1.0, "min_separation / single: the chance a client checks in (is available) in a round")
SEPARATION = (
    1,
    "min_separation: the fewest rounds b between two of one client's; cyclic schemes: the number"
    " of groups",
)
KEYS = {
    "min_separation": {
        "cohort_size": COHORT,
        "min_separation": SEPARATION,
        "max_participations": (
            0,
            "min_separation: a client's most rounds k (0 = as many as b and the rounds allow)",
        ),
        "check_in_rate": CHECK_IN,
    },
    "single": {"cohort_size": COHORT, "check_in_rate": CHECK_IN},
    "cyclic": {"min_separation": SEPARATION},
    "cyclic_poisson": {
        "rate": (
            0.1,
            "cyclic_poisson: the probability that a member of the round's group takes part",
        ),
        "min_separation": SEPARATION,
    },
}
CHECKS = {
    "min_separation": _check_min_separation,
    "single": _check_cohort,
    "cyclic": _check_groups,
    "cyclic_poisson": _check_cyclic_poisson,
}
SUMMARIES = {
    "min_separation": "clients check in at random; one inside its b-round window or with k rounds"
    " is refused",
    "single": "each client at most once",
    "cyclic": "b fixed groups in turn",
    "cyclic_poisson": "b groups in turn, members with probability q: amplified BandMF",
}
for _scheme in SCHEMES:
    register_sampler(
        _scheme,
        build=build,
        keys=KEYS[_scheme],
        validate=CHECKS[_scheme],
        participation=True,
        summary=SUMMARIES[_scheme] + " (a participation scheme for correlated noise, dp.noise)",
    )
