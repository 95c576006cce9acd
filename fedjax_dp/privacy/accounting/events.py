"""Events the accountants compose beyond dp_accounting's own, and the conversions a sampler needs.

A mechanism states its release as a ``dp_accounting.DpEvent`` (``core.release.Release.event``). Most
are dp_accounting's (Gaussian, Laplace, ...). A mechanism whose event dp_accounting lacks (a
distributed discrete Gaussian, Skellam noise) registers its type here once, with what is known of
it::

    register_event(SkellamDpEvent, rdp=skellam_rdp)  # rdp(event, orders) -> RDP at each order

and the project's accountants (``RdpAccountant`` below, ``cached_pld.CachedPldAccountant``) compose
it wherever it appears, unsampled or inside a ``PoissonSampledDpEvent`` (``poisson_rdp`` /
``poisson_pld``: the subsampled figures, which need their own analysis), and refuse it where
nothing was registered (``supports`` is False, as dp_accounting's own accountants refuse what they
cannot compose). No ledger is edited for a new mechanism.

Fixed-size sampling accounts replace-one neighbours, under which a release stated for add/remove-one
(sensitivity S) has sensitivity 2S; ``at_double_sensitivity`` gives its event there (Gaussian of
z / 2, Laplace of b / 2, or a registered ``double_sensitivity``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import dp_accounting
import numpy as np
from dp_accounting import privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant


@dataclasses.dataclass(frozen=True)
class EventRule:
    """What the accountants may do with a registered event type (None: not known, refused).

    Attributes:
      rdp: ``rdp(event, orders) -> array`` of the event's RDP at each order.
      pld: ``pld(event, discretization) -> PrivacyLossDistribution`` of the event.
      poisson_rdp: ``poisson_rdp(event, q, orders) -> array``: the event Poisson-subsampled at q.
      poisson_pld: ``poisson_pld(event, q, discretization) -> PrivacyLossDistribution``.
      double_sensitivity: ``double_sensitivity(event) -> event`` at twice its sensitivity.
    """

    rdp: Callable | None = None
    pld: Callable | None = None
    poisson_rdp: Callable | None = None
    poisson_pld: Callable | None = None
    double_sensitivity: Callable | None = None


_RULES: dict[type, EventRule] = {}


def register_event(event_type: type, **rule) -> EventRule:
    """Registers a project-defined ``DpEvent`` subclass with its accounting (``EventRule`` fields);
    registering a type again replaces its rule."""
    if not (isinstance(event_type, type) and issubclass(event_type, dp_accounting.DpEvent)):
        raise TypeError(f"register_event takes a DpEvent subclass, got {event_type!r}")
    _RULES[event_type] = EventRule(**rule)
    return _RULES[event_type]


def unregister_event(event_type: type) -> None:
    """Removes a registration (tests that register a toy event clean up with this)."""
    _RULES.pop(event_type, None)


def rule_of(event) -> EventRule | None:
    """The registered rule of ``event``'s type, or None for dp_accounting's own events."""
    return _RULES.get(type(event))


def at_double_sensitivity(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent | None:
    """``event`` for a query of twice the sensitivity it is stated for (replace-one neighbours of a
    release stated for add/remove-one), or None where that is not known."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return dp_accounting.GaussianDpEvent(event.noise_multiplier / 2)
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return dp_accounting.LaplaceDpEvent(event.noise_multiplier / 2)
    if isinstance(event, (dp_accounting.NonPrivateDpEvent, dp_accounting.NoOpDpEvent)):
        return event
    rule = rule_of(event)
    if rule is not None and rule.double_sensitivity is not None:
        return rule.double_sensitivity(event)
    return None


class RdpAccountant(rdp_privacy_accountant.RdpAccountant):
    """dp_accounting's RDP accountant that also composes the registered events (module
    docstring); every other event goes to dp_accounting unchanged."""

    def _maybe_compose(self, event, count: int, do_compose: bool):
        curve = self._registered_rdp(event)
        if curve is None:
            return super()._maybe_compose(event, count, do_compose)
        if isinstance(curve, str):
            return privacy_accountant.PrivacyAccountant.CompositionErrorDetails(
                invalid_event=event, error_message=curve
            )
        if do_compose:
            self._rdp += count * np.asarray(curve(), float)
        return None

    def _registered_rdp(self, event):
        """None for dp_accounting's events; else a thunk of the RDP curve, or why it is refused."""
        inner, q = event, None
        if isinstance(event, dp_accounting.PoissonSampledDpEvent):
            inner, q = event.event, event.sampling_probability
        rule = rule_of(inner)
        if rule is None:
            return None
        orders = self._orders
        if q is None and rule.rdp is not None:
            return lambda: rule.rdp(inner, orders)
        if q is not None and rule.poisson_rdp is not None:
            return lambda: rule.poisson_rdp(inner, q, orders)
        sampled = "Poisson-subsampled " if q is not None else ""
        return f"no RDP is registered for the {sampled}{type(inner).__name__}"
