"""dp_accounting's PLD accountant with the PLD of each Poisson-subsampled Gaussian round built once.

``PLDAccountant.compose(PoissonSampledDpEvent(q, GaussianDpEvent(z)), count)`` builds the round's
PLD from the mechanism (``from_gaussian_mechanism``), self-composes it ``count`` times and composes
that onto the history. A run asks for epsilon after many rounds, each time of a longer history of
the same round, and building the mechanism's PLD was about 60 % of each query (2-core CPU,
discretisation 1e-4: 0.79 s of 1.38 s at q = 0.2, z = 0.8; 0.36 s of 0.53 s at q = 0.01, z = 1).
``CachedPldAccountant`` keeps that PLD (``subsampled_gaussian_pld``, an LRU cache; PLDs are
immutable) and performs the parent's remaining operations unchanged and in the same order, so every
epsilon and delta is the parent's to the bit (tested); every other event goes to the parent.

What remained of each query was mostly the self-composition's truncation bounds:
``dp_accounting.pld.common.compute_self_convolve_bounds`` takes a Chernoff bound at 40 orders, each
a log-sum-exp over the whole single-round PMF (about 0.14 s per direction at discretisation 1e-4 on
a 2-core CPU, 0.28 s of each round's 0.34 s query), although those log moment generating functions
depend on the PMF alone, not on the number of rounds. ``ChernoffBounds`` computes them once per PMF
and the bounds from them exactly as dp_accounting does; it stands in for dp_accounting's function
only while this accountant self-composes a cached mechanism (``self_compose``), so nothing else in
the process is touched.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref

import dp_accounting
import numpy as np
from dp_accounting import privacy_accountant
from dp_accounting.pld import common, pld_privacy_accountant, privacy_loss_distribution
from scipy import special

from fedjax_dp.privacy.accounting import events


def build_subsampled_gaussian_pld(
    noise_multiplier: float,
    sampling_probability: float,
    neighboring_relation: dp_accounting.NeighboringRelation,
    discretization: float,
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of one Poisson-subsampled Gaussian round, as ``PLDAccountant`` builds it."""
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        value_discretization_interval=discretization,
        sampling_prob=sampling_probability,
        neighboring_relation=neighboring_relation,
    )


# MBs each at 1e-4
subsampled_gaussian_pld = functools.lru_cache(maxsize=8)(build_subsampled_gaussian_pld)


class CachedPldAccountant(pld_privacy_accountant.PLDAccountant):
    """``PLDAccountant`` whose Poisson-subsampled Gaussian events reuse
    ``subsampled_gaussian_pld``."""

    def _maybe_compose(self, event: dp_accounting.DpEvent, count: int, do_compose: bool):
        if (
            do_compose
            and isinstance(event, dp_accounting.PoissonSampledDpEvent)
            and isinstance(event.event, dp_accounting.GaussianDpEvent)
            and event.sampling_probability > 0
            and event.event.noise_multiplier > 0
        ):
            mechanism = subsampled_gaussian_pld(
                float(event.event.noise_multiplier),
                float(event.sampling_probability),
                self.neighboring_relation,
                self._value_discretization_interval,
            )
            self._pld = self._pld.compose(self_compose(mechanism, count))
            return None
        registered = self._registered_pld(event)
        if registered is None:
            return super()._maybe_compose(event, count, do_compose)
        if isinstance(registered, str):
            return privacy_accountant.PrivacyAccountant.CompositionErrorDetails(
                invalid_event=event, error_message=registered
            )
        if do_compose:
            self._pld = self._pld.compose(self_compose(registered(), count))
        return None

    def _registered_pld(self, event):
        """None for dp_accounting's events; for a registered one (``events``) a thunk of its PLD,
        or why it is refused."""
        inner, q = event, None
        if isinstance(event, dp_accounting.PoissonSampledDpEvent):
            inner, q = event.event, event.sampling_probability
        rule = events.rule_of(inner)
        if rule is None:
            return None
        step = self._value_discretization_interval
        if q is None and rule.pld is not None:
            return lambda: rule.pld(inner, step)
        if q is not None and rule.poisson_pld is not None:
            return lambda: rule.poisson_pld(inner, q, step)
        sampled = "Poisson-subsampled " if q is not None else ""
        return f"no PLD is registered for the {sampled}{type(inner).__name__}"


class ChernoffBounds:
    """``common.compute_self_convolve_bounds`` (dp_accounting 0.4-0.6) with the log moment
    generating functions of each input PMF computed once (module docstring): the same orders, the
    same arithmetic in the same order, so the same bounds to the bit (tested against dp_accounting's
    function). Anything but dp_accounting's default call (its own orders, no truncation, a non-array
    list) goes to ``original``."""

    MAX_PMFS = 64  # entries of PMFs no longer alive are dropped past this many

    def __init__(self, original):
        self.original = original
        # id(pmf) -> (weak reference to it, orders, their log-MGFs)
        self._log_mgfs: dict[int, tuple] = {}

    def __call__(self, input_list, num_times, tail_mass_truncation=0, orders=None):
        if (
            orders is not None
            or tail_mass_truncation == 0
            or not isinstance(input_list, np.ndarray)
        ):
            return self.original(input_list, num_times, tail_mass_truncation, orders)
        _, orders, log_mgfs = self._moments(input_list)
        upper_bound = (len(input_list) - 1) * num_times
        lower_bound = 0
        for order, log_mgf_value in zip(orders, log_mgfs):
            bound = (num_times * log_mgf_value + math.log(2 / tail_mass_truncation)) / order
            if not math.isfinite(bound):
                continue
            if order > 0:
                upper_bound = min(upper_bound, math.ceil(bound))
            if order < 0:
                lower_bound = max(lower_bound, math.floor(bound))
        return lower_bound, upper_bound

    def _moments(self, pmf: np.ndarray) -> tuple:
        entry = self._log_mgfs.get(id(pmf))
        if entry is None or entry[0]() is not pmf:
            if len(self._log_mgfs) >= self.MAX_PMFS:
                self._log_mgfs = {k: v for k, v in self._log_mgfs.items() if v[0]() is not None}
            orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / len(pmf)
            log_mgfs = [special.logsumexp(np.arange(len(pmf)) * order, b=pmf) for order in orders]
            entry = self._log_mgfs[id(pmf)] = (weakref.ref(pmf), orders, log_mgfs)
        return entry


chernoff_bounds = ChernoffBounds(common.compute_self_convolve_bounds)


@contextlib.contextmanager
def _bounds_from_cached_moments():
    """``chernoff_bounds`` in place of dp_accounting's bounds function for the duration (restored
    after)."""
    original, common.compute_self_convolve_bounds = (
        common.compute_self_convolve_bounds,
        chernoff_bounds,
    )
    try:
        yield
    finally:
        common.compute_self_convolve_bounds = original


def self_compose(mechanism, count: int):
    """``mechanism.self_compose(count)`` (dp_accounting's) with the truncation bounds from cached
    moments."""
    with _bounds_from_cached_moments():
        return mechanism.self_compose(count)
