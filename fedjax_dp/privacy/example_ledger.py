"""Per-client example-level ledgers with cumulative privacy-loss thresholds (seed 003, the local
mini-batch gradient DP patent; ALGORITHMS.md Sec. 3).

Unit and relation: one example of one client's local data, replace-one (the client's data size n_k is
public). Every local step draws B of the client's n_k examples without replacement
(``data.packing.pack_sampled_cohort``) and releases a clipped gradient plus N(0, (z C)^2 I), so one
step is ``RoundEvent("fixed", z, population=n_k, cohort_size=B)``: the subsampled Gaussian of
dp_accounting (RDP, Wang-Balle-Kasiviswanathan, sensitivity 2C). A client's loss is the RDP
composition of the steps it actually ran, converted at ``delta``; the guarantee holds whatever the
server does with the uploads (they are post-processing of the noised steps).

The threshold rule (the patent's formula is an image missing from its text; this is the reading
implemented): client n has a threshold epsilon_n. Before each participation in round t it takes the
smallest noise multiplier z on a geometric grid [z_0, z_max] such that its spent RDP curve plus the
participations it still expects, R = max(1, q (T - t + 1)) participations of S steps at z, stays
within epsilon_n. Early on, with budget to spare, that is z_0 (the least noise); as the spent loss
approaches the threshold, or a client takes part more often than expected, R participations fit
only under more noise, so z rises. A client whose next participation would exceed epsilon_n even at
z_max is no longer sampled (eligibility depends only on past sampling and public sizes, never on
data), so no client ever exceeds its threshold. ``adaptive=False`` keeps z = z_0 (the fixed-noise
baseline) with the same stopping rule.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from fedjax_dp.privacy.accounting import RoundEvent, event_rdp, check_delta, check_rdp_orders

GRID_POINTS = 32
LEDGER_ORDERS = (1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 128.0)
"""The RDP orders of the per-client ledgers: a subsampled-without-replacement Gaussian costs about 30 ms
per (n_k, z) on these 18 orders against 0.5 s on ``RDP_ORDERS``; a coarser grid can only raise epsilon
(conservative). ``ldp.rdp_orders`` chooses another."""


@dataclasses.dataclass
class ExampleLevelLedger:
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

    def __post_init__(self):
        check_delta(self.delta)
        self.orders = check_rdp_orders(self.orders)
        self.client_sizes = np.asarray(self.client_sizes, np.int64)
        self.thresholds = np.broadcast_to(np.asarray(self.thresholds, float), self.client_sizes.shape).copy()
        if not np.all(self.thresholds > 0):
            raise ValueError(f"every client's threshold epsilon_n must be > 0, got min {self.thresholds.min()}")
        if not 0 < self.base_multiplier <= self.max_multiplier:
            raise ValueError(f"need 0 < z_0 <= z_max, got z_0={self.base_multiplier}, z_max={self.max_multiplier}")
        if np.any(self.client_sizes < self.batch_size):
            small = np.flatnonzero(self.client_sizes < self.batch_size)
            raise ValueError(f"batch size B={self.batch_size} is larger than the data of clients {small[:10].tolist()} "
                             f"({self.client_sizes[small[:10]].tolist()} examples)")
        self.grid = (np.geomspace(self.base_multiplier, self.max_multiplier, GRID_POINTS) if self.adaptive
                     else np.array([self.base_multiplier]))
        self.spent = np.zeros((len(self.client_sizes), len(self.orders)))
        self.steps_run = np.zeros(len(self.client_sizes), np.int64)
        self.stopped_round = np.zeros(len(self.client_sizes), np.int64)  # 0: still contributing
        self.multipliers_used: list[float] = []
        self._curves: dict[tuple[int, float], np.ndarray] = {}

    def _participation(self, size: int, z: float) -> np.ndarray:
        """RDP curve of one participation (S steps) of a client holding ``size`` examples, at z (cached:
        the sizes and the noise grid are few)."""
        if (size, z) not in self._curves:
            event = RoundEvent("fixed", z, population=size, cohort_size=self.batch_size)
            self._curves[size, z] = self.steps * np.asarray(event_rdp(event, self.orders))
        return self._curves[size, z]

    def _epsilon(self, curve: np.ndarray) -> float:
        return float(rdp_privacy_accountant.compute_epsilon(self.orders, curve, self.delta)[0])

    def _fits(self, client: int, z: float, participations: float) -> bool:
        curve = self.spent[client] + participations * self._participation(int(self.client_sizes[client]), float(z))
        return self._epsilon(curve) <= self.thresholds[client]

    def eligible(self, t: int) -> np.ndarray:
        """Clients whose next participation fits their threshold at the largest noise (marks the others
        stopped in round t, logged by ``stopped_round``)."""
        ok = np.array([self.stopped_round[k] == 0 and self._fits(k, self.grid[-1], 1) for k in range(len(self.spent))])
        self.stopped_round[(self.stopped_round == 0) & ~ok] = t
        return ok

    def multipliers(self, client_ids, t: int) -> np.ndarray:
        """Each listed client's z for round t (the module's threshold rule)."""
        expected = max(1.0, self.participation_rate * (self.rounds - t + 1))
        out = []
        for k in np.asarray(client_ids, np.int64):
            low, high = -1, len(self.grid) - 1  # epsilon falls as z grows: bisect for the first z that fits
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (low, mid) if self._fits(k, self.grid[mid], expected) else (mid, high)
            out.append(self.grid[high])
        return np.array(out, float)

    def record(self, client_ids, t: int, z=None) -> np.ndarray:
        """Composes one participation of each listed client at ``z`` (default: ``multipliers``, which is
        what the same state gives before the round); returns them."""
        z = self.multipliers(client_ids, t) if z is None else np.asarray(z, float)
        for k, zk in zip(np.asarray(client_ids, np.int64), z):
            self.spent[k] += self._participation(int(self.client_sizes[k]), float(zk))
            self.steps_run[k] += self.steps
        self.multipliers_used.extend(z.tolist())
        return z

    def epsilons(self) -> np.ndarray:
        """Each client's spent epsilon at ``delta`` (0 for clients that never took part)."""
        return np.array([self._epsilon(c) if np.any(c) else 0.0 for c in self.spent])
