"""Privacy accounting for client-level DP-FL, built on Google's ``dp_accounting`` (no hand-written
moments accountant).

A round is a ``RoundEvent``: the sampling scheme, its rate and the Gaussian noise multiplier
z = (noise std on the sum) / S. It maps to a ``dp_accounting`` event and neighbouring relation that
match the sampling actually run (ALGORITHMS.md Sec. 1, 5):

* ``poisson``: each client joins with probability q; add/remove-one neighbours; the server must
  divide by the fixed expected cohort q K. ``PoissonSampledDpEvent`` (RDP and PLD).
* ``fixed``: exactly m of K clients without replacement; replace-one neighbours, under which the
  clipped sum's sensitivity is 2S. RDP: ``SampledWithoutReplacementDpEvent`` (Wang, Balle and
  Kasiviswanathan 2019). PLD: dp_accounting has no such event, so the Dong-Roth-Su reduction is used
  (Dong, Roth and Su 2019, Thm. 9: sampling m of K without replacement under replace-one turns a
  mechanism with trade-off f into C_p(f) = min{f_p, f_p^-1}**, p = m/K, f_p = p f + (1 - p) Id; Zhu,
  Dong and Wang 2022 give the matching dominating pair (N(0,1), (1-p) N(0,1) + p N(2/z,1)) in both
  directions). That pair is exactly the one dp_accounting's PLD composes for a Poisson-subsampled
  add/remove Gaussian of rate p and multiplier z/2, so the fixed-size PLD event is that.
* ``full``: every client every round (q = 1): a plain Gaussian, add/remove-one.

dp_accounting 0.6 normalises the noise multiplier of a replace-one event by the per-client bound S
rather than by the sensitivity 2S, which under-reports RDP fourfold (google/differential-privacy
issue #378). ``replace_one_scale()`` detects at run time which convention the installed version
uses (it composes a q = 1 event whose exact RDP is known) and rescales, so the result stays right
whether or not the library is fixed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Iterable

import dp_accounting
from absl import logging as absl_logging
from dp_accounting import rdp
from dp_accounting.rdp import rdp_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from fedjax_dp.privacy.accounting import events
from fedjax_dp.privacy.accounting.cached_pld import CachedPldAccountant

SAMPLINGS = ("poisson", "fixed", "full")
ACCOUNTANTS = ("rdp", "pld")


class _OrderGrid(tuple):
    """The default RDP order grid: a tuple whose repr is its name, so that a signature that defaults
    to it (``Accountant``'s, in ``help`` and the API reference) does not list every order."""

    def __repr__(self) -> str:
        return "RDP_ORDERS"


RDP_ORDERS = _OrderGrid(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [80, 96, 128, 256, 512, 1024]
)


@dataclasses.dataclass(frozen=True, eq=False)
class RoundEvent:
    """One round at client level: the sampler's part (who could be in the cohort) and the
    mechanism's part (what one application on the cohort releases), as dp_accounting composes them.

    Attributes:
      sampling: 'poisson', 'fixed' or 'full'.
      noise_multiplier: z of a Gaussian mechanism (noise std on the clipped sum / per-client clip
        norm S); nan where the mechanism is not Gaussian.
      sampling_rate: q for 'poisson'; ignored otherwise.
      population: K (for 'fixed').
      cohort_size: m (for 'fixed').
      mechanism: the ``dp_accounting`` event of the round's releases on the cohort, stated for
        add/remove-one (``Release.event``); None: the Gaussian of ``noise_multiplier``.
    """

    sampling: str
    noise_multiplier: float = math.nan
    sampling_rate: float = 1.0
    population: int = 0
    cohort_size: int = 0
    mechanism: dp_accounting.DpEvent | None = None

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling {self.sampling!r} unknown; choose one of {SAMPLINGS}")
        if self.mechanism is None:
            if not self.noise_multiplier >= 0 or not math.isfinite(self.noise_multiplier):
                raise ValueError(
                    f"noise multiplier must be >= 0 and finite, got {self.noise_multiplier}"
                )
            object.__setattr__(self, "mechanism", gaussian_mechanism(self.noise_multiplier))
        elif not isinstance(self.mechanism, dp_accounting.DpEvent):
            raise TypeError(
                f"a round's mechanism is a dp_accounting DpEvent, got {self.mechanism!r}"
            )
        else:
            object.__setattr__(self, "noise_multiplier", multiplier_of(self.mechanism))
        if self.sampling == "poisson" and not 0 < self.sampling_rate <= 1:
            raise ValueError(f"sampling rate q must lie in (0, 1], got {self.sampling_rate}")
        if self.sampling == "fixed" and not 1 <= self.cohort_size <= self.population:
            raise ValueError(
                "fixed-size sampling needs 1 <= cohort_size <= population, "
                f"got cohort_size={self.cohort_size}, population={self.population}"
            )

    def _key(self) -> tuple:
        return (
            self.sampling,
            repr(self.mechanism),
            self.sampling_rate,
            self.population,
            self.cohort_size,
        )

    def __eq__(self, other) -> bool:
        return isinstance(other, RoundEvent) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def gaussian(self) -> bool:
        """Whether the round's mechanism is a Gaussian (or releases nothing private)."""
        return isinstance(self.mechanism, GAUSSIAN_LIKE)

    @property
    def rate(self) -> float:
        """The fraction of clients sampled (q, or m / K)."""
        if self.sampling == "poisson":
            return self.sampling_rate
        if self.sampling == "fixed":
            return self.cohort_size / self.population
        return 1.0

    @property
    def neighboring_relation(self) -> NeighboringRelation:
        return (
            NeighboringRelation.REPLACE_ONE
            if self.sampling == "fixed"
            else NeighboringRelation.ADD_OR_REMOVE_ONE
        )

    def dp_event(self, kind: str = "rdp") -> dp_accounting.DpEvent:
        """The dp_accounting event of this round for accountant ``kind`` (fixed-size sampling under
        PLD: the Dong-Roth-Su reduction, see the module docstring)."""
        inner = self.mechanism
        if isinstance(inner, (dp_accounting.NonPrivateDpEvent, dp_accounting.NoOpDpEvent)):
            return inner
        if self.sampling == "poisson":
            if self.sampling_rate == 1 and not self.gaussian:
                return inner  # nothing sampled: the mechanism itself (RDP has no sampled Laplace)
            return dp_accounting.PoissonSampledDpEvent(self.sampling_rate, inner)
        if self.sampling == "fixed":
            doubled = events.at_double_sensitivity(inner)
            if doubled is None:  # no replace-one form known: an event no accountant composes
                return dp_accounting.UnsupportedDpEvent()
            if kind == "pld":
                return dp_accounting.PoissonSampledDpEvent(self.rate, doubled)
            if self.gaussian:
                inner = dp_accounting.GaussianDpEvent(self.noise_multiplier * replace_one_scale())
            return dp_accounting.SampledWithoutReplacementDpEvent(
                self.population, self.cohort_size, inner
            )
        return inner


GAUSSIAN_LIKE = (dp_accounting.GaussianDpEvent, dp_accounting.NonPrivateDpEvent)


def gaussian_mechanism(noise_multiplier: float) -> dp_accounting.DpEvent:
    """The Gaussian of ``noise_multiplier`` relative to its sensitivity (no noise: non-private)."""
    if noise_multiplier <= 0:
        return dp_accounting.NonPrivateDpEvent()
    return dp_accounting.GaussianDpEvent(float(noise_multiplier))


def multiplier_of(event: dp_accounting.DpEvent) -> float:
    """z of a Gaussian event, 0 for a non-private one, nan for any other mechanism."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return float(event.noise_multiplier)
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return 0.0
    return math.nan


class UnsupportedEventError(ValueError):
    """An event the chosen accountant cannot compose (dp_accounting's accountants refuse it too)."""


@functools.lru_cache(maxsize=1)
def replace_one_scale() -> float:
    """Factor applied to z in replace-one events so that dp_accounting sees sensitivity 2S.

    With q = 1 a replace-one subsampled Gaussian is a Gaussian of sensitivity 2S and std zS, whose
    RDP is alpha * 4 / (2 z^2): the same as an add/remove Gaussian with multiplier z / 2. Returns
    0.5 if the installed dp_accounting normalises by S (issue #378) and 1.0 if it already uses 2S.
    """
    z = 2.0
    fixed = rdp.RdpAccountant(orders=[2.0], neighboring_relation=NeighboringRelation.REPLACE_ONE)
    fixed.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(4, 4, dp_accounting.GaussianDpEvent(z))
    )
    right = rdp.RdpAccountant(orders=[2.0])
    right.compose(dp_accounting.GaussianDpEvent(z / 2))
    eps_fixed, eps_right = fixed.get_epsilon(1e-5), right.get_epsilon(1e-5)
    if math.isclose(eps_fixed, eps_right, rel_tol=1e-6):
        return 1.0
    buggy = rdp.RdpAccountant(orders=[2.0])
    buggy.compose(dp_accounting.GaussianDpEvent(z))
    if math.isclose(eps_fixed, buggy.get_epsilon(1e-5), rel_tol=1e-6):
        return 0.5
    raise RuntimeError(
        "unrecognised replace-one normalisation in dp_accounting; refusing to account"
    )


PLD_DISCRETIZATION = 1e-4
"""Default value discretisation of the PLD accountant (dp_accounting's
``value_discretization_interval``): pessimistic, so epsilon is over-reported by about this much per
composition step (1e-3 over-reported 1.4 % at 10^4 rounds and up to 4x below epsilon 0.05)."""


PLD_CEILING = 500.0
"""Above this RDP epsilon (at delta 1e-5) a history's PLD is not built: its support spans about
epsilon / discretisation points per round before composition (a round at z = 0.03 needs more than 6
GB composed ten times, at z = 1e-6 petabytes), and at such an epsilon no refinement matters. The PLD
accountant then answers with RDP's figure, also dp_accounting's upper bound, and says so
(``Accountant.pld_replaced``)."""


def check_rdp_orders(orders) -> tuple:
    """``orders`` as a sorted tuple of floats > 1 (an error naming the bad value otherwise)."""
    orders = tuple(sorted(float(a) for a in orders))
    if not orders or not all(a > 1 and math.isfinite(a) for a in orders):
        raise ValueError(
            f"RDP orders must be a non-empty list of finite numbers > 1, got {orders!r}"
        )
    return orders


def parse_rdp_orders(text: str, default: tuple = RDP_ORDERS) -> tuple:
    """A configured order grid: "" is ``default``, else comma-separated orders > 1 ("2,4,8,16")."""
    if not str(text).strip():
        return default
    return check_rdp_orders(float(a) for a in str(text).split(","))


def make_accountant(
    kind: str,
    neighboring_relation: NeighboringRelation,
    pld_discretization: float = PLD_DISCRETIZATION,
    rdp_orders=RDP_ORDERS,
):
    """A dp_accounting accountant for events of ``RoundEvent.dp_event(kind)`` under
    ``neighboring_relation`` (replace-one under PLD composes the Dong-Roth-Su events, which are
    add/remove Poisson events; PLD: ``cached_pld.CachedPldAccountant``, dp_accounting's with each
    round's mechanism PLD built once), both also composing the project's registered events
    (``events``)."""
    if kind == "rdp":
        return events.RdpAccountant(
            orders=list(check_rdp_orders(rdp_orders)), neighboring_relation=neighboring_relation
        )
    if kind == "pld":
        if not 0 < pld_discretization <= 0.1:
            raise ValueError(f"PLD discretisation must lie in (0, 0.1], got {pld_discretization!r}")
        return CachedPldAccountant(
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            value_discretization_interval=pld_discretization,
        )
    raise ValueError(f"accountant {kind!r} unknown; choose one of {ACCOUNTANTS}")


def relation_for(event: RoundEvent, kind: str) -> NeighboringRelation:
    """The relation accountant ``kind`` composes ``event`` under (PLD: add/remove-one always, the
    fixed-size reduction included)."""
    return event.neighboring_relation if kind == "rdp" else NeighboringRelation.ADD_OR_REMOVE_ONE


@functools.lru_cache(maxsize=512)
def supports(event: RoundEvent, kind: str) -> bool:
    """Whether accountant ``kind`` can compose ``event`` (dp_accounting's ``supports``, with the
    registered events)."""
    return make_accountant(kind, relation_for(event, kind)).supports(event.dp_event(kind))


def check_supported(event: RoundEvent, kind: str) -> None:
    """Raises ``UnsupportedEventError`` naming the event and the accountants that could compose
    it."""
    if supports(event, kind):
        return
    able = [other for other in ACCOUNTANTS if other != kind and supports(event, other)]
    could = f"the {' or '.join(able)} accountant can" if able else "no accountant here can"
    raise UnsupportedEventError(
        f"the {kind} accountant cannot compose {event.dp_event(kind)} ({event.sampling} sampling"
        f" of {event.mechanism}); {could}"
    )


@functools.lru_cache(maxsize=256)
def event_rdp(event: RoundEvent, orders: tuple = RDP_ORDERS):
    """RDP curve (over ``orders``) of one round, computed once per distinct event."""
    check_supported(event, "rdp")
    acc = events.RdpAccountant(orders=list(orders), neighboring_relation=event.neighboring_relation)
    with _unconverged_orders_silenced():
        acc.compose(event.dp_event())
    return acc.rdp


@contextlib.contextmanager
def _unconverged_orders_silenced():
    """dp_accounting logs a warning for each fractional RDP order whose series does not converge and
    drops that order (its RDP becomes inf, which the conversion ignores): expected, not actionable,
    and ~60 lines per calibration. Silenced at ERROR for the duration."""
    level = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(level)


@functools.lru_cache(maxsize=4)
def _composed_pld(events: tuple, discretization: float):
    """dp_accounting's PLD accountant after the (event, count) runs of ``events``."""
    accountant = make_accountant("pld", events[0][0].neighboring_relation, discretization)
    for event, count in events:
        accountant.compose(event.dp_event("pld"), count)
    return accountant


def _rdp_curve(events, orders):
    """The RDP curve at ``orders`` of the (event, count) runs ``events``."""
    return sum(count * event_rdp(event, orders) for event, count in events)


@functools.lru_cache(maxsize=1024)
def _past_pld_ceiling(events: tuple, orders: tuple) -> bool:
    """Whether the RDP epsilon (delta 1e-5) of the (event, count) runs ``events`` passes
    ``PLD_CEILING``; False where RDP cannot compose them. Once per history, as ``_pld_epsilon``."""
    if not all(supports(event, "rdp") for event, _ in events):
        return False
    curve = _rdp_curve(events, orders)
    return rdp_privacy_accountant.compute_epsilon(orders, curve, 1e-5)[0] > PLD_CEILING


@functools.lru_cache(maxsize=1024)
def _pld_epsilon(events: tuple, discretization: float, delta: float) -> float:
    """The PLD epsilon at ``delta`` after ``events``, once per process: seeds of one config compose
    the same events round by round and ask the same question (the same number, computed once)."""
    return float(_composed_pld(events, discretization).get_epsilon(delta))


class Accountant:
    """A running client-level accountant over a schedule of rounds (constant or per-round (q_t,
    z_t)).

    RDP: the curve of each distinct round event is computed once (dp_accounting) over ``rdp_orders``
    and composition is their weighted sum, converted with dp_accounting's ``compute_epsilon`` /
    ``compute_delta`` (the best order of the grid; a finer or wider grid can only lower epsilon).
    PLD: dp_accounting's ``PLDAccountant``, built when a figure is asked for, composing each run of
    equal rounds by self-composition (one FFT power, about a second at discretisation 1e-4 whatever
    the run's length, where composing round by round costs that every round); the last few
    histories are cached, so a budget check before a round and the epsilon after it build it once.

    100 rounds of Poisson sampling at q = 0.1 with z = 1, and the same rounds with exactly m = 100
    of K = 1000 clients (replace-one neighbours: the clipped sum moves by 2S, so the same z buys far
    less):

    >>> poisson = RoundEvent("poisson", 1.0, sampling_rate=0.1)
    >>> round(Accountant("rdp").compose(poisson, count=100).epsilon(1e-5), 2)
    7.9
    >>> fixed = RoundEvent("fixed", 1.0, population=1000, cohort_size=100)
    >>> round(Accountant("rdp").compose(fixed, count=100).epsilon(1e-5), 1)
    83.9
    """

    def __init__(
        self,
        kind: str = "rdp",
        pld_discretization: float = PLD_DISCRETIZATION,
        rdp_orders=RDP_ORDERS,
    ):
        if kind not in ACCOUNTANTS:
            raise ValueError(f"accountant {kind!r} unknown; choose one of {ACCOUNTANTS}")
        self.kind, self.pld_discretization = kind, pld_discretization
        self.rdp_orders = check_rdp_orders(rdp_orders)
        self.rounds = 0
        self.events: list[tuple[RoundEvent, int]] = []
        self._relation = None

    def compose(self, event: RoundEvent | dp_accounting.DpEvent, count: int = 1) -> "Accountant":
        """Adds ``count`` rounds of ``event`` to the history and returns this accountant (so calls
        chain). ``event``: a ``RoundEvent``, or a dp_accounting event composed as it stands under
        add/remove-one (a sampler's own event). Refuses an event this kind of accountant cannot
        compose (``UnsupportedEventError``), and mixing Poisson or full participation
        (add/remove-one neighbours) with fixed-size sampling (replace-one) in one history: their
        epsilons are not comparable."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if not isinstance(event, RoundEvent):
            event = RoundEvent("full", mechanism=event)
        check_supported(event, self.kind)
        if self._relation is None:
            self._relation = event.neighboring_relation
        elif event.neighboring_relation != self._relation:
            raise ValueError(
                "cannot mix Poisson/full and fixed-size sampling in one accountant (different"
                " neighbouring relations)"
            )
        if count:
            self.rounds += count
            if self.events and self.events[-1][0] == event:
                self.events[-1] = (event, self.events[-1][1] + count)
            else:
                self.events.append((event, count))
        return self

    @property
    def pld_replaced(self) -> bool:
        """Whether this PLD accountant answers with RDP's figures: its history's RDP epsilon passes
        ``PLD_CEILING`` (a history RDP cannot compose keeps the PLD)."""
        if self.kind != "pld" or not self.events:
            return False
        return _past_pld_ceiling(tuple(self.events), self.rdp_orders)

    def epsilon(self, delta: float) -> float:
        """The epsilon the composed rounds satisfy at ``delta``, as this accountant certifies it (0
        before any round): RDP's conversion at the best order of the grid, or the PLD's, which is
        pessimistic by about the discretisation per round."""
        check_delta(delta)
        if not self.events:
            return 0.0
        if self.kind == "pld" and not self.pld_replaced:
            return _pld_epsilon(tuple(self.events), self.pld_discretization, float(delta))
        return float(
            rdp_privacy_accountant.compute_epsilon(
                self.rdp_orders, _rdp_curve(self.events, self.rdp_orders), delta
            )[0]
        )

    def delta(self, epsilon: float) -> float:
        """The delta the composed rounds satisfy at ``epsilon``, as this accountant certifies it (0
        before any round): the inverse question of ``epsilon``, for a budget stated as a largest
        delta at a fixed epsilon."""
        check_epsilon(epsilon)
        if not self.events:
            return 0.0
        if self.kind == "pld" and not self.pld_replaced:
            return float(
                _composed_pld(tuple(self.events), self.pld_discretization).get_delta(epsilon)
            )
        return float(
            rdp_privacy_accountant.compute_delta(
                self.rdp_orders, _rdp_curve(self.events, self.rdp_orders), epsilon
            )[0]
        )

    def copy_with(self, event: RoundEvent | dp_accounting.DpEvent, count: int = 1) -> "Accountant":
        """A new accountant with this one's history plus ``count`` more rounds (nothing mutated)."""
        other = Accountant(self.kind, self.pld_discretization, self.rdp_orders)
        for past, n in self.events:
            other.compose(past, n)
        return other.compose(event, count)


def check_epsilon(epsilon: float):
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon}")


def check_delta(delta: float):
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")


def epsilon_of(
    events: Iterable[tuple[RoundEvent, int]],
    delta: float,
    kind: str = "rdp",
    pld_discretization: float = PLD_DISCRETIZATION,
) -> float:
    """epsilon at ``delta`` of a schedule given as (event, number of rounds) pairs."""
    acc = Accountant(kind, pld_discretization)
    for event, count in events:
        acc.compose(event, count)
    return acc.epsilon(delta)
