"""``PrivacyReport``: one JSON-serialisable statement of what a run's privacy guarantee is."""

from __future__ import annotations

import dataclasses
import json


@dataclasses.dataclass
class PrivacyReport:
    """What was protected, against what, by which mechanism, and how much was spent.

    ``formal`` is False whenever some step is not covered by a DP proof (e.g. median clipping, the
    CUAG-PFL ``paper`` mode); ``epsilon`` then holds what the formula would give, for reference
    only. ``epsilons`` puts accountants side by side (RDP, PLD, and the CLT approximation, which is
    not a bound).
    """

    mechanism: str
    unit: str
    neighboring_relation: str
    sampling: str
    noise_mode: str
    accountant: str
    delta: float
    epsilon: float
    epsilons: dict
    rounds: int
    noise_multipliers: list
    sampling_rates: list
    formal: bool
    notes: list = dataclasses.field(default_factory=list)
    # every mechanism that ran, as declared
    releases: list = dataclasses.field(default_factory=list)
    outside_guarantee: list = dataclasses.field(default_factory=list)  # published, not covered
    # accountant precision (discretisation, orders)
    accounting: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, allow_nan=False)
