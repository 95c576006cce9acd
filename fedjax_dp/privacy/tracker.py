"""The privacy tracker: one for every run. It composes, round by round, the typed
releases the round returns (``core.release``) on a ledger (``privacy.ledgers.client_level``:
central, local, or the example-level ledgers of local DP-SGD), applies the budget rules before each
round, adds the papers' claims (``Claim``) beside the accounted epsilon, and writes the report. It
reads no config: its settings are a ``PrivacySettings``.

A release with ``formal=False`` makes the whole run's guarantee informal; local noise with a central
release beside it is not locally private (the server saw that part in the clear). Before each round
``allows`` says whether it may run and ``eligible`` which clients may take part; clients whose own
budget is spent are not sampled.
"""

from __future__ import annotations

import math

import numpy as np

from typing import Callable

from fedjax_dp.core.release import Release
from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.ledgers.client_level import CentralLedger, Ledger, LocalLedger
from fedjax_dp.privacy.ledgers.correlated import CorrelatedLedger
from fedjax_dp.privacy.report import PrivacyReport
from fedjax_dp.privacy.settings import PrivacySettings


def ledger_for(releases: list[Release], settings: PrivacySettings, sampler) -> Ledger:
    """The one dispatcher: how a run is accounted, from its releases and its sampler alone. The
    correlated ledger where a release is a correlated stream (on the participation sampler that
    enforces its scheme), a local ledger where any release is local (held to the per-client budgets
    a release states), else a central one."""
    if any(r.stream for r in releases):
        if not hasattr(sampler, "participation"):
            raise ValueError(
                "correlated noise is calibrated for a participation scheme that only a"
                " participation sampler enforces (sampling.method: min_separation, single, cyclic,"
                " cyclic_poisson)"
            )
        return CorrelatedLedger(sampler, settings)
    if any(r.locality == "local" for r in releases):
        budgets = next((r.client_budgets for r in releases if r.client_budgets is not None), None)
        return LocalLedger(sampler, settings, budgets)
    return CentralLedger(sampler, settings)


def tracker_for(releases: list[Release], settings: PrivacySettings, sampler) -> "PrivacyTracker":
    """The tracker of a run whose rounds release ``releases`` (round 1's), on ``ledger_for``'s
    ledger; a release that ledger cannot compose is refused here, before the run
    (``UnsupportedEventError``)."""
    ledger = ledger_for(releases, settings, sampler)
    ledger.check(releases)
    return PrivacyTracker(ledger, settings, releases)


def calibrate_for(
    releases_of: Callable[[float], list[Release]],
    settings: PrivacySettings,
    sampler,
    rounds: int,
    target_epsilon: float,
) -> float:
    """The least noise parameter z whose ``rounds`` rounds of ``releases_of(z)`` spend
    ``target_epsilon`` at ``settings.delta``, as the ledger that will account the run composes
    them (``ledger_for``; the one calibration path, ``privacy.accounting.calibration``)."""
    ledger = ledger_for(releases_of(1.0), settings, sampler)
    ledger.check(releases_of(1.0))
    return ledger.calibrate(releases_of, rounds, target_epsilon)


class PrivacyTracker:
    def __init__(self, ledger: Ledger, settings: PrivacySettings, planned: list[Release] = ()):
        """``planned``: the releases round 1 will run (the report's, if the run stops before any
        round)."""
        self.ledger, self.settings, self.planned = ledger, settings, list(planned)
        self.rounds, self.stopped_at = 0, None
        # every release that ran, by name (the last round's)
        self.mechanisms: dict[str, Release] = {}
        self.claims: dict[str, dict] = {}  # label -> {"claim": Claim, "mu_squared": sum so far}

    @property
    def local(self) -> bool:
        return self.ledger.local

    @property
    def private(self) -> bool:
        """Whether every release that ran (or, before any round, that is planned) is covered by a
        proof."""
        releases = list(self.mechanisms.values()) or self.planned
        return all(r.formal for r in releases) and not self._mixed(releases) and self.ledger.formal

    def _mixed(self, releases) -> bool:
        """Local noise with a central release beside it: the server saw that part in the clear."""
        return self.local and any(r.locality != "local" for r in releases)

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray:
        return self.ledger.eligible(t, releases)

    def allows(self, t: int, releases: list[Release]) -> bool:
        """Checked before round t with round t's releases: False once the budget would be
        exceeded."""
        return self.ledger.allows(t, releases)

    def step_inputs(self, t: int, client_ids, slots: int):
        """Each cohort slot's noise multiplier for local DP-SGD steps (``Requirements.step_noise``),
        or None."""
        return self.ledger.step_multipliers(t, client_ids, slots)

    def record(self, t: int, client_ids, releases: list[Release]) -> None:
        """Composes round t: ``releases``, the round's (``RoundResult.releases``), on the clients
        that took part."""
        self.ledger.record(t, np.asarray(client_ids, dtype=np.int64), releases)
        self.rounds += 1
        self.mechanisms.update({r.mechanism: r for r in releases})
        for claim in (c for r in releases for c in r.claims):
            entry = self.claims.setdefault(claim.label, {"claim": claim, "mu_squared": 0.0})
            entry["claim"] = claim
            if claim.mu_squared is not None:
                entry["mu_squared"] = entry["mu_squared"] + np.asarray(claim.mu_squared, float)

    def claimed(self) -> dict:
        """Each claim's figure at the run's delta over the rounds run (``Claim``)."""
        out = {}
        for label, entry in self.claims.items():
            claim = entry["claim"]
            if claim.epsilon is not None:
                out[label] = float(claim.epsilon)
            else:
                mu = (
                    float(claim.mu)
                    if claim.mu is not None
                    else float(np.sqrt(np.max(entry["mu_squared"])))
                )
                out[label] = (
                    gdp.epsilon_from_mu(mu, self.settings.delta) if math.isfinite(mu) else math.inf
                )
        return out

    def _headline(self) -> str | None:
        return next((label for label, e in self.claims.items() if e["claim"].headline), None)

    def epsilon(self) -> float:
        """The run's epsilon: the ledger's, or where the run has no proof and a release names its
        paper's figure as the headline, that figure (labelled ``formal: false`` wherever it
        appears)."""
        headline = self._headline()
        if headline is not None and not self.private:
            return self.claimed()[headline] if self.rounds else 0.0
        return self.ledger.epsilon() if self.rounds else 0.0

    def composed(self) -> dict:
        """What has been composed so far, as a checkpoint records it and a resume's replay must
        reproduce."""
        return {
            **self.ledger.composed(),
            "rounds": self.rounds,
            "claims": self.claimed(),
            "epsilon": float(self.epsilon()),
        }

    def report(self) -> PrivacyReport:
        fields = self.ledger.describe()
        releases = list(self.mechanisms.values()) or self.planned
        notes = [f"{r.mechanism}: {r.note}" for r in releases if r.note]
        notes += [f"{r.mechanism}: NO formal guarantee" for r in releases if not r.formal]
        notes += [
            f"{e['claim'].label}: {e['claim'].note}"
            for e in self.claims.values()
            if e["claim"].note
        ]
        if self._mixed(releases):
            notes.append(
                "local noise with a central release beside it ("
                + ", ".join(r.mechanism for r in releases if r.locality != "local")
                + "): the server sees that part of each client's upload before noising it, so it is"
                " not locally private: NO formal guarantee"
            )
        notes += fields.get("notes", [])
        if (
            any(r.locality == "central" for r in releases if r.formal)
            and not self.local
            and not any(r.stream for r in releases)
            and "round_mechanisms" not in fields.get("accounting", {})
        ):
            notes.append(
                "central releases on the same cohort composed as one Gaussian, z_eff = (sum_i"
                " z_i^-2)^-1/2"
            )
        rule = self.ledger.rule
        if (
            not self.private
            and rule is not None
            and (rule.max_epsilon is not None or rule.target_epsilon is not None)
        ):
            notes.append(
                "the budget rule was applied to the formal part of the releases only; the run as a"
                " whole has no formal guarantee"
            )
        if self.stopped_at is not None:
            notes.append(
                f"training stopped before round {self.stopped_at}: the budget would have been"
                " exceeded"
            )
        epsilon = self.epsilon()
        noise = fields.get("noise_multipliers", [])
        noiseless = any(z <= 0 for z in noise) or (self.rounds and not math.isfinite(epsilon))
        if noiseless:
            notes.append("a round ran without noise (z = 0): nothing is private")
        epsilons = dict(fields.get("epsilons", {}))
        claimed = self.claimed()
        epsilons.update(claimed)
        # a fixed claim under per-client ledgers: who spent more
        fixed = [label for label, e in self.claims.items() if e["claim"].epsilon is not None]
        per_client = (
            self.ledger.epsilons() if fixed and epsilons.get("clients_participated") else None
        )
        for label in fixed if per_client is not None else ():
            epsilons["clients_over_claim"] = int((per_client > claimed[label] * (1 + 1e-9)).sum())
        accounting = {
            "pld_discretization": self.settings.pld_discretization,
            "rdp_orders": list(self.settings.rdp_orders),
            **fields.get("accounting", {}),
        }
        for r in releases:
            accounting.update(r.details or {})
        return PrivacyReport(
            mechanism=fields.get("mechanism")
            or "; ".join(
                f"{r.mechanism} [{r.locality}, z={r.noise_multiplier:.6g}, bound {r.bound}]"
                for r in releases
            ),
            unit=fields.get("unit", "client"),
            neighboring_relation=fields["neighboring_relation"],
            sampling=fields["sampling"],
            noise_mode=fields["noise_mode"],
            accountant=fields["accountant"],
            delta=self.settings.delta,
            epsilon=epsilon,
            epsilons=epsilons,
            rounds=self.rounds,
            noise_multipliers=noise,
            sampling_rates=fields.get("sampling_rates", []),
            formal=bool(self.private and not noiseless),
            notes=notes,
            releases=fields.get("releases") or [r.declared() for r in releases],
            accounting=accounting,
        )
