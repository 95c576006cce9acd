"""The ledgers behind the one privacy tracker (issue 73): one small protocol, implemented for
central releases (an accountant over the sampler's round events) and for local ones (each client's
own exact GDP ledger); the example-level ledgers of local DP-SGD implement it too
(``example_accounting``).

A ledger is told, before round t, the releases that round will run (``eligible``: which clients may
take part; ``allows``: whether the round may run at all), and after it the releases that ran and who
took part (``record``). It knows nothing of configs: the settings (delta, accountant, budgets) come
as a ``PrivacySettings``, the mechanisms as typed ``Release``s, the sampling as the sampler that
drew the cohort.

Central releases on the same sampled cohort form one Gaussian mechanism on the concatenated outputs:
whitening each part by its noise std, its L2 sensitivity is sqrt(sum_i z_i^-2), so the round is one
subsampled Gaussian with z_eff = (sum_i z_i^-2)^(-1/2) (exact, not a bound), composed by
dp_accounting (RDP and PLD) under the sampler's event. Local releases are per client: each
participating client's ledger composes the Gaussian events of its releases (stated for replace-one:
sensitivity 2S), without amplification by sampling, and the run's epsilon is the largest client's.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from fedjax_dp.core.release import Release
from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.accounting.accountant import ACCOUNTANTS, Accountant, RoundEvent
from fedjax_dp.privacy.ledgers.budget import BudgetRule, ClientLedger
from fedjax_dp.privacy.accounting.client_sampling import FixedSizeSampling, PoissonSampling
from fedjax_dp.privacy.settings import PrivacySettings


class Ledger(Protocol):
    """What the tracker asks of a ledger (module docstring)."""

    local: bool

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray: ...

    def allows(self, t: int, releases: list[Release]) -> bool: ...

    def record(self, t: int, client_ids, releases: list[Release]) -> None: ...

    def epsilon(self) -> float: ...

    def composed(self) -> dict: ...

    def describe(self) -> dict: ...


def combine(z: np.ndarray) -> np.ndarray:
    """z_eff = (sum_i z_i^-2)^(-1/2) over axis 0 of Gaussian releases on the same data (0 where any
    is noiseless, inf where there is none)."""
    z = np.asarray(z, float)
    if z.shape[0] == 0:
        return np.full(z.shape[1:], np.inf)
    return np.where(
        np.any(z <= 0, axis=0), 0.0, np.sum(np.where(z > 0, z, 1.0) ** -2.0, axis=0) ** -0.5
    )


def accounted(releases: list[Release]) -> list[Release]:
    """The releases an epsilon is composed from: the formal ones; where there are none, the
    non-formal ones that add noise (their own figures: a paper-mode run records what its paper
    computes, ``formal: false``)."""
    formal = [r for r in releases if r.formal]
    return formal or [r for r in releases if r.noise_multiplier > 0]


def budget_rule(settings: PrivacySettings) -> BudgetRule:
    return BudgetRule(
        target_epsilon=settings.stop_epsilon or None,
        max_delta=settings.stop_max_delta or None,
        delta=settings.delta if settings.max_epsilon else None,
        max_epsilon=settings.max_epsilon or None,
    )


class CentralLedger:
    """Central releases composed per round under the sampler's event (module docstring), a run-wide
    budget rule, and per-client GDP ledgers for per-client budgets (a conservative bound under
    central noise: no amplification by sampling; replace-one's 2S under fixed-size sampling)."""

    local = False

    def __init__(self, sampler: PoissonSampling | FixedSizeSampling, settings: PrivacySettings):
        self.sampler, self.settings = sampler, settings
        self.fixed = isinstance(sampler, FixedSizeSampling)
        self.accountants = {
            k: Accountant(k, settings.pld_discretization, settings.rdp_orders) for k in ACCOUNTANTS
        }
        self.rule = budget_rule(settings)
        self.clients = ClientLedger(
            sampler.num_clients,
            settings.delta,
            settings.client_epsilon_budget or None,
            sensitivity_factor=2.0 if self.fixed else 1.0,
        )
        self.noise_used: list[float] = []
        self.rates_used: list[float] = []

    @staticmethod
    def multiplier(releases: list[Release]) -> float:
        """The round's z_eff over the central releases (each stated for add/remove-one, sensitivity
        S)."""
        central = [r for r in releases if r.locality == "central"]
        if any(r.cumulative is not None for r in releases):
            raise ValueError(
                "a correlated-noise stream is not composed per round: it needs the correlated"
                " ledger (privacy.ledgers.correlated)"
            )
        for r in central:
            if r.sensitivity_factor != 1.0:
                raise ValueError(
                    f"central release {r.mechanism!r} is stated for replace-one; the sampler"
                    " converts add/remove-one releases itself (core.release)"
                )
        return float(combine(np.array([r.noise_multiplier for r in accounted(central)])))

    def event(self, t: int, releases: list[Release]) -> RoundEvent:
        z = self.multiplier(releases)
        if self.fixed:  # m drawn from the clients still eligible, not from all K
            eligible = int(self.eligible(t, releases).sum())
            return self.sampler.round_event(z, population=max(eligible, self.sampler.cohort_size))
        return self.sampler.round_event(z, t)

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray:
        return self.clients.eligible(self.multiplier(releases))

    def allows(self, t: int, releases: list[Release]) -> bool:
        return self.rule.allows(self.accountants[self.settings.accountant], self.event(t, releases))

    def record(self, t: int, client_ids, releases: list[Release]) -> None:
        event = self.event(t, releases)
        for accountant in self.accountants.values():
            accountant.compose(event)
        self.clients.record(client_ids, event.noise_multiplier)
        self.noise_used.append(event.noise_multiplier)
        self.rates_used.append(
            event.cohort_size / event.population if self.fixed else event.sampling_rate
        )

    def epsilon(self) -> float:
        return (
            self.accountants[self.settings.accountant].epsilon(self.settings.delta)
            if self.noise_used
            else 0.0
        )

    def composed(self) -> dict:
        return {
            "rounds": len(self.noise_used),
            "noise_multipliers": [float(z) for z in self.noise_used],
            "sampling_rates": [float(q) for q in self.rates_used],
            "participations": int(self.clients.participations.sum()),
            "epsilon": float(self.epsilon()),
        }

    def describe(self) -> dict:
        """The report's fields for what this ledger composed."""
        delta, rounds = self.settings.delta, len(self.noise_used)
        epsilons = {
            kind: acc.epsilon(delta) if rounds else 0.0 for kind, acc in self.accountants.items()
        }
        z = self.noise_used
        if rounds and min(z) > 0 and not self.fixed:
            mu = math.sqrt(sum(gdp.mu_clt(qt, zt, 1) ** 2 for qt, zt in zip(self.rates_used, z)))
            epsilons["gdp_clt_approximation"] = gdp.epsilon_from_mu(mu, delta)
        notes = []
        if self.fixed:
            notes.append(
                "fixed-size sampling: replace-one neighbours, sensitivity 2S; RDP with the"
                " dp_accounting replace-one normalisation corrected"
                " (google/differential-privacy#378); PLD by the Dong-Roth-Su reduction (a"
                " Poisson-subsampled Gaussian of rate m/K and multiplier z/2)"
            )
        rates = sorted(set(self.rates_used)) or [
            self.sampler.cohort_size / self.sampler.num_clients if self.fixed else self.sampler.rate
        ]
        return {
            "neighboring_relation": "replace-one" if self.fixed else "add/remove-one",
            "sampling": "fixed-size without replacement" if self.fixed else "Poisson",
            "noise_mode": "central",
            "accountant": self.settings.accountant,
            "epsilons": epsilons,
            "notes": notes,
            "noise_multipliers": sorted(set(self.noise_used)),
            "sampling_rates": rates,
        }


class LocalLedger:
    """Local releases: each participating client's exact GDP ledger composes its releases' Gaussian
    events (stated for replace-one), a client whose next participation would pass its budget is no
    longer sampled, and the run-wide rule applies to the largest client's epsilon."""

    local = True

    def __init__(
        self,
        sampler: PoissonSampling | FixedSizeSampling,
        settings: PrivacySettings,
        client_budgets: tuple | None = None,
    ):
        self.sampler, self.settings = sampler, settings
        budgets = np.full(sampler.num_clients, np.inf)
        if client_budgets is not None:
            budgets = np.minimum(budgets, np.asarray(client_budgets, float))
        if settings.client_epsilon_budget:
            budgets = np.minimum(budgets, settings.client_epsilon_budget)
        self.clients = ClientLedger(
            sampler.num_clients,
            settings.delta,
            None if np.all(np.isinf(budgets)) else budgets,
            sensitivity_factor=1.0,
        )
        self.rule = budget_rule(settings)
        self.noise_used: list[float] = []
        self.rates_used: list[float] = []

    @staticmethod
    def client_multipliers(releases: list[Release], client_ids) -> np.ndarray:
        """Each client's combined multiplier relative to its releases' sensitivity (what its GDP
        ledger composes)."""
        client_ids = np.asarray(client_ids, dtype=np.int64)
        per_release = [
            r.event_multipliers_for(client_ids)
            for r in accounted([r for r in releases if r.locality == "local"])
        ]
        return combine(np.array(per_release).reshape(len(per_release), len(client_ids)))

    def _everyone(self, releases) -> np.ndarray:
        return self.client_multipliers(releases, np.arange(self.sampler.num_clients))

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray:
        return self.clients.eligible(self._everyone(releases))

    def allows(self, t: int, releases: list[Release]) -> bool:
        """The rule on the largest per-client mu after the round, as if every client took part in it
        (the cohort is not drawn yet)."""
        return self.rule.allows_gdp(
            float(np.sqrt(self.clients.mu_squared_after(self._everyone(releases)).max()))
        )

    def record(self, t: int, client_ids, releases: list[Release]) -> None:
        z = self.client_multipliers(releases, client_ids)
        self.clients.record(client_ids, z)
        local = accounted([r for r in releases if r.locality == "local"])
        self.noise_used.append(float(combine(np.array([[r.noise_multiplier] for r in local]))[0]))
        fixed = isinstance(self.sampler, FixedSizeSampling)
        self.rates_used.append(
            self.sampler.cohort_size / self.sampler.num_clients
            if fixed
            else self.sampler.rate_at(t)
        )

    def epsilons(self) -> np.ndarray:
        return self.clients.epsilons()

    def epsilon(self) -> float:
        eps = self.clients.epsilons()
        return float(eps.max()) if len(eps) else 0.0

    def participant_epsilons(self) -> dict:
        """The spread of the per-client epsilons over the clients that took part."""
        eps = self.clients.epsilons()[self.clients.participations > 0]
        if not len(eps):
            return {}
        return {
            "per_client_min": float(eps.min()),
            "per_client_median": float(np.median(eps)),
            "per_client_max": float(eps.max()),
            "clients_participated": int(len(eps)),
        }

    def composed(self) -> dict:
        return {
            "rounds": len(self.noise_used),
            "noise_multipliers": [float(z) for z in self.noise_used],
            "sampling_rates": [float(q) for q in self.rates_used],
            "participations": int(self.clients.participations.sum()),
            "epsilon": float(self.epsilon()),
        }

    def describe(self) -> dict:
        fixed = isinstance(self.sampler, FixedSizeSampling)
        all_eps = self.clients.epsilons()
        return {
            "neighboring_relation": "replace-one",
            "noise_mode": "local",
            "sampling": "fixed-size without replacement" if fixed else "Poisson",
            "accountant": "per-client GDP ledger",
            "epsilons": {"per_client_gdp_exact_max": self.epsilon(), **self.participant_epsilons()},
            "notes": [
                "local noise: per-client Gaussian composition of its own participations"
                " (sensitivity 2S), no amplification by sampling"
            ],
            "noise_multipliers": sorted(set(self.noise_used)),
            "sampling_rates": (
                sorted(set(self.rates_used))
                or [
                    self.sampler.cohort_size / self.sampler.num_clients
                    if fixed
                    else self.sampler.rate
                ]
            ),
            "accounting": {
                "per_client_epsilon": [float(e) for e in all_eps],
                "per_client_participations": [int(k) for k in self.clients.participations],
            },
        }
