"""The ledger of correlated-noise runs: the rounds' noise is correlated, so they are not composed;
after round t the whole stream so far is one event (a ``Release`` with ``stream=True``,
``privacy.correlated.plan``), which replaces the account. The ledger also holds each client's
participation history (last round, count), from which the sampler is told who the scheme lets take
part (``ParticipationSampling.allowed``), and checks every recorded cohort against it: a cohort that
broke the scheme would void the sensitivity the noise was calibrated for, so it is an error, never a
silent overspend. The history is rebuilt on resume by the replay of the recorded participations.

The neighbouring relation is zero-out with the participation schedule fixed (``participation``):
for a Gaussian on the clipped sum it is accounted as dp_accounting's add/remove-one Gaussian (the
same distributions).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fedjax_dp.core.release import Release
from fedjax_dp.privacy.accounting import calibration
from fedjax_dp.privacy.accounting.accountant import (
    ACCOUNTANTS,
    Accountant,
    RoundEvent,
    UnsupportedEventError,
    supports,
)
from fedjax_dp.privacy.correlated.plan import stream_parts
from fedjax_dp.privacy.ledgers.client_level import LedgerDefaults, budget_rule
from fedjax_dp.privacy.settings import PrivacySettings


class CorrelatedLedger(LedgerDefaults):
    def __init__(self, sampler, settings: PrivacySettings):
        self.sampler, self.settings = sampler, settings
        self.rule = budget_rule(settings)
        self.last_round = np.zeros(sampler.num_clients, np.int64)
        self.participations = np.zeros(sampler.num_clients, np.int64)
        self.account: RoundEvent | None = None  # the stream so far, as one event
        self.noise_used: list[float] = []
        self.stream: Release | None = None

    def _stream(self, releases: list[Release]) -> Release:
        """The round's one correlated release (anything else private beside it is refused: it would
        need composing with a stream that is not a composition)."""
        streams = [r for r in releases if r.stream]
        others = [r for r in releases if not r.stream and r.noise_multiplier > 0]
        if len(streams) != 1 or others:
            raise ValueError(
                "a correlated-noise round releases exactly one correlated stream and nothing else "
                f"noised, got {[r.mechanism for r in releases]}"
            )
        scheme = (streams[0].details or {}).get("participation")
        if scheme != self.sampler.participation.describe():
            raise ValueError(
                f"the noise was calibrated for participation {scheme!r}, but the sampler enforces "
                f"{self.sampler.participation.describe()!r}"
            )
        return streams[0]

    @staticmethod
    def _event(stream: Release) -> RoundEvent:
        """The stream's event as the accountants compose it (no sampling of its own)."""
        return RoundEvent("full", mechanism=stream.event)

    def check(self, releases: list[Release]) -> None:
        event, kind = self._event(self._stream(releases)), self.settings.accountant
        if not supports(event, kind):
            raise UnsupportedEventError(
                f"privacy.accountant={kind!r} cannot compose the correlated stream's event"
                f" {event.mechanism}"
            )

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray:
        return self.sampler.allowed(t, self.last_round, self.participations)

    def _accountant(self, event: RoundEvent, kind: str | None = None) -> Accountant:
        s = self.settings
        return Accountant(kind or s.accountant, s.pld_discretization, s.rdp_orders).compose(event)

    def allows(self, t: int, releases: list[Release]) -> bool:
        empty = Accountant(
            self.settings.accountant, self.settings.pld_discretization, self.settings.rdp_orders
        )
        return self.rule.allows(empty, self._event(self._stream(releases)))

    def calibrate(self, releases_of: Callable, rounds: int, target_epsilon: float) -> float:
        """The least z whose whole stream, ``releases_of(z)``'s event after its last round, spends
        ``target_epsilon`` (``calibration.calibrate``)."""
        p, delta = self.sampler.participation, self.settings.delta
        if p.amplified and delta >= p.rate:
            raise ValueError(
                f"delta={delta} >= the sampling rate q={p.rate:.6g}: any noise meets it (a client"
                " is in a round with probability q), so there is nothing to calibrate; choose"
                " delta < q"
            )

        def schedule_of(z):
            return [(self._event(self._stream(releases_of(z))), 1)]

        return calibration.calibrate(schedule_of, target_epsilon, delta, self.settings.accountant)

    def record(self, t: int, client_ids, releases: list[Release]) -> None:
        stream = self._stream(releases)
        client_ids = np.asarray(client_ids, np.int64)
        allowed = self.eligible(t, releases)
        if len(np.unique(client_ids)) != len(client_ids) or not allowed[client_ids].all():
            broke = client_ids[~allowed[client_ids]]
            raise RuntimeError(
                f"round {t}: clients {broke.tolist()} took part against the participation scheme "
                f"({self.sampler.participation.describe()}); the noise's sensitivity would not hold"
            )
        self.last_round[client_ids] = t
        self.participations[client_ids] += 1
        self.account, self.stream = self._event(stream), stream
        self.noise_used.append(float(stream.noise_multiplier))

    def epsilon(self, kind: str | None = None) -> float:
        return (
            self._accountant(self.account, kind).epsilon(self.settings.delta)
            if self.account
            else 0.0
        )

    def composed(self) -> dict:
        return {
            "rounds": len(self.noise_used),
            "noise_multipliers": self.noise_used,
            "participations": int(self.participations.sum()),
            "epsilon": float(self.epsilon()),
        }

    def describe(self) -> dict:
        epsilons = {kind: self.epsilon(kind) for kind in ACCOUNTANTS}
        p = self.sampler.participation
        notes = [
            "correlated noise: the rounds released so far are one event (not a composition of"
            " rounds); zero-out neighbours with the participation schedule fixed, accounted as the"
            " add/remove-one Gaussian (the same output distributions for a sum with a fixed"
            " denominator)"
        ]
        if self.participations.any():
            notes.append(
                f"participation enforced: {p.describe()}; most rounds of one client "
                f"{int(self.participations.max())}"
            )
        accounting = {
            "participation": p.describe(),
            "most_participations_of_a_client": int(self.participations.max()),
            "clients_participated": int((self.participations > 0).sum()),
        }
        if self.account is not None:
            z, count = stream_parts(self.account.mechanism)
            accounting.update(stream_event_multiplier=z, stream_event_count=count)
        return {
            "neighboring_relation": "zero-out (participation schedule fixed)",
            "sampling": p.describe(),
            "noise_mode": "central (correlated)",
            "accountant": self.settings.accountant,
            "epsilons": epsilons,
            "notes": notes,
            "noise_multipliers": sorted(set(self.noise_used)),
            "sampling_rates": [p.rate] if p.amplified else [],
            "accounting": accounting,
        }
