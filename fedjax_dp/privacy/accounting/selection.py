"""The privacy cost of choosing the best of several runs (Papernot and Steinke, "Hyperparameter
tuning with Renyi differential privacy", ICLR 2022).

Every tuned run looked at the clients' data, so the released (best) model leaks more than one run's
epsilon. If the number of runs K is itself random, drawn from a Poisson or a truncated negative
binomial distribution, releasing only the best run costs little more than one run (their Thm. 2 and
Thm. 6: for Poisson with mean mu, RDP at order lambda grows by about mu delta-hat + log(mu) /
(lambda - 1)), where a fixed number N of runs has no such bound and is accounted by composition
(N runs composed: the naive figure, also reported beside the selection's for comparison).

dp_accounting states it as ``dp_event.RepeatAndSelectDpEvent(event, mean, shape)`` (not exported at
its top level in 0.6): shape infinity is Poisson (the default here, their Thm. 6: the lightest tail
of the distributions they analyse, so a sweep's compute stays close to its mean; a draw of K = 0
releases nothing), shape eta in [0, inf) the truncated negative binomial TNB(eta, gamma) with gamma
solved from the mean (their Thm. 2; eta = 0: logarithmic, 1: geometric; K >= 1, heavier tails). Its
RDP accountant composes it; the project's ``events.RdpAccountant`` does so too, with the registered
events inside (``WorstOfDpEvent``: runs whose settings change the event).

On TensorFlow Federated's DP tutorial setting (Poisson sampling of 50 of 3,383 clients, 100
rounds, z = 1.0), RDP at delta 1e-5:

>>> import dp_accounting
>>> one = dp_accounting.SelfComposedDpEvent(
...     dp_accounting.PoissonSampledDpEvent(50 / 3383, dp_accounting.GaussianDpEvent(1.0)), 100)
>>> cost = selection_cost(one, 1e-5, runs="poisson", mean=10)
>>> round(cost.single, 3), round(cost.selected, 3), round(cost.composed, 3)
(1.503, 2.513, 3.129)
"""

from __future__ import annotations

import dataclasses
import math

import attr
import dp_accounting
from dp_accounting.dp_event import RepeatAndSelectDpEvent
import numpy as np
from scipy import optimize

from fedjax_dp.privacy.accounting import events
from fedjax_dp.privacy.accounting.accountant import RDP_ORDERS, _unconverged_orders_silenced

RUNS = ("poisson", "negative_binomial", "fixed")
DEFAULT_RUNS = "poisson"


def run_event(source, kind: str = "rdp") -> dp_accounting.DpEvent:
    """The ``dp_accounting`` event of one whole run, from what accounted it: a
    ``PrivacyTracker`` or its ledger (central: the rounds' events under the sampler's, composed in
    order; correlated noise: the stream's event; local: each client's Gaussian-DP book is a Gaussian
    of mu = sqrt(sum z_t^-2), so the busiest client's is ``GaussianDpEvent(1 / mu)``), an
    ``Accountant`` (its history), or a schedule of ``(RoundEvent, count)`` pairs."""
    ledger = getattr(source, "ledger", source)
    if hasattr(ledger, "events_used"):  # the central ledger: the rounds that ran
        return _compose_rounds([(e, 1) for e in ledger.events_used], kind)
    if hasattr(ledger, "account"):  # correlated noise: the whole stream is one event
        if ledger.account is None:
            return dp_accounting.NoOpDpEvent()
        return ledger.account.dp_event(kind)
    if hasattr(ledger, "clients") and getattr(ledger, "local", False):
        mu = float(np.sqrt(np.max(ledger.clients.mu_squared, initial=0.0)))
        return dp_accounting.GaussianDpEvent(1.0 / mu) if mu > 0 else dp_accounting.NoOpDpEvent()
    if hasattr(ledger, "events"):  # an Accountant
        return _compose_rounds(ledger.events, kind)
    if isinstance(source, (list, tuple)):
        return _compose_rounds(source, kind)
    raise TypeError(
        f"no run event can be read from {type(source).__name__}: give a PrivacyTracker, a ledger,"
        " an Accountant or a schedule of (RoundEvent, count) pairs"
    )


def run_relation(source) -> dp_accounting.NeighboringRelation:
    """The neighbouring relation ``run_event(source)`` is stated for: the rounds' (replace-one under
    fixed-size sampling), else add/remove-one (a per-client book's Gaussian, a stream's event)."""
    ledger = getattr(source, "ledger", source)
    rounds = getattr(ledger, "events_used", None) or [e for e, _ in getattr(ledger, "events", ())]
    if rounds:
        return rounds[0].neighboring_relation
    return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def _compose_rounds(schedule, kind: str) -> dp_accounting.DpEvent:
    """Consecutive equal rounds self-composed, the runs composed in order."""
    runs: list[list] = []
    for event, count in schedule:
        if runs and runs[-1][0] == event:
            runs[-1][1] += count
        else:
            runs.append([event, count])
    parts = [
        dp_accounting.SelfComposedDpEvent(e.dp_event(kind), n) if n > 1 else e.dp_event(kind)
        for e, n in runs
        if n
    ]
    if not parts:
        return dp_accounting.NoOpDpEvent()
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class WorstOfDpEvent(dp_accounting.DpEvent):
    """One of several mechanisms, whichever the tuning picks: its RDP at each order is the largest
    of theirs (what Papernot and Steinke's bound needs of the runs of a sweep whose settings change
    the run's event, e.g. a swept noise multiplier). ``neighboring_relation``: the relation the
    events are stated for.
    """

    events: tuple
    neighboring_relation: dp_accounting.NeighboringRelation = (
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )


def _worst_rdp(event: WorstOfDpEvent, orders) -> np.ndarray:
    curves = []
    for one in event.events:
        accountant = events.RdpAccountant(
            orders=list(orders), neighboring_relation=event.neighboring_relation
        )
        with _unconverged_orders_silenced():
            accountant.compose(one)
        curves.append(accountant.rdp)
    return np.max(curves, axis=0)


events.register_event(WorstOfDpEvent, rdp=_worst_rdp)


def worst_of(
    candidates,
    neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
) -> dp_accounting.DpEvent:
    """The one event of a run whose settings are one of ``candidates``' (equal ones merged): that
    event where they are all equal, else their ``WorstOfDpEvent``."""
    distinct = list(dict.fromkeys(candidates))
    if len(distinct) == 1:
        return distinct[0]
    return WorstOfDpEvent(tuple(distinct), neighboring_relation)


def rdp_epsilon(
    event: dp_accounting.DpEvent,
    delta: float,
    orders=RDP_ORDERS,
    neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
) -> float:
    """epsilon at ``delta`` of ``event`` by the RDP accountant (the project's, which composes the
    registered events too); inf where nothing private bounds it."""
    accountant = events.RdpAccountant(
        orders=list(orders), neighboring_relation=neighboring_relation
    )
    if not accountant.supports(event):
        raise ValueError(f"the RDP accountant cannot compose {event}")
    with _unconverged_orders_silenced():
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def check_runs(runs: str, mean: float, shape: float | None = None) -> None:
    """Refuses an unknown way of counting runs, a mean below one run, or a negative shape."""
    if runs not in RUNS:
        raise ValueError(f"runs={runs!r} unknown; choose one of {RUNS}")
    if runs == "fixed":
        if not (float(mean).is_integer() and mean >= 1):
            raise ValueError(f"a fixed number of runs is an integer >= 1, got {mean}")
        return
    if not (math.isfinite(mean) and mean >= 1):
        raise ValueError(f"the mean number of runs must be a finite number >= 1, got {mean}")
    if runs == "negative_binomial" and not (shape is not None and 0 <= shape < math.inf):
        raise ValueError(
            f"the truncated negative binomial's shape eta must be finite and >= 0, got {shape}"
        )


def tnb_gamma(mean: float, shape: float) -> float:
    """gamma of the truncated negative binomial TNB(eta = ``shape``, gamma) whose mean is ``mean``
    (Papernot and Steinke, Sec. 2: mean = eta (1 - gamma) / (gamma (1 - gamma^eta)); eta = 0, the
    logarithmic distribution: (1 - gamma) / (gamma log(1 / gamma))); 1 where the mean is one run."""
    if mean <= 1:
        return 1.0

    def mean_at(gamma):
        if shape == 0:
            return (1 - gamma) / (gamma * math.log(1 / gamma))
        return shape * (1 - gamma) / (gamma * (1 - gamma**shape))

    return float(optimize.brentq(lambda g: mean_at(g) - mean, 1e-12, 1 - 1e-12, xtol=1e-14))


def draw_num_runs(
    rng: np.random.Generator, runs: str, mean: float, shape: float | None = None
) -> int:
    """The number of runs K as Papernot and Steinke prescribe it: Poisson(mean) (K = 0 is possible:
    then nothing is released), TNB(eta, gamma) with the given mean (K >= 1), or ``mean`` itself for
    a fixed grid."""
    check_runs(runs, mean, shape)
    if runs == "fixed":
        return int(mean)
    if runs == "poisson":
        return int(rng.poisson(mean))
    gamma = tnb_gamma(mean, shape)
    if gamma >= 1:
        return 1
    if shape == 0:  # logarithmic: P[K = k] proportional to (1 - gamma)^k / k
        return int(rng.logseries(1 - gamma))
    while True:  # the negative binomial conditioned on K >= 1
        k = int(rng.negative_binomial(shape, gamma))
        if k >= 1:
            return k


@dataclasses.dataclass(frozen=True)
class SelectionCost:
    """What releasing the best of several runs costs, each run costing ``single``.

    Attributes:
      single: epsilon of one run.
      selected: epsilon of the released (best) model: ``RepeatAndSelectDpEvent`` for a random
        number of runs, the composition of the ``num_runs`` runs for a fixed grid.
      composed: the naive figure: ``num_runs`` runs composed (a random count: its mean rounded up).
      runs: 'poisson', 'negative_binomial' or 'fixed'.
      mean: the mean number of runs (a fixed grid: its size).
      shape: the truncated negative binomial's eta (inf for Poisson, None for a fixed grid).
      num_runs: the number of runs ``composed`` counts.
      delta: the delta of every figure.
      accounting: how ``selected`` is accounted, in words.
    """

    single: float
    selected: float
    composed: float
    runs: str
    mean: float
    shape: float | None
    num_runs: int
    delta: float
    accounting: str

    def as_dict(self) -> dict:
        """The fields as a JSON-ready dict (inf as None)."""
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in dataclasses.asdict(self).items()
        }


def selection_event(
    event: dp_accounting.DpEvent, runs: str, mean: float, shape: float | None = None
) -> dp_accounting.DpEvent:
    """The event of releasing the best of ``runs``-many runs of ``event``: RepeatAndSelect for a
    random count, the self-composition of the ``mean`` runs for a fixed grid."""
    check_runs(runs, mean, shape)
    if runs == "fixed":
        return dp_accounting.SelfComposedDpEvent(event, int(mean))
    return RepeatAndSelectDpEvent(
        event, float(mean), math.inf if runs == "poisson" else float(shape)
    )


def selection_cost(
    event: dp_accounting.DpEvent,
    delta: float,
    runs: str = DEFAULT_RUNS,
    mean: float = 10,
    shape: float | None = None,
    orders=RDP_ORDERS,
    neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
) -> SelectionCost:
    """One run's epsilon, the released model's, and the naive composition (``SelectionCost``) for
    runs each releasing ``event``, at ``delta`` by RDP (``RepeatAndSelectDpEvent`` is composed by
    RDP only). ``runs``: 'poisson' (default; ``mean`` runs on average), 'negative_binomial'
    (TNB(``shape``, gamma) of mean ``mean``) or 'fixed' (exactly ``mean`` runs, accounted by
    composition). ``neighboring_relation``: the relation ``event`` is stated for (replace-one for
    fixed-size sampling)."""
    check_runs(runs, mean, shape)
    count = max(1, math.ceil(mean))

    def epsilon(e):
        return rdp_epsilon(e, delta, orders, neighboring_relation)

    single = epsilon(event)
    composed = epsilon(dp_accounting.SelfComposedDpEvent(event, count))
    if runs == "fixed":
        selected = composed
        how = (
            f"a fixed grid of {count} runs: accounted by composition (a fixed number of runs has"
            " no selection bound; Papernot and Steinke 2022)"
        )
    else:
        selected = epsilon(selection_event(event, runs, mean, shape))
        law = (
            f"Poisson(mean {mean:g})"
            if runs == "poisson"
            else f"truncated negative binomial (eta {shape:g}, mean {mean:g})"
        )
        how = (
            f"best of a {law} number of runs: RepeatAndSelectDpEvent by RDP (Papernot and Steinke"
            " 2022)"
        )
    return SelectionCost(
        single,
        selected,
        composed,
        runs,
        float(mean),
        None if runs == "fixed" else (math.inf if runs == "poisson" else float(shape)),
        count,
        delta,
        how,
    )
