"""Privacy budgets: when to stop training, and per-client ledgers for heterogeneous budgets.

``BudgetRule`` is checked BEFORE each round with that round included, so the budget is never
exceeded (Geyer et al.'s rule "stop once delta(epsilon_target) > Q" checked prospectively):
* ``max_delta`` Q at ``target_epsilon``: stop when delta(target_epsilon) would exceed Q;
* ``max_epsilon`` at ``delta``: stop when epsilon(delta) would exceed the budget.

``ClientBook`` tracks every client's own participations and noise: each participation in which a
client's clipped update is released with Gaussian noise of multiplier z (relative to the L2
sensitivity) is a (1/z)-GDP mechanism for that client, and GDP composes exactly: the client's
mu = sqrt(sum_t z_t^-2), converted to epsilon at delta exactly (``gdp.epsilon_from_mu``). This
ignores amplification by sampling, so for central DP it is a conservative per-client bound; for
local DP it is the client's guarantee. A client whose next participation would exceed its own budget
is no longer eligible for sampling (eligibility depends only on past sampling, not on data).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.accounting.accountant import (
    Accountant,
    RoundEvent,
    check_delta,
    check_epsilon,
)


@dataclasses.dataclass(frozen=True)
class BudgetRule:
    target_epsilon: float | None = None
    max_delta: float | None = None
    delta: float | None = None
    max_epsilon: float | None = None

    def __post_init__(self):
        if (self.target_epsilon is None) != (self.max_delta is None):
            raise ValueError("Geyer's rule needs both target_epsilon and max_delta (Q)")
        if (self.delta is None) != (self.max_epsilon is None):
            raise ValueError("an epsilon budget needs both delta and max_epsilon")
        if self.target_epsilon is not None:
            check_epsilon(self.target_epsilon)
            if not 0 < self.max_delta < 1:
                raise ValueError(f"Q (max_delta) must lie in (0, 1), got {self.max_delta}")
        if self.max_epsilon is not None:
            check_delta(self.delta)
            check_epsilon(self.max_epsilon)

    def allows_gdp(self, mu_after: float) -> bool:
        """The rule on a mu-GDP figure after the next round (per-client ledgers under local
        noise)."""
        if not math.isfinite(mu_after):
            return False
        if (
            self.max_epsilon is not None
            and gdp.epsilon_from_mu(mu_after, self.delta) > self.max_epsilon
        ):
            return False
        if (
            self.target_epsilon is not None
            and gdp.delta_from_mu(mu_after, self.target_epsilon) > self.max_delta
        ):
            return False
        return True

    def allows(self, accountant: Accountant, next_round: RoundEvent, count: int = 1) -> bool:
        """Whether running ``next_round`` (``count`` times) keeps the spent privacy within the
        budget."""
        after = accountant.copy_with(next_round, count)
        if self.target_epsilon is not None and after.delta(self.target_epsilon) > self.max_delta:
            return False
        if self.max_epsilon is not None and after.epsilon(self.delta) > self.max_epsilon:
            return False
        return True


class ClientBook:
    """Per-client privacy spent, as GDP mu^2 sums, with per-client epsilon budgets at one delta."""

    def __init__(
        self,
        num_clients: int,
        delta: float,
        epsilon_budgets: np.ndarray | float | None = None,
        sensitivity_factor: float = 1.0,
    ):
        """``sensitivity_factor`` = 2 under replace-one neighbours (sensitivity 2S for noise z
        S)."""
        check_delta(delta)
        self.delta = delta
        self.mu_squared = np.zeros(num_clients)
        self.participations = np.zeros(num_clients, dtype=np.int64)
        self.sensitivity_factor = sensitivity_factor
        budgets = (
            np.full(num_clients, np.inf)
            if epsilon_budgets is None
            else np.broadcast_to(np.asarray(epsilon_budgets, float), (num_clients,)).copy()
        )
        if np.any(budgets <= 0):
            raise ValueError(f"client epsilon budgets must be > 0, got min {budgets.min()}")
        self.budgets = budgets
        # mu that each budget allows: epsilon_from_mu is increasing in mu, so compare in mu space.
        self.mu_budgets = np.array(
            [np.inf if not np.isfinite(b) else gdp.mu_from_epsilon(b, delta) for b in budgets]
        )

    def _round_mu_squared(self, noise_multipliers) -> np.ndarray:
        z = np.asarray(noise_multipliers, float)
        with np.errstate(divide="ignore"):
            return np.where(z > 0, (self.sensitivity_factor / np.where(z > 0, z, 1.0)) ** 2, np.inf)

    def mu_squared_after(self, noise_multipliers) -> np.ndarray:
        """Every client's mu^2 if it took part in one more round; ``noise_multipliers``: one z for
        everybody, or each population client's own z."""
        return self.mu_squared + self._round_mu_squared(noise_multipliers)

    def eligible(self, noise_multipliers) -> np.ndarray:
        """Clients that can take part in one more round without exceeding their own budget."""
        return self.mu_squared_after(noise_multipliers) <= self.mu_budgets**2 * (1 + 1e-12)

    def record(self, client_ids: np.ndarray, noise_multipliers) -> None:
        """One participation of each listed client, at one z for all or at each one's own z
        (aligned)."""
        client_ids = np.asarray(client_ids, dtype=np.int64)
        self.mu_squared[client_ids] += np.broadcast_to(
            self._round_mu_squared(noise_multipliers), client_ids.shape
        )
        self.participations[client_ids] += 1

    def epsilons(self) -> np.ndarray:
        """Each client's epsilon at ``delta`` so far (0 for clients never sampled)."""
        out = np.zeros(len(self.mu_squared))
        for mu2 in np.unique(self.mu_squared[self.mu_squared > 0]):
            out[self.mu_squared == mu2] = (
                np.inf if np.isinf(mu2) else gdp.epsilon_from_mu(float(np.sqrt(mu2)), self.delta)
            )
        return out
