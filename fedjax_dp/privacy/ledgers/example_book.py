"""Per-client example-level ledgers with cumulative privacy-loss thresholds (seed 003, the local
mini-batch gradient DP patent; ALGORITHMS.md Sec. 3).

Unit: one example of one client's local data (the client's data size n_k is public). Every local
step releases a clipped gradient plus N(0, (z C)^2 I); its batch is drawn one of two ways, each
accounted as what it is (``step_sampling``):

* ``fixed``: B of the n_k examples without replacement (``data.packing.pack_sampled_cohort``), one
  step = ``RoundEvent("fixed", z, population=n_k, cohort_size=B)``: dp_accounting's sampled-without-
  replacement Gaussian, replace-one (sensitivity 2C).
* ``poisson``: each example independently with probability q_k = B / n_k (``data.packing.
  pack_poisson_cohort``), one step = ``RoundEvent("poisson", z', sampling_rate=q_k)``, add/remove
  one example, z' = z for per-example clipping (sensitivity C) and z / 2 for a clipped batch mean
  (2C). Batches are padded to a cap (static shapes); a batch larger than the cap is cut to it at
  random, which costs (1 + e^epsilon) eta_k of delta, eta_k the cut's probability over the client's
  steps (``poisson_truncation``): decisions keep each client's uncut epsilon within its threshold at
  delta - (1 + e^threshold) eta_k, and a client's reported epsilon is the least one whose charge
  fits in delta (``poisson_truncation.epsilon_with_truncation``). Poisson batches amplify by about
  half the noise of fixed-size ones under PLD (no replace-one factor 2).

A client's loss is the composition of the steps it actually ran; the guarantee holds whatever the
server does with the uploads (they are post-processing of the noised steps). ``accountant`` is the
ledger that decides (the noise schedule and stopping, below) and reports: ``rdp`` composes RDP
curves; ``pld`` composes each client's steps with dp_accounting's PLD accountant (pessimistic,
discretisation ``LEDGER_PLD_DISCRETIZATION``), decides on it, and reports min(PLD, RDP) per client
(both bound the same mechanism, so the smaller holds; the PLD one never exceeds the threshold its
decisions kept). PLD is the tighter bound (RDP's conversion to (epsilon, delta) is loose), so PLD
decisions let a client run more steps or less noise for the same threshold. Cost (2-core CPU):
building the PLD of S steps at one (n_k, z) takes 20-40 ms (cached), composing it onto a client's
history and reading epsilon about 3 ms, so a 12-round schedule for one client took 1.7 s against
0.07 s by RDP.

The threshold rule (the patent's formula is an image missing from its text; this is the reading
implemented): client n has a threshold epsilon_n. Before each participation in round t it takes the
smallest noise multiplier z on a geometric grid [z_0, z_max] such that its spent loss plus the
participations it still expects, R = max(1, q (T - t + 1)) participations of S steps at z, stays
within epsilon_n (by the deciding ledger; PLD composes whole participations, so R is rounded to the
nearest integer, at least 1). Early on, with budget to spare, that is z_0 (the least noise); as the
spent loss approaches the threshold, or a client takes part more often than expected, R
participations fit only under more noise, so z rises. A client whose next participation would exceed
epsilon_n even at z_max is no longer sampled (eligibility depends only on past sampling and public
sizes, never on data), so no client ever exceeds its threshold. ``adaptive=False`` keeps z = z_0
(the fixed-noise baseline) with the same stopping rule. ``adaptive=False, calibrated=True`` is the
fixed-noise baseline for clients of unequal sizes (natural partitions: FEMNIST's writers): each
client's own z, the least on the grid (refined to ``CALIBRATION_TOLERANCE``) under which its q T
expected participations (at least 1) fit its threshold by the deciding ledger, chosen before
its first participation and kept for the run (the threshold rule frozen at a fresh ledger; a client
with fewer examples gets more noise); the same stopping rule, at its own z.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from dp_accounting.rdp import rdp_privacy_accountant

from fedjax_dp.privacy.accounting import cached_pld, poisson_truncation
from fedjax_dp.privacy.accounting.accountant import (
    RoundEvent,
    event_rdp,
    check_delta,
    check_rdp_orders,
)

STEP_SAMPLINGS = ("fixed", "poisson")
LEDGER_ACCOUNTANTS = ("rdp", "pld")
LEDGER_PLD_DISCRETIZATION = 1e-3
"""PLD discretisation of the per-client ledgers: one client's 300 Poisson steps (q = 16/600, z = 1)
take 0.07 s at 1e-3 against 0.64 s at 1e-4, for epsilon 2.9712 vs 2.9710 at delta 1e-5 (pessimistic:
an upper bound either way; RDP on ``RDP_ORDERS`` gives 3.39)."""


@functools.lru_cache(maxsize=2048)  # tens of kB each at discretisation 1e-3
def _step_pld(event: RoundEvent) -> PrivacyLossDistribution:
    """dp_accounting's PLD of one step of ``event`` (a Poisson-subsampled Gaussian, add/remove;
    pessimistic, discretisation ``LEDGER_PLD_DISCRETIZATION``), built once per (n_k, z): a ledger
    asks for the same (n_k, z) with many step counts, and building it (the connect-the-dots bounds,
    in Python) is the slow part."""
    poisson = event.dp_event("pld")
    return cached_pld.build_subsampled_gaussian_pld(
        poisson.event.noise_multiplier,
        poisson.sampling_probability,
        NeighboringRelation.ADD_OR_REMOVE_ONE,
        LEDGER_PLD_DISCRETIZATION,
    )


@functools.lru_cache(maxsize=2048)
def _steps_pld(event: RoundEvent, count: int) -> PrivacyLossDistribution:
    """The PLD of ``count`` steps of ``event``, what ``PLDAccountant.compose(event, count)``
    composes: dp_accounting's self-composition of ``_step_pld(event)``, its truncation bounds from
    moments computed once per step PLD (``cached_pld.self_compose``: the same bounds to the bit);
    cached because the ledgers compose the same few (n_k, z, count) over and over."""
    return cached_pld.self_compose(_step_pld(event), count)


GRID_POINTS = 32
CALIBRATION_TOLERANCE = 1e-3
"""A calibrated fixed z is refined between its grid points to within this relative step (the grid's
own step is 8.5 % for [0.8, 10]): it is chosen once per client, so the precision is cheap."""
LEDGER_ORDERS = (
    1.5,
    1.75,
    2.0,
    2.5,
    3.0,
    4.0,
    5.0,
    6.0,
    8.0,
    10.0,
    12.0,
    16.0,
    20.0,
    24.0,
    32.0,
    48.0,
    64.0,
    128.0,
)
"""The RDP orders of the per-client ledgers: a subsampled-without-replacement Gaussian costs about
30 ms per (n_k, z) on these 18 orders against 0.5 s on ``RDP_ORDERS``; a coarser grid can only raise
epsilon (conservative). ``privacy.rdp_orders`` chooses another."""


# fifteen fields, five of them floats: by name only, none can shift
@dataclasses.dataclass(kw_only=True)
class ExampleBook:
    client_sizes: np.ndarray  # n_k per population client
    batch_size: int  # B
    steps: int  # S local steps per participation
    thresholds: np.ndarray  # epsilon_n per client
    delta: float
    base_multiplier: float  # z_0
    max_multiplier: float  # z_max
    participation_rate: float  # q: expected fraction of clients sampled per round
    rounds: int  # T
    adaptive: bool = True
    orders: tuple = LEDGER_ORDERS
    step_sampling: str = "fixed"  # STEP_SAMPLINGS
    per_example: bool = True  # False: the clipped batch mean (sensitivity 2C under add/remove)
    accountant: str = "rdp"  # LEDGER_ACCOUNTANTS: what decides the schedule and stops, and reports
    # with adaptive=False: each client's own fixed z (module docstring), not z_0
    calibrated: bool = False

    def __post_init__(self):
        check_delta(self.delta)
        if self.step_sampling not in STEP_SAMPLINGS:
            raise ValueError(
                f"step_sampling {self.step_sampling!r} unknown; choose one of {STEP_SAMPLINGS}"
            )
        if self.accountant not in LEDGER_ACCOUNTANTS:
            raise ValueError(
                f"ledger accountant {self.accountant!r} unknown; choose one of {LEDGER_ACCOUNTANTS}"
            )
        self.orders = check_rdp_orders(self.orders)
        self.client_sizes = np.asarray(self.client_sizes, np.int64)
        self.thresholds = np.broadcast_to(
            np.asarray(self.thresholds, float), self.client_sizes.shape
        ).copy()
        if not np.all(self.thresholds > 0):
            raise ValueError(
                f"every client's threshold epsilon_n must be > 0, got min {self.thresholds.min()}"
            )
        if not 0 < self.base_multiplier <= self.max_multiplier:
            raise ValueError(
                f"need 0 < z_0 <= z_max, got z_0={self.base_multiplier},"
                f" z_max={self.max_multiplier}"
            )
        if np.any(self.client_sizes < self.batch_size):
            small = np.flatnonzero(self.client_sizes < self.batch_size)
            raise ValueError(
                f"batch size B={self.batch_size} is larger than the data of clients"
                f" {small[:10].tolist()} ({self.client_sizes[small[:10]].tolist()} examples)"
            )
        poisson = self.step_sampling == "poisson"
        self.design_epsilon = poisson_truncation.design_epsilon(self.thresholds)
        self.batch_cap = (
            poisson_truncation.batch_cap(
                self.client_sizes,
                self.batch_size,
                self.rounds * self.steps,
                self.delta,
                self.design_epsilon,
            )
            if poisson
            else self.batch_size
        )
        tails = {
            n: poisson_truncation.step_tail(self.batch_cap, n, self.batch_size) if poisson else 0.0
            for n in np.unique(self.client_sizes).tolist()
        }
        # P(one step is cut), per client
        self.step_tails = np.array([tails[n] for n in self.client_sizes.tolist()])
        charge = (
            (1.0 + np.exp(np.minimum(self.thresholds, 700.0)))
            * self.rounds
            * self.steps
            * self.step_tails
        )
        self.decision_deltas = np.where(
            np.isfinite(self.thresholds), self.delta - charge, self.delta
        )
        if self.adaptive and self.calibrated:
            raise ValueError(
                "a calibrated fixed z per client (calibrated=True) is the fixed-noise baseline: it"
                " needs adaptive=False"
            )
        self.grid = (
            np.geomspace(self.base_multiplier, self.max_multiplier, GRID_POINTS)
            if self.adaptive or self.calibrated
            else np.array([self.base_multiplier])
        )
        # calibrated: client -> its fixed z, set at first participation
        self._own_multiplier: dict[int, float] = {}
        self.spent = np.zeros((len(self.client_sizes), len(self.orders)))
        self.steps_run = np.zeros(len(self.client_sizes), np.int64)
        self.stopped_round = np.zeros(len(self.client_sizes), np.int64)  # 0: still contributing
        self.multipliers_used: list[float] = []
        # per client: z -> count
        self.participations: list[dict[float, int]] = [{} for _ in self.client_sizes]
        self._curves: dict[tuple[int, float], np.ndarray] = {}
        self._history_pld = [privacy_loss_distribution.identity(LEDGER_PLD_DISCRETIZATION)] * len(
            self.client_sizes
        )
        # z of participations not in it yet
        self._uncomposed: list[list[float]] = [[] for _ in self.client_sizes]

    def _participation(self, size: int, z: float) -> np.ndarray:
        """RDP curve of one participation (S steps) of a client holding ``size`` examples, at z
        (cached: the sizes and the noise grid are few)."""
        if (size, z) not in self._curves:
            self._curves[size, z] = self.steps * np.asarray(
                event_rdp(self.step_event(size, z), self.orders)
            )
        return self._curves[size, z]

    def step_event(self, size: int, z: float) -> RoundEvent:
        """One local step of a client holding ``size`` examples at noise multiplier z."""
        if self.step_sampling == "fixed":
            return RoundEvent("fixed", z, population=size, cohort_size=self.batch_size)
        return RoundEvent(
            "poisson", z if self.per_example else z / 2, sampling_rate=self.batch_size / size
        )

    def _epsilon(self, curve: np.ndarray, delta: float) -> float:
        return float(rdp_privacy_accountant.compute_epsilon(self.orders, curve, delta)[0])

    def _fits(self, client: int, z: float, participations: float) -> bool:
        """Whether the client's spent loss plus ``participations`` more at z stays within its
        threshold, by the deciding accountant."""
        # no threshold (a fixed-noise baseline): nothing to compose
        if self.thresholds[client] == np.inf:
            return True
        size = int(self.client_sizes[client])
        # what the cut leaves at the threshold (poisson_truncation)
        delta = self.decision_deltas[client]
        if self.accountant == "pld":
            more = _steps_pld(
                self.step_event(size, float(z)), max(1, round(participations)) * self.steps
            )
            return (
                self._client_pld(client).compose(more).get_epsilon_for_delta(delta)
                <= self.thresholds[client]
            )
        curve = self.spent[client] + participations * self._participation(size, float(z))
        return self._epsilon(curve, delta) <= self.thresholds[client]

    def _client_pld(self, client: int) -> PrivacyLossDistribution:
        """The PLD of the client's participations, composed in the order they ran (as a
        PLDAccountant would; lazily, so an RDP ledger composes only if its PLD epsilons are asked
        for)."""
        size = int(self.client_sizes[client])
        for z in self._uncomposed[client]:
            self._history_pld[client] = self._history_pld[client].compose(
                _steps_pld(self.step_event(size, z), self.steps)
            )
        self._uncomposed[client] = []
        return self._history_pld[client]

    def _reported(self, client: int, epsilon_at) -> float:
        """The client's epsilon at ``delta`` for the steps it ran, the cut of its Poisson batches
        charged (``poisson_truncation.epsilon_with_truncation``; fixed-size steps:
        ``epsilon_at(delta)``)."""
        eta = float(self.steps_run[client] * self.step_tails[client])
        return poisson_truncation.epsilon_with_truncation(epsilon_at, self.delta, eta)

    def eligible(self, t: int) -> np.ndarray:
        """Clients whose next participation fits their threshold at the largest noise (marks the
        others stopped in round t, logged by ``stopped_round``)."""
        ok = np.array(
            [
                self.stopped_round[k] == 0 and self._fits(k, self._most_noise(k), 1)
                for k in range(len(self.spent))
            ]
        )
        self.stopped_round[(self.stopped_round == 0) & ~ok] = t
        return ok

    def _most_noise(self, client: int) -> float:
        """The largest z the client can still run at: z_max (z_0 for the fixed baseline), or its own
        fixed z once a calibrated client has chosen it (before that, its choice is at most
        z_max)."""
        return self._own_multiplier.get(client, self.grid[-1])

    def multipliers(self, client_ids, t: int) -> np.ndarray:
        """Each listed client's z for round t (the module's threshold rule)."""
        if self.calibrated:
            return np.array(
                [self._own_fixed_multiplier(int(k)) for k in np.asarray(client_ids, np.int64)],
                float,
            )
        expected = max(1.0, self.participation_rate * (self.rounds - t + 1))
        return np.array(
            [self._least_fitting(k, expected) for k in np.asarray(client_ids, np.int64)], float
        )

    def _own_fixed_multiplier(self, client: int) -> float:
        """A calibrated client's fixed z: chosen before its first participation (nothing spent yet)
        for the q T participations expected over the run, to ``CALIBRATION_TOLERANCE``, then
        kept."""
        if client not in self._own_multiplier:
            assert self.steps_run[client] == 0, (
                "a calibrated client chooses its z before its first participation"
            )
            self._own_multiplier[client] = self._least_fitting(
                client, max(1.0, self.participation_rate * self.rounds), CALIBRATION_TOLERANCE
            )
        return self._own_multiplier[client]

    def _least_fitting(self, client: int, participations: float, tolerance: float = 0.0) -> float:
        """The least z on the grid under which the client's spent loss plus ``participations`` more
        fits its threshold (z_max if none does: the stopping rule then decides); with ``tolerance``
        > 0 refined between grid points to that relative step."""
        grid = self.grid
        # budget to spare: the least noise (saves the bisection)
        if self._fits(client, grid[0], participations):
            return float(grid[0])
        if not self._fits(client, grid[-1], participations):
            return float(grid[-1])
        # grid[low] does not fit, grid[high] does; epsilon falls as z grows
        low, high = 0, len(grid) - 1
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if self._fits(client, grid[mid], participations) else (mid, high)
        low, high = float(grid[low]), float(grid[high])
        while tolerance and high / low > 1 + tolerance:
            mid = float(np.sqrt(low * high))
            low, high = (low, mid) if self._fits(client, mid, participations) else (mid, high)
        return high

    def record(self, client_ids, t: int, z=None) -> np.ndarray:
        """Composes one participation of each listed client at ``z`` (default: ``multipliers``,
        which is what the same state gives before the round); returns them."""
        z = self.multipliers(client_ids, t) if z is None else np.asarray(z, float)
        for k, zk in zip(np.asarray(client_ids, np.int64), z):
            self.spent[k] += self._participation(int(self.client_sizes[k]), float(zk))
            self.steps_run[k] += self.steps
            self.participations[k][float(zk)] = self.participations[k].get(float(zk), 0) + 1
            self._uncomposed[k].append(float(zk))
        self.multipliers_used.extend(z.tolist())
        return z

    def epsilons(self) -> np.ndarray:
        """Each client's spent epsilon at ``delta`` (0 for clients that never took part): the RDP
        ledger, or with ``accountant='pld'`` min(PLD, RDP) (module docstring)."""
        rdp = np.array(
            [
                self._reported(k, lambda d, c=c: self._epsilon(c, d)) if np.any(c) else 0.0
                for k, c in enumerate(self.spent)
            ]
        )
        if self.accountant == "rdp":
            return rdp
        return np.minimum(rdp, self.pld_epsilons())

    def pld_epsilons(self) -> np.ndarray:
        """Each client's steps composed by dp_accounting's PLD (``_client_pld``)."""
        return np.array(
            [
                self._reported(k, self._client_pld(k).get_epsilon_for_delta) if history else 0.0
                for k, history in enumerate(self.participations)
            ]
        )
