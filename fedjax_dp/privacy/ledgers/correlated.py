"""The ledger of correlated-noise runs (issue 75): the rounds' noise is correlated, so they are not
composed; after round t the whole stream so far is one event (``Release.cumulative``,
``privacy.correlated.plan``), which replaces the account. The ledger also holds each client's
participation history (last round, count), from which the sampler is told who the scheme lets take
part (``ParticipationSampling.allowed``), and checks every recorded cohort against
it: a cohort that broke the scheme would void the sensitivity the noise was calibrated for, so it is
an error, never a silent overspend. The history is rebuilt on resume by the replay of the recorded
participations.

The neighbouring relation is zero-out with the participation schedule fixed (``participation``): for
a Gaussian on the clipped sum it is accounted as dp_accounting's add/remove-one Gaussian (the same
distributions).
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.core.release import Release
from fedjax_dp.privacy.accounting.accountant import ACCOUNTANTS, Accountant
from fedjax_dp.privacy.accounting.participation_sampling import ParticipationSampling
from fedjax_dp.privacy.ledgers.client_level import budget_rule
from fedjax_dp.privacy.settings import PrivacySettings


class CorrelatedLedger:
    local = False

    def __init__(self, sampler: ParticipationSampling, settings: PrivacySettings):
        self.sampler, self.settings = sampler, settings
        self.rule = budget_rule(settings)
        self.last_round = np.zeros(sampler.num_clients, np.int64)
        self.participations = np.zeros(sampler.num_clients, np.int64)
        self.account: tuple | None = None  # (RoundEvent, count) of the stream so far
        self.noise_used: list[float] = []
        self.stream: Release | None = None

    def _stream(self, releases: list[Release]) -> Release:
        """The round's one correlated release (anything else private beside it is refused: it would
        need composing with a stream that is not a composition)."""
        streams = [r for r in releases if r.cumulative is not None]
        others = [r for r in releases if r.cumulative is None and r.noise_multiplier > 0]
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

    def eligible(self, t: int, releases: list[Release]) -> np.ndarray:
        return self.sampler.allowed(t, self.last_round, self.participations)

    def _accountant(self, account, kind: str | None = None) -> Accountant:
        event, count = account
        return Accountant(
            kind or self.settings.accountant,
            self.settings.pld_discretization,
            self.settings.rdp_orders,
        ).compose(event, count)

    def allows(self, t: int, releases: list[Release]) -> bool:
        event, count = self._stream(releases).cumulative
        empty = Accountant(
            self.settings.accountant, self.settings.pld_discretization, self.settings.rdp_orders
        )
        return self.rule.allows(empty, event, count)

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
        self.account, self.stream = stream.cumulative, stream
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
            event, count = self.account
            accounting.update(
                stream_event_multiplier=event.noise_multiplier, stream_event_count=count
            )
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
