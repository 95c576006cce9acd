"""``PrivacySettings``: what the run's accounting needs beyond the mechanisms that ran:
the delta, the accountant and its precision, and the budgets that stop a run or a client. It is the
``privacy`` config section, read in one place (``from_config``); algorithm sections hold only their
mechanisms' knobs."""

from __future__ import annotations

import dataclasses

from fedjax_dp.privacy.accounting.accountant import (
    ACCOUNTANTS,
    PLD_DISCRETIZATION,
    RDP_ORDERS,
    check_delta,
    parse_rdp_orders,
)


@dataclasses.dataclass(frozen=True)
class PrivacySettings:
    """delta: every epsilon is at this delta. accountant: ``rdp`` or ``pld`` for central releases
    (the per-client ledgers of local releases are exact GDP). max_epsilon: stop before a round would
    pass it (0: none). stop_epsilon, stop_max_delta: Geyer et al.'s stop, before delta at
    stop_epsilon would pass stop_max_delta (0: none). client_epsilon_budget: every client's own
    budget (0: none)."""

    delta: float = 1e-5
    accountant: str = "rdp"
    pld_discretization: float = PLD_DISCRETIZATION
    rdp_orders: tuple = RDP_ORDERS
    max_epsilon: float = 0.0
    stop_epsilon: float = 0.0
    stop_max_delta: float = 0.0
    client_epsilon_budget: float = 0.0

    def __post_init__(self):
        check_delta(self.delta)
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(
                f"privacy.accountant {self.accountant!r} unknown; choose one of {ACCOUNTANTS}"
            )
        object.__setattr__(self, "rdp_orders", tuple(self.rdp_orders) or RDP_ORDERS)

    @classmethod
    def from_config(cls, cfg, default_orders: tuple = RDP_ORDERS) -> "PrivacySettings":
        """The settings of a config (its ``privacy`` section); ``default_orders``: the grid of
        ``rdp_orders=''``."""
        p = cfg.privacy
        return cls(
            delta=p.delta,
            accountant=p.accountant,
            pld_discretization=p.pld_discretization,
            rdp_orders=parse_rdp_orders(p.rdp_orders, default=default_orders),
            max_epsilon=p.max_epsilon,
            stop_epsilon=p.stop_epsilon,
            stop_max_delta=p.stop_max_delta,
            client_epsilon_budget=p.client_epsilon_budget,
        )


SECTION = {
    "delta": 1e-5,  # every epsilon of the run is at this delta
    # rdp | pld: central releases and the example-level ledgers (local releases: exact GDP)
    "accountant": "rdp",
    "pld_discretization": PLD_DISCRETIZATION,  # PLD value discretisation (pessimistic)
    "rdp_orders": "",  # RDP order grid ("" = the accountant's default)
    # > 0: choose z so that `rounds` rounds spend this epsilon (algorithms that calibrate z)
    "target_epsilon": 0.0,
    "max_epsilon": 0.0,  # stop before a round that would pass this epsilon (0 = no stop)
    # Geyer's stop: before delta at stop_epsilon would pass stop_max_delta
    "stop_epsilon": 0.0,
    "stop_max_delta": 0.0,
    # every client's own budget: one that would pass it is no longer sampled (0 = none)
    "client_epsilon_budget": 0.0,
    # True: DP noise, sampling and shuffles from OS entropy, never written (core.rng)
    "secure_rng": False,
}
"""The ``privacy`` section of ``default_config()``: the one place for delta, the accountant, budgets
and stops."""

DOCS = {
    "privacy.delta": (
        "delta at which every epsilon of the run is reported (one delta for every mechanism)"
    ),
    "privacy.accountant": (
        "rdp | pld (dp_accounting): central releases, and the per-client example-level ledgers that"
        " decide seed 003's schedule and stops; local client-level releases are composed exactly"
        " (GDP)"
    ),
    "privacy.pld_discretization": (
        "PLD value discretisation (pessimistic: epsilon over-reported by about this)"
    ),
    "privacy.rdp_orders": (
        "RDP order grid, e.g. '1.5,2,4,8,16,32,64' ('' = the accountant's default grid)"
    ),
    "privacy.target_epsilon": (
        "> 0: choose the noise multiplier z so that `rounds` rounds spend this epsilon at "
        "privacy.delta (dp_fedavg, dp_uga); 0: off (dp.noise_multiplier is z)"
    ),
    "privacy.max_epsilon": (
        "stop before a round that would take epsilon(privacy.delta) above this (0 = no stop)"
    ),
    "privacy.stop_epsilon": (
        "Geyer et al.'s stop: with privacy.stop_max_delta, stop before delta at this epsilon would "
        "exceed stop_max_delta"
    ),
    "privacy.stop_max_delta": (
        "Geyer et al.'s stop: Q, the largest delta allowed at privacy.stop_epsilon"
    ),
    "privacy.client_epsilon_budget": (
        "every client's own epsilon budget: a client whose next participation would pass "
        "it is no longer sampled (0 = none)"
    ),
    "privacy.secure_rng": (
        "True: DP noise, sampling and shuffles from OS entropy, never written (not reproducible)"
    ),
}

ACCOUNTING = ("delta", "accountant", "pld_discretization", "rdp_orders")
"""The keys every central-DP algorithm reads."""
BUDGETS = ("max_epsilon", "stop_epsilon", "stop_max_delta", "client_epsilon_budget")
"""The run-wide stops and per-client budgets of the generic tracker (central and local client-level
ledgers)."""
CALIBRATION = ("target_epsilon",)
"""Read where an algorithm calibrates its noise multiplier to a target (``dp_fedavg``,
``dp_uga``)."""
LOCAL = ("delta",) + BUDGETS
"""What a local client-level DP algorithm reads (its ledger is exact GDP: no accountant)."""

MOVED = {
    "dp.delta": "privacy.delta",
    "cuag.delta": "privacy.delta",
    "udp.delta": "privacy.delta",
    "ldp.delta": "privacy.delta",
    "prifedsync.delta": "privacy.delta",
    "dp_scaffold.delta": "privacy.delta",
    "dp.accountant": "privacy.accountant",
    "ldp.accountant": "privacy.accountant",
    "dp_scaffold.accountant": "privacy.accountant",
    "dp.pld_discretization": "privacy.pld_discretization",
    "dp.rdp_orders": "privacy.rdp_orders",
    "ldp.rdp_orders": "privacy.rdp_orders",
    "dp.calibrate_epsilon": "privacy.target_epsilon",
    "dp.target_epsilon": "privacy.stop_epsilon",
    "dp.max_delta": "privacy.stop_max_delta",
    "dp.max_epsilon": "privacy.max_epsilon",
    "dp.client_epsilon_budget": "privacy.client_epsilon_budget",
    "dp_scaffold.epsilon_threshold": "privacy.client_epsilon_budget",
}
"""Keys that moved to the ``privacy`` section: a config naming one is refused with the
new key."""


def moved_message(dotted: str) -> str | None:
    """'config key X moved: it is Y now' for a key of ``MOVED`` (also given as its last part, as a
    config file's locked-key error names it), else None."""
    if dotted in MOVED:
        return (
            f"config key {dotted!r} moved to the privacy section: it is {MOVED[dotted]!r} now"
            " (CHANGELOG.md)"
        )
    return None


def check_privacy(cfg, need) -> None:
    """The ``privacy`` section's own checks (the algorithm's use of it: ``registry.validate``)."""
    p = cfg.privacy
    need(0 < p.delta < 1, f"privacy.delta must lie in (0, 1), got {p.delta}")
    need(
        p.accountant in ACCOUNTANTS,
        f"privacy.accountant {p.accountant!r} unknown; available: {ACCOUNTANTS}",
    )
    need(
        0 < p.pld_discretization <= 0.1,
        f"privacy.pld_discretization must lie in (0, 0.1], got {p.pld_discretization}",
    )
    try:
        parse_rdp_orders(p.rdp_orders)
    except ValueError as error:
        need(False, f"privacy.rdp_orders={p.rdp_orders!r}: {error}")
    for key in ("target_epsilon", "max_epsilon", "stop_epsilon", "client_epsilon_budget"):
        need(p[key] >= 0, f"privacy.{key} must be >= 0 (0 = off), got {p[key]}")
    need(
        0 <= p.stop_max_delta < 1,
        f"privacy.stop_max_delta must lie in [0, 1) (0 = off), got {p.stop_max_delta}",
    )
    need(
        (p.stop_epsilon > 0) == (p.stop_max_delta > 0),
        f"privacy.stop_epsilon={p.stop_epsilon} and privacy.stop_max_delta={p.stop_max_delta} go"
        " together (Geyer's stop needs both)",
    )
