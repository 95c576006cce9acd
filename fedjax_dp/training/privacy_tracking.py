"""The training loop's privacy bookkeeping: per-round events, budget stop, ledgers, the report.

Central noise: the accountant (RDP or PLD, from dp_accounting) composes one subsampled-Gaussian
event per round, matching the sampling actually run; the other accountant and the GDP CLT are
reported beside it. Local noise: each participation is a Gaussian release of one client's update
(sensitivity 2S: any two clipped updates differ by at most 2S), composed per client in the ledger,
with no amplification by sampling; the run's epsilon is the largest client's.
"""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp.privacy import gdp
from fedjax_dp.privacy.accounting import ACCOUNTANTS, Accountant, RoundEvent
from fedjax_dp.privacy.budget import BudgetRule, ClientLedger
from fedjax_dp.privacy.report import PrivacyReport


def parse_schedule(text: str, default: float) -> list[tuple[int, float]]:
    """'1:1.0,50:0.8' -> [(1, 1.0), (50, 0.8)] (value from that round on); '' -> constant default."""
    if not text:
        return [(1, default)]
    pairs = []
    for item in text.split(","):
        start, value = item.split(":")
        pairs.append((int(start), float(value)))
    if pairs[0][0] != 1 or any(b[0] <= a[0] for a, b in zip(pairs, pairs[1:])):
        raise ValueError(f"schedule {text!r} must start at round 1 with increasing rounds")
    return pairs


def value_at(schedule: list[tuple[int, float]], t: int) -> float:
    return [v for start, v in schedule if start <= t][-1]


class PrivacyTracker:
    def __init__(self, dp_cfg, sampling: str, population: int, cohort_size: int, rate: float, private: bool,
                 clip_mode: str):
        self.cfg = dp_cfg
        self.sampling, self.population, self.cohort_size, self.rate = sampling, population, cohort_size, rate
        self.private, self.clip_mode = private, clip_mode
        self.local = dp_cfg.noise_mode == "local"
        self.noise_schedule = parse_schedule(dp_cfg.noise_schedule, dp_cfg.noise_multiplier)
        self.accountants = {k: Accountant(k) for k in ACCOUNTANTS
                            if not (k == "pld" and sampling == "uniform")}
        self.rule = BudgetRule(
            target_epsilon=dp_cfg.target_epsilon or None, max_delta=dp_cfg.max_delta or None,
            delta=dp_cfg.delta if dp_cfg.max_epsilon else None, max_epsilon=dp_cfg.max_epsilon or None)
        self.ledger = ClientLedger(population, dp_cfg.delta, dp_cfg.client_epsilon_budget or None,
                                   sensitivity_factor=2.0 if self.local else (2.0 if sampling == "uniform" else 1.0))
        self.rounds, self.noise_used, self.stopped_at = 0, [], None

    def noise_multiplier(self, t: int) -> float:
        return value_at(self.noise_schedule, t)

    def event(self, t: int) -> RoundEvent:
        z = self.noise_multiplier(t)
        if self.sampling == "uniform":
            return RoundEvent("fixed", z, population=self.population, cohort_size=self.cohort_size)
        return RoundEvent("poisson", z, sampling_rate=self.rate)

    def allows(self, t: int) -> bool:
        """Checked before round t: False once the budget would be exceeded (training stops)."""
        if self.local or not self.private:
            return True
        return self.rule.allows(self.accountants[self.cfg.accountant], self.event(t))

    def eligible(self, t: int) -> np.ndarray:
        return self.ledger.eligible(self.noise_multiplier(t))

    def record(self, t: int, client_ids: np.ndarray) -> None:
        event = self.event(t)
        for acc in self.accountants.values():
            acc.compose(event)
        self.ledger.record(client_ids, event.noise_multiplier)
        self.rounds += 1
        self.noise_used.append(event.noise_multiplier)

    def epsilon(self) -> float:
        if self.local:
            eps = self.ledger.epsilons()
            return float(eps.max()) if len(eps) else 0.0
        return self.accountants[self.cfg.accountant].epsilon(self.cfg.delta)

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
        notes = []
        if not self.private:
            notes.append("median clipping computes S from the clients' raw updates: NO formal DP guarantee")
        if self.sampling == "uniform" and not self.local:
            notes.append("fixed-size sampling: replace-one neighbours, sensitivity 2S; RDP with the dp_accounting "
                         "replace-one normalisation corrected (google/differential-privacy#378); PLD has no such event")
        if self.local:
            notes.append("local noise: per-client Gaussian composition of its own participations (sensitivity 2S), "
                         "no amplification by sampling")
        if self.stopped_at is not None:
            notes.append(f"training stopped before round {self.stopped_at}: the budget would have been exceeded")
        epsilon = self.epsilon() if self.rounds else 0.0
        return PrivacyReport(
            mechanism=f"DP-FedAvg, {self.clip_mode} clipping, {'local' if self.local else 'central'} Gaussian noise",
            unit="client", neighboring_relation="replace-one" if (self.sampling == "uniform" or self.local) else "add/remove-one",
            sampling="fixed-size without replacement" if self.sampling == "uniform" else "Poisson",
            noise_mode=self.cfg.noise_mode, accountant="per-client GDP ledger" if self.local else self.cfg.accountant,
            delta=delta, epsilon=epsilon, epsilons=epsilons, rounds=self.rounds,
            noise_multipliers=sorted(set(self.noise_used)), sampling_rates=[self.rate], formal=self.private,
            notes=notes)
