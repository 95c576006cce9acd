"""What a mechanism releases, typed (issue 73): the ``dp_accounting`` event of one application, the
numeric sensitivity and the neighbouring relation it was derived for, the unit it protects, where
the noise is added, whether a proof covers it, and what its paper claims.

A transform (or a local DP step) states its ``Release``s; the round returns those of the chain that
ran (``RoundResult.releases``), and the privacy tracker only wraps them in the event of the sampler
that drew the cohort and composes: no part of the accounting is guessed from the configuration
(jax_privacy's split between batch selection and noise, ``execution_plan.py``).

Conventions. ``noise_multiplier`` z is the noise std over the per-unit L2 bound (``bound_value``: S
for a clipped client update). ``relation`` is the neighbouring relation ``event`` and
``sensitivity`` are stated for:

* a central release is stated for add/remove-one (sensitivity S, ``GaussianDpEvent(z)``); a sampler
  that draws fixed-size cohorts (replace-one) converts it itself
  (``privacy.accounting.accountant.RoundEvent``);
* a local release is stated for replace-one (a client always sends something: two neighbouring
  clients' uploads differ by up to 2S), so ``sensitivity`` = 2S and ``event`` = ``GaussianDpEvent(z
  / 2)``, which the per-client ledger composes as it stands.

Lives in ``core`` because the upload transforms of ``core.uploads`` state it; it imports
``dp_accounting``, not ``fedjax_dp.privacy``.
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
from dp_accounting import NeighboringRelation

LOCALITIES = ("central", "local")
UNITS = ("client", "example")


@dataclasses.dataclass(frozen=True)
class Claim:
    """What a paper says its mechanism spends, reported beside the accounted epsilon
    (``epsilons[label]``), never as a guarantee: a fixed ``epsilon`` or GDP ``mu`` for the whole run
    (converted at the run's delta), or a GDP figure ``mu_squared`` per round (one value, or one per
    population client) that the tracker sums over the rounds run and converts at the run's delta (a
    paper's CLT formula). ``headline``: the run's epsilon is this figure (a method without a proof
    reports what its paper computes, labelled ``formal: false``)."""

    label: str
    note: str = ""
    epsilon: float | None = None
    mu: float | None = None
    mu_squared: float | tuple | None = None
    headline: bool = False

    def __post_init__(self):
        given = [
            name for name in ("epsilon", "mu", "mu_squared") if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                f"claim {self.label!r}: give one of a fixed epsilon, a fixed mu or a per-round "
                f"mu_squared, got {given or 'none'}"
            )


@dataclasses.dataclass(frozen=True)
class Release:
    """One mechanism run in a round (module docstring for the conventions).

    Attributes:
      mechanism: what it is, in words.
      locality: ``central`` (one draw on the cohort's sum, composed by the accountant with the
        sampling) or ``local`` (one draw per client before sending, each participating client's
        own ledger composes it, without amplification by sampling).
      noise_multiplier: noise std over ``bound_value`` (0: nothing private).
      bound: the per-unit bound in words.
      bound_value: the number (inf where nothing bounds the upload).
      relation: the neighbouring relation ``event`` and ``sensitivity`` are stated for (default:
        add/remove-one for central, replace-one for local releases).
      event: the dp_accounting event of one application (default: the Gaussian of the multiplier
        relative to ``sensitivity``; a correlated-noise mechanism states its own).
      formal: False when no DP proof covers the step (a threshold computed from raw data, say).
      client_multipliers: a local release whose noise differs per client (heterogeneous DP): each
        population client's multiplier, indexed by client id; ``noise_multiplier`` is then their
        minimum.
      client_budgets: the per-client epsilon budgets (at the run's delta) the noise was calibrated
        to, which the ledger holds each client to (None: none).
      claims: what the paper claims (``Claim`` objects: a fixed figure, a per-round formula), or
        none.
      details: what the mechanism states about its calibration, for ``privacy.json``'s
        ``accounting`` (CUAG-PFL's per-client mu_n), or None.
      cumulative: correlated noise (``privacy.correlated``): ``(RoundEvent, count)`` of the stream
        of every round so far, which ``event`` is too; a ledger replaces its account by it instead
        of composing the round (the rounds' noise is correlated, so per-round events do not
        compose). None: ``event`` is this round's alone.
    """

    mechanism: str
    locality: str
    noise_multiplier: float
    bound: str
    formal: bool = True
    note: str = ""
    client_multipliers: tuple | None = None
    bound_value: float = math.nan
    unit: str = "client"
    relation: NeighboringRelation | None = None
    event: dp_accounting.DpEvent | None = None
    client_budgets: tuple | None = None
    claims: tuple = ()
    details: dict | None = dataclasses.field(default=None, compare=False)
    cumulative: tuple | None = None

    def __post_init__(self):
        if self.locality not in LOCALITIES:
            raise ValueError(
                f"release {self.mechanism!r}: locality {self.locality!r} is not one of {LOCALITIES}"
            )
        if self.unit not in UNITS:
            raise ValueError(
                f"release {self.mechanism!r}: unit {self.unit!r} is not one of {UNITS}"
            )
        if not self.noise_multiplier >= 0:
            raise ValueError(
                f"release {self.mechanism!r}: noise multiplier must be >= 0, got"
                f" {self.noise_multiplier}"
            )
        if self.relation is None:
            object.__setattr__(
                self,
                "relation",
                (
                    NeighboringRelation.REPLACE_ONE
                    if self.locality == "local"
                    else NeighboringRelation.ADD_OR_REMOVE_ONE
                ),
            )
        if self.event is None:
            object.__setattr__(
                self, "event", gaussian_event(self.noise_multiplier / self.sensitivity_factor)
            )

    @property
    def sensitivity_factor(self) -> float:
        """The sensitivity over the per-unit bound under ``relation``: 2 for replace-one, 1 for
        add/remove."""
        return 2.0 if self.relation == NeighboringRelation.REPLACE_ONE else 1.0

    @property
    def sensitivity(self) -> float:
        """The L2 sensitivity of what is noised under ``relation`` (in the units of
        ``bound_value``)."""
        return self.sensitivity_factor * self.bound_value

    def multipliers_for(self, client_ids) -> np.ndarray:
        """Each listed client's noise multiplier (over the per-unit bound) under this release."""
        if self.client_multipliers is None:
            return np.full(len(client_ids), self.noise_multiplier)
        return np.asarray(self.client_multipliers, float)[np.asarray(client_ids, dtype=np.int64)]

    def event_multipliers_for(self, client_ids) -> np.ndarray:
        """Each listed client's multiplier relative to ``sensitivity`` (what its Gaussian event
        composes)."""
        return self.multipliers_for(client_ids) / self.sensitivity_factor

    def declared(self) -> dict:
        """The release as ``privacy.json`` lists it: numbers and flags, the relation and the event
        named."""
        z = self.client_multipliers
        record = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name
            not in (
                "relation",
                "event",
                "client_multipliers",
                "client_budgets",
                "claims",
                "details",
                "cumulative",
            )
        }
        record.update(
            neighboring_relation=relation_name(self.relation),
            event=str(self.event),
            sensitivity=self.sensitivity,
            client_multipliers=(
                None if z is None else {"clients": len(z), "min": min(z), "max": max(z)}
            ),
        )
        if self.cumulative:  # the stream's sensitivity is sens(C) S (``privacy.correlated.plan``)
            record["accumulation"] = (
                "one event for the stream of every round so far (correlated noise)"
            )
            record["sensitivity"] = self.sensitivity * (self.details or {}).get(
                "strategy_sensitivity", 1.0
            )
        if self.claims:
            record["claims"] = [
                {"label": c.label, "note": c.note, "headline": c.headline} for c in self.claims
            ]
        return record


def gaussian_event(noise_multiplier: float) -> dp_accounting.DpEvent:
    """The Gaussian of ``noise_multiplier`` relative to its sensitivity (no noise: a non-private
    event)."""
    if noise_multiplier <= 0:
        return dp_accounting.NonPrivateDpEvent()
    return dp_accounting.GaussianDpEvent(float(noise_multiplier))


def relation_name(relation: NeighboringRelation) -> str:
    return "replace-one" if relation == NeighboringRelation.REPLACE_ONE else "add/remove-one"
