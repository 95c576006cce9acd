"""The ledgers behind the one privacy tracker: one small protocol (``Ledger``), implemented for
central releases (an accountant over the sampler's round events), for local ones (each client's own
exact Gaussian-DP book), for correlated streams (``correlated``) and for example-level DP in local
steps (``example_ledger``).

A ledger is told, before round t, the releases that round will run (``eligible``: which clients
may take part; ``allows``: whether the round may run at all), and after it the releases that ran
and who took part (``record``). It knows nothing of configs: the settings (delta, accountant,
budgets) come as a ``PrivacySettings``, the mechanisms as typed ``Release``s, the sampling as the
sampler that drew the cohort.

Central releases compose as events: the round's mechanism is the releases' ``dp_accounting`` events
on the same cohort (``round_mechanism``), wrapped by the sampler in its own event
(``sampler.round_event``) and composed by dp_accounting's RDP and PLD accountants. Gaussian
releases on the same cohort take a fast path, exact and not a bound: whitening each part by its
noise std, the concatenated outputs are one Gaussian of L2 sensitivity sqrt(sum_i z_i^-2), so the
round is one Gaussian of z_eff = (sum_i z_i^-2)^(-1/2) (dp_accounting's RDP accountant does the same
for a composition inside a sampled event; its PLD accountant cannot compose one). Local releases are
per client: each participating client's book composes the Gaussian events of its releases (stated
for replace-one: sensitivity 2S) exactly, without amplification by sampling, and the run's epsilon
is the largest client's. An event a ledger cannot compose is refused before the run (``check``),
naming the mechanism, the event and what could compose it.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import dp_accounting
import numpy as np

from fedjax_dp.core.release import Release
from fedjax_dp.privacy.accounting import calibration, gdp
from fedjax_dp.privacy.accounting.accountant import (
    ACCOUNTANTS,
    PLD_CEILING,
    GAUSSIAN_LIKE,
    Accountant,
    RoundEvent,
    UnsupportedEventError,
    multiplier_of,
    supports,
)
from fedjax_dp.privacy.ledgers.budget import BudgetRule, ClientBook
from fedjax_dp.privacy.settings import PrivacySettings


class Ledger(Protocol):
    """What the tracker asks of a ledger (module docstring). ``LedgerDefaults`` gives the optional
    members their defaults."""

    local: bool  # each client's own guarantee (no amplification by sampling)
    formal: bool  # whether the ledger's own accounting is covered by a proof
    rule: BudgetRule | None  # the run-wide budget rule it applies, if any

    def check(self, releases: list[Release]) -> None: ...

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray: ...

    def allows(self, t: int, releases: list[Release]) -> bool: ...

    def record(self, t: int, client_ids, releases: list[Release]) -> None: ...

    def epsilon(self) -> float: ...

    def epsilons(self) -> np.ndarray | None: ...

    def step_multipliers(self, t: int, client_ids, slots: int) -> np.ndarray | None: ...

    def composed(self) -> dict: ...

    def describe(self) -> dict: ...


class LedgerDefaults:
    """The optional members of ``Ledger``: formal, no run-wide rule, nothing to refuse, no
    per-client figures, no step noise to choose."""

    local = False
    formal = True
    rule: BudgetRule | None = None

    def check(self, releases: list[Release]) -> None:
        return None

    def epsilons(self) -> np.ndarray | None:
        return None

    def step_multipliers(self, t: int, client_ids, slots: int) -> np.ndarray | None:
        return None


ON_THE_SUM = ("central", "distributed")
"""Localities whose noise is on the cohort's sum, composed by the central ledger."""


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


def round_mechanism(events: list[dp_accounting.DpEvent], fast: bool = True):
    """One event for releases on the same cohort: the Gaussian of z_eff where every one is Gaussian
    (``fast``; module docstring), the one event, or their composition."""
    if not events:
        return dp_accounting.NonPrivateDpEvent()
    if fast and all(isinstance(e, GAUSSIAN_LIKE) for e in events):
        return _gaussian(float(combine(np.array([multiplier_of(e) for e in events]))))
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(list(events))


def _gaussian(z: float) -> dp_accounting.DpEvent:
    return dp_accounting.GaussianDpEvent(z) if z > 0 else dp_accounting.NonPrivateDpEvent()


def budget_rule(settings: PrivacySettings) -> BudgetRule:
    return BudgetRule(
        target_epsilon=settings.stop_epsilon or None,
        max_delta=settings.stop_max_delta or None,
        delta=settings.delta if settings.max_epsilon else None,
        max_epsilon=settings.max_epsilon or None,
    )


class CentralLedger(LedgerDefaults):
    """Central releases composed as events per round under the sampler's event (module docstring),
    a run-wide budget rule, and per-client Gaussian-DP books for per-client budgets (a conservative
    bound under central noise: no amplification by sampling; replace-one's 2S under fixed-size
    sampling)."""

    def __init__(self, sampler, settings: PrivacySettings):
        self.sampler, self.settings = sampler, settings
        self.accountants = {
            k: Accountant(k, settings.pld_discretization, settings.rdp_orders) for k in ACCOUNTANTS
        }
        self.rule = budget_rule(settings)
        self.clients = ClientBook(
            sampler.num_clients,
            settings.delta,
            settings.client_epsilon_budget or None,
            sensitivity_factor=2.0 if sampler.relation == "replace-one" else 1.0,
        )
        self.events_used: list[RoundEvent] = []
        self.last_releases: list[Release] = []

    @staticmethod
    def mechanism(releases: list[Release]) -> dp_accounting.DpEvent:
        """The round's mechanism on the cohort: its central releases' events (each stated for
        add/remove-one), combined (``round_mechanism``)."""
        if any(r.stream for r in releases):
            raise ValueError(
                "a correlated-noise stream is not composed per round: it needs the correlated"
                " ledger (privacy.ledgers.correlated)"
            )
        central = [r for r in releases if r.locality in ON_THE_SUM]
        for r in central:
            if r.sensitivity_factor != 1.0:
                raise ValueError(
                    f"central release {r.mechanism!r} is stated for replace-one; the sampler"
                    " converts add/remove-one releases itself (core.release)"
                )
        return round_mechanism([r.event for r in accounted(central)])

    def event(self, t: int, releases: list[Release]) -> RoundEvent:
        eligible = int(self.eligible(t, releases).sum()) if self._gaussian(releases) else None
        return self.sampler.round_event(self.mechanism(releases), t, eligible)

    def _gaussian(self, releases) -> bool:
        return isinstance(self.mechanism(releases), GAUSSIAN_LIKE)

    def check(self, releases: list[Release]) -> None:
        """Refuses, before the run, a round whose event the chosen accountant cannot compose, or a
        per-client budget over a mechanism the per-client Gaussian-DP books cannot hold."""
        event = self.sampler.round_event(self.mechanism(releases), 1, None)
        kind = self.settings.accountant
        if not supports(event, kind):
            able = [k for k in ACCOUNTANTS if k != kind and supports(event, k)]
            raise UnsupportedEventError(
                f"{_named(releases)}: privacy.accountant={kind!r} cannot compose"
                f" {event.dp_event(kind)} (the sampler's event of {event.mechanism});"
                f" {_could(able)}"
            )
        if self.settings.client_epsilon_budget and not event.gaussian:
            raise UnsupportedEventError(
                f"{_named(releases)}: privacy.client_epsilon_budget holds each client to a"
                f" Gaussian-DP book, which cannot compose {event.mechanism}; drop the per-client"
                " budget or use a Gaussian mechanism"
            )

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray:
        mechanism = self.mechanism(releases)
        if not isinstance(mechanism, GAUSSIAN_LIKE):  # no per-client book (``check``)
            return np.ones(self.sampler.num_clients, bool)
        return self.clients.eligible(multiplier_of(mechanism))

    def allows(self, t: int, releases: list[Release]) -> bool:
        return self.rule.allows(self.accountants[self.settings.accountant], self.event(t, releases))

    def record(self, t: int, client_ids, releases: list[Release]) -> None:
        event = self.event(t, releases)
        for kind, accountant in self.accountants.items():
            if kind == self.settings.accountant or supports(event, kind):
                accountant.compose(event)
        if event.gaussian:
            self.clients.record(client_ids, event.noise_multiplier)
        self.events_used.append(event)
        self.last_releases = list(releases)

    def epsilon(self) -> float:
        if not self.events_used:
            return 0.0
        return self.accountants[self.settings.accountant].epsilon(self.settings.delta)

    def calibrate(self, releases_of: Callable, rounds: int, target_epsilon: float) -> float:
        """The least noise parameter z whose ``rounds`` rounds of ``releases_of(z)`` spend
        ``target_epsilon`` (``calibration.calibrate`` over the events this ledger composes)."""
        if len(getattr(self.sampler, "schedule", ())) > 1:
            raise ValueError(
                "calibrating one noise multiplier to a sampling-rate schedule is not supported:"
                " set the noise multiplier (the accountant composes each round at its own rate)"
            )

        def schedule_of(z):
            return [(self.sampler.round_event(self.mechanism(releases_of(z)), 1, None), rounds)]

        s = self.settings
        return calibration.calibrate(schedule_of, target_epsilon, s.delta, s.accountant)

    @property
    def noise_used(self) -> list[float]:
        """Each round's Gaussian multiplier (the non-Gaussian rounds are named in ``describe``)."""
        return [e.noise_multiplier for e in self.events_used if e.gaussian]

    def composed(self) -> dict:
        return {
            "rounds": len(self.events_used),
            "noise_multipliers": [float(z) for z in self.noise_used],
            "sampling_rates": [float(e.rate) for e in self.events_used],
            "participations": int(self.clients.participations.sum()),
            "epsilon": float(self.epsilon()),
        }

    def describe(self) -> dict:
        """The report's fields for what this ledger composed."""
        delta, events = self.settings.delta, self.events_used
        epsilons = {
            kind: (acc.epsilon(delta) if events else 0.0)
            for kind, acc in self.accountants.items()
            if not events or all(supports(e, kind) for e in events)
        }
        z, rates = self.noise_used, [e.rate for e in events]
        if events and all(e.gaussian and e.sampling == "poisson" for e in events) and min(z) > 0:
            mu = math.sqrt(sum(gdp.mu_clt(qt, zt, 1) ** 2 for qt, zt in zip(rates, z)))
            # a tiny z's CLT mu is inf (``gdp.mu_clt``): so is its epsilon
            epsilons["gdp_clt_approximation"] = (
                gdp.epsilon_from_mu(mu, delta) if math.isfinite(mu) else math.inf
            )
        notes = list(self.sampler.accounting_notes())
        if "pld" in epsilons and self.accountants["pld"].pld_replaced:
            notes.append(
                f"the PLD figure is RDP's: past RDP epsilon {PLD_CEILING:g} the PLD is not built"
                " (its support would not fit in memory; accounting.PLD_CEILING)"
            )
        skipped = [k for k in ACCOUNTANTS if k not in epsilons]
        if skipped:
            notes.append(f"the {' and '.join(skipped)} accountant cannot compose these events")
        other = sorted({str(e.mechanism) for e in events if not e.gaussian})
        accounting = {"round_mechanisms": other} if other else {}
        distributed = any(r.locality == "distributed" for r in self.last_releases)
        return {
            "neighboring_relation": self.sampler.relation,
            "sampling": self.sampler.describe(),
            "noise_mode": "distributed (simulated secure aggregation)"
            if distributed
            else "central",
            "accountant": self.settings.accountant,
            "epsilons": epsilons,
            "notes": notes,
            "noise_multipliers": sorted(set(z)),
            "sampling_rates": sorted(set(rates)) or [self.sampler.rate_at(1)],
            "accounting": accounting,
        }


class LocalLedger(LedgerDefaults):
    """Local releases: each participating client's exact Gaussian-DP book composes its releases'
    Gaussian events (stated for replace-one), a client whose next participation would pass its
    budget is no longer sampled, and the run-wide rule applies to the largest client's epsilon."""

    local = True

    def __init__(self, sampler, settings: PrivacySettings, client_budgets: tuple | None = None):
        self.sampler, self.settings = sampler, settings
        budgets = np.full(sampler.num_clients, np.inf)
        if client_budgets is not None:
            budgets = np.minimum(budgets, np.asarray(client_budgets, float))
        if settings.client_epsilon_budget:
            budgets = np.minimum(budgets, settings.client_epsilon_budget)
        self.clients = ClientBook(
            sampler.num_clients,
            settings.delta,
            None if np.all(np.isinf(budgets)) else budgets,
            sensitivity_factor=1.0,
        )
        self.rule = budget_rule(settings)
        self.noise_used: list[float] = []
        self.rates_used: list[float] = []

    @staticmethod
    def _local(releases: list[Release]) -> list[Release]:
        return accounted([r for r in releases if r.locality == "local"])

    def check(self, releases: list[Release]) -> None:
        """Refuses a local release whose event the per-client Gaussian-DP books cannot compose."""
        for r in self._local(releases):
            if not isinstance(r.event, GAUSSIAN_LIKE):
                raise UnsupportedEventError(
                    f"local release {r.mechanism!r} declares {r.event}: each client's privacy"
                    " is composed by its own Gaussian-DP book, which composes Gaussian events"
                    " only; no accountant here composes it per client"
                )

    @classmethod
    def client_multipliers(cls, releases: list[Release], client_ids) -> np.ndarray:
        """Each client's combined multiplier relative to its releases' sensitivity (what its book
        composes: each release's Gaussian event, per client where the noise differs per client)."""
        client_ids = np.asarray(client_ids, dtype=np.int64)
        per_release = [r.event_multipliers_for(client_ids) for r in cls._local(releases)]
        return combine(np.array(per_release).reshape(len(per_release), len(client_ids)))

    def _everyone(self, releases) -> np.ndarray:
        return self.client_multipliers(releases, np.arange(self.sampler.num_clients))

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray:
        return self.clients.eligible(self._everyone(releases))

    def allows(self, t: int, releases: list[Release]) -> bool:
        """The rule on the largest per-client mu after the round, as if every client took part in
        it (the cohort is not drawn yet)."""
        return self.rule.allows_gdp(
            float(np.sqrt(self.clients.mu_squared_after(self._everyone(releases)).max()))
        )

    def record(self, t: int, client_ids, releases: list[Release]) -> None:
        self.clients.record(client_ids, self.client_multipliers(releases, client_ids))
        local = self._local(releases)
        self.noise_used.append(float(combine(np.array([[r.noise_multiplier] for r in local]))[0]))
        self.rates_used.append(self.sampler.rate_at(t))

    def calibrate(self, releases_of: Callable, rounds: int, target_epsilon: float) -> float:
        """The z whose ``rounds`` participations of a client spend ``target_epsilon`` in its book:
        mu = sqrt(T) / z_event(z), solved exactly (``calibration.gdp_multiplier``); z_event is the
        releases' combined event multiplier, linear in z."""
        unit = float(self.client_multipliers(releases_of(1.0), [0])[0])
        twice = float(self.client_multipliers(releases_of(2.0), [0])[0])
        if not (unit > 0 and math.isclose(twice, 2 * unit, rel_tol=1e-9)):
            raise ValueError(
                f"local releases whose event multiplier is not proportional to z ({unit} at z = 1,"
                f" {twice} at z = 2) cannot be calibrated in closed form"
            )
        return calibration.gdp_multiplier(
            math.sqrt(rounds) / unit, target_epsilon, self.settings.delta
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
        all_eps = self.clients.epsilons()
        return {
            "neighboring_relation": "replace-one",
            "noise_mode": "local",
            "sampling": self.sampler.describe(),
            "accountant": "per-client GDP book",
            "epsilons": {"per_client_gdp_exact_max": self.epsilon(), **self.participant_epsilons()},
            "notes": [
                "local noise: per-client Gaussian composition of its own participations"
                " (sensitivity 2S), no amplification by sampling"
            ],
            "noise_multipliers": sorted(set(self.noise_used)),
            "sampling_rates": sorted(set(self.rates_used)) or [self.sampler.rate_at(1)],
            "accounting": {
                "per_client_epsilon": [float(e) for e in all_eps],
                "per_client_participations": [int(k) for k in self.clients.participations],
            },
        }


def _named(releases: list[Release]) -> str:
    return "release " + ", ".join(repr(r.mechanism) for r in releases if r.noise_multiplier != 0)


def _could(able: list[str]) -> str:
    if able:
        return f"privacy.accountant={able[0]!r} can"
    return "no accountant here composes it (register its RDP or PLD: privacy.accounting.events)"
