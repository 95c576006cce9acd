"""The privacy tracker: composes, round by round, the releases the upload transforms declare.

Each round the transforms that ran declare their ``Release``s (``core.uploads``). Central releases
on the same sampled cohort form one Gaussian mechanism on the concatenated outputs: whitening each
part by its noise std, its L2 sensitivity is sqrt(sum_i z_i^-2), so the round is one subsampled
Gaussian with z_eff = (sum_i z_i^-2)^(-1/2) (exact, not a bound), composed by the accountant (RDP or
PLD from dp_accounting) with the sampling actually run. Local releases are per client: each
participating client's ledger composes a Gaussian of its own z_eff, without amplification by sampling
(sensitivity 2S: any two clipped updates differ by at most 2S), and the run's epsilon is the largest
client's. A release with ``formal=False`` makes the whole run's guarantee informal. Before each round
the budget rule decides whether it may run; clients whose own budget is spent are not sampled.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import ml_collections
import numpy as np

from fedjax_dp.core.uploads import Release
from fedjax_dp.privacy import gdp
from fedjax_dp.privacy.client_sampling import FixedSizeSampling, PoissonSampling
from fedjax_dp.privacy.accounting import ACCOUNTANTS, Accountant, RoundEvent, parse_rdp_orders
from fedjax_dp.privacy.budget import BudgetRule, ClientLedger
from fedjax_dp.privacy.report import PrivacyReport


def combine(z: np.ndarray) -> np.ndarray:
    """z_eff = (sum_i z_i^-2)^(-1/2) over axis 0 of Gaussian releases on the same data (0 where any is
    noiseless, inf where there is none)."""
    z = np.asarray(z, float)
    if z.shape[0] == 0:
        return np.full(z.shape[1:], np.inf)
    return np.where(np.any(z <= 0, axis=0), 0.0, np.sum(np.where(z > 0, z, 1.0) ** -2.0, axis=0) ** -0.5)


def combined_multiplier(releases: list[Release]) -> float:
    """``combine`` of the releases' (round-wide) multipliers."""
    return float(combine(np.array([r.noise_multiplier for r in releases])))


def _accounted(releases: list[Release]) -> list[Release]:
    """The releases the epsilon is composed from: the formal ones; where a locality has none, the
    non-formal ones' own claimed figures (a paper-mode CUAG run records the paper's claim, and the run
    is labelled ``formal: false`` because of them)."""
    formal = [r for r in releases if r.formal]
    return formal or [r for r in releases if r.noise_multiplier > 0]


def _declared(release: Release, relation: str) -> dict:
    """A release as ``privacy.json`` lists it: its neighbouring relation (so epsilons of different runs
    can be compared), per-client multipliers summarised."""
    z = release.client_multipliers
    return dataclasses.asdict(release) | {"neighboring_relation": relation,
        "client_multipliers": None if z is None else {"clients": len(z), "min": min(z), "max": max(z)}}


def ledger_settings(delta: float, client_budgets=None) -> ml_collections.ConfigDict:
    """The settings of a tracker whose releases are local (per-client ledgers, RDP for the rest): no
    run-wide budget rule; ``client_budgets`` (an epsilon at ``delta`` per client, or None) stop each
    client before its next participation would exceed its own."""
    return ml_collections.ConfigDict(dict(
        delta=delta, accountant="rdp", pld_discretization=1e-4, rdp_orders="", target_epsilon=0.0, max_delta=0.0,
        max_epsilon=0.0, client_epsilon_budget=client_budgets))


class PrivacyTracker:
    def __init__(self, releases_for: Callable[[int], list[Release]], dp_cfg,
                 sampler: PoissonSampling | FixedSizeSampling):
        """``sampler``: the one the loop draws cohorts with; each round's event is its ``round_event``."""
        self.releases_for, self.cfg, self.sampler = releases_for, dp_cfg, sampler
        fixed = isinstance(sampler, FixedSizeSampling)
        self.sampling, self.population = ("uniform" if fixed else "poisson"), sampler.num_clients
        self.cohort_size = sampler.cohort_size if fixed else 0
        self.rate = sampler.rate if not fixed else sampler.cohort_size / sampler.num_clients
        population, sampling = self.population, self.sampling
        first = releases_for(1)
        self.local = any(r.locality == "local" for r in first)
        self.rdp_orders = parse_rdp_orders(dp_cfg.get("rdp_orders", ""))
        self.accountants = {k: Accountant(k, dp_cfg.pld_discretization, self.rdp_orders) for k in ACCOUNTANTS}
        self.rule = BudgetRule(
            target_epsilon=dp_cfg.target_epsilon or None, max_delta=dp_cfg.max_delta or None,
            delta=dp_cfg.delta if dp_cfg.max_epsilon else None, max_epsilon=dp_cfg.max_epsilon or None)
        self.ledger = ClientLedger(population, dp_cfg.delta, dp_cfg.client_epsilon_budget or None,
                                   sensitivity_factor=2.0 if self.local else (2.0 if sampling == "uniform" else 1.0))
        self.rounds, self.noise_used, self.stopped_at = 0, [], None
        self.rates_used: list[float] = []
        self.mechanisms: dict[str, Release] = {}

    @property
    def private(self) -> bool:
        return all(r.formal for r in self.releases_for(1)) and not self._mixed(self.releases_for(1))

    def _mixed(self, releases) -> bool:
        """Local noise with a central release beside it: the server saw that part in the clear."""
        return self.local and any(r.locality != "local" for r in releases)

    def multiplier(self, t: int) -> float:
        """The round's z_eff: of the local releases under local noise, else of the central ones."""
        locality = "local" if self.local else "central"
        return combined_multiplier(_accounted([r for r in self.releases_for(t) if r.locality == locality]))

    def event(self, t: int) -> RoundEvent:
        z = self.multiplier(t)
        if self.sampling == "uniform":  # m drawn from the clients still eligible, not from all K
            eligible = int(self.eligible(t).sum())
            return self.sampler.round_event(z, population=max(eligible, self.cohort_size))
        return self.sampler.round_event(z)

    def allows(self, t: int) -> bool:
        """Checked before round t, round t included: False once the budget would be exceeded. Under
        local noise the rule is applied to the largest per-client epsilon after the round, as if every
        client took part in it (the cohort is not drawn yet)."""
        if self.local:  # the largest per-client mu after the round
            mu_squared = self.ledger.mu_squared_after(self.client_multipliers(t, np.arange(self.population)))
            return self.rule.allows_gdp(float(np.sqrt(mu_squared.max())))
        return self.rule.allows(self.accountants[self.cfg.accountant], self.event(t))

    def client_multipliers(self, t: int, client_ids) -> np.ndarray:
        """Each client's z_eff in round t: its own multiplier under every local release (heterogeneous
        noise) combined as ``combined_multiplier`` does; the round's z for every client otherwise."""
        client_ids = np.asarray(client_ids, dtype=np.int64)
        if not self.local:
            return np.full(len(client_ids), self.multiplier(t))
        per_release = [r.multipliers_for(client_ids)
                       for r in _accounted([r for r in self.releases_for(t) if r.locality == "local"])]
        return combine(np.array(per_release).reshape(len(per_release), len(client_ids)))

    def client_inputs(self, t: int, client_ids, slots: int) -> dict:
        """Per-slot values the cohort carries for this tracker (none: the chain's transforms read theirs)."""
        return {}

    def eligible(self, t: int) -> np.ndarray:
        return self.ledger.eligible(self.client_multipliers(t, np.arange(self.population)))

    def record(self, t: int, client_ids: np.ndarray) -> None:
        event = self.event(t)
        for acc in self.accountants.values():
            acc.compose(event)
        self.ledger.record(client_ids, self.client_multipliers(t, client_ids))
        self.rounds += 1
        self.noise_used.append(event.noise_multiplier)
        self.rates_used.append(event.cohort_size / event.population if self.sampling == "uniform" else self.rate)
        self.mechanisms.update({r.mechanism: r for r in self.releases_for(t)})

    def composed(self) -> dict:
        """What has been composed so far, as a checkpoint records it and a resume's replay must reproduce."""
        return {"rounds": self.rounds, "noise_multipliers": [float(z) for z in self.noise_used],
                "sampling_rates": [float(q) for q in self.rates_used],
                "participations": int(self.ledger.participations.sum()),
                "epsilon": float(self.epsilon()) if self.rounds else 0.0}

    def epsilon(self) -> float:
        if self.local:
            eps = self.ledger.epsilons()
            return float(eps.max()) if len(eps) else 0.0
        return self.accountants[self.cfg.accountant].epsilon(self.cfg.delta)

    def participant_epsilons(self) -> dict:
        """The spread of the per-client epsilons over the clients that took part (local releases)."""
        eps = self.ledger.epsilons()[self.ledger.participations > 0]
        if not len(eps):
            return {}
        return {"per_client_min": float(eps.min()), "per_client_median": float(np.median(eps)),
                "per_client_max": float(eps.max()), "clients_participated": int(len(eps))}

    def report(self) -> PrivacyReport:
        delta = self.cfg.delta
        epsilons = {}
        if self.local:
            epsilons["per_client_gdp_exact_max"] = self.epsilon()
        else:
            for kind, acc in self.accountants.items():
                epsilons[kind] = acc.epsilon(delta) if self.rounds else 0.0
            z = self.noise_used
            if self.rounds and min(z) > 0 and self.sampling == "poisson":
                mu = math.sqrt(sum(gdp.mu_clt(self.rate, zt, 1) ** 2 for zt in z))
                epsilons["gdp_clt_approximation"] = gdp.epsilon_from_mu(mu, delta)
        releases = list(self.mechanisms.values()) or self.releases_for(1)
        notes = [f"{r.mechanism}: {r.note}" for r in releases if r.note]
        notes += [f"{r.mechanism}: NO formal DP guarantee" for r in releases if not r.formal]
        if self._mixed(releases):
            notes.append("local noise with a central release beside it (" + ", ".join(
                r.mechanism for r in releases if r.locality != "local") + "): the server sees that part of each "
                "client's upload before noising it, so it is not locally private: NO formal guarantee")
        if self.sampling == "uniform" and not self.local:
            notes.append("fixed-size sampling: replace-one neighbours, sensitivity 2S; RDP with the dp_accounting "
                         "replace-one normalisation corrected (google/differential-privacy#378); PLD by the Dong-Roth-Su "
                         "reduction (a Poisson-subsampled Gaussian of rate m/K and multiplier z/2)")
        if self.local:
            notes.append("local noise: per-client Gaussian composition of its own participations (sensitivity 2S), "
                         "no amplification by sampling")
        if any(r.locality == "central" for r in releases if r.formal) and not self.local:
            notes.append("central releases on the same cohort composed as one Gaussian, z_eff = (sum_i z_i^-2)^-1/2")
        if not self.private and (self.rule.max_epsilon is not None or self.rule.target_epsilon is not None):
            notes.append("the budget rule was applied to the formal part of the releases only; the run as a whole "
                         "has no formal guarantee")
        if self.stopped_at is not None:
            notes.append(f"training stopped before round {self.stopped_at}: the budget would have been exceeded")
        epsilon = self.epsilon() if self.rounds else 0.0
        relation = "replace-one" if (self.sampling == "uniform" or self.local) else "add/remove-one"
        noiseless = any(z <= 0 for z in self.noise_used) or (self.rounds and not math.isfinite(epsilon))
        if noiseless:
            notes.append("a round ran without noise (z = 0): nothing is private")
        rates = sorted(set(self.rates_used)) or [self.cohort_size / self.population if self.sampling == "uniform"
                                                 else self.rate]
        return PrivacyReport(
            mechanism="; ".join(f"{r.mechanism} [{r.locality}, z={r.noise_multiplier:.6g}, bound {r.bound}]"
                                for r in releases),
            unit="client", neighboring_relation=relation,
            sampling="fixed-size without replacement" if self.sampling == "uniform" else "Poisson",
            noise_mode="local" if self.local else "central", accountant="per-client GDP ledger" if self.local else self.cfg.accountant,
            delta=delta, epsilon=epsilon, epsilons=epsilons, rounds=self.rounds,
            noise_multipliers=sorted(set(self.noise_used)), sampling_rates=rates,
            formal=bool(self.private and not noiseless), notes=notes,
            releases=[_declared(r, relation) for r in releases],
            accounting={"pld_discretization": self.cfg.pld_discretization, "rdp_orders": list(self.rdp_orders)})
