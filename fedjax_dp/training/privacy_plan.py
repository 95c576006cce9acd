"""The line a private run starts with: the noise it runs at and the epsilon its rounds will spend,
said before the first round, so that a run whose noise nobody chose (``privacy.target_epsilon = 0``
leaves the configured noise multiplier) does not spend its epsilon silently.

The figure is the run's own tracker's, on a copy given every planned round's releases (every client
that may take part taking part: for a local ledger the busiest possible client), so it is what the
run will report if it runs to the end, or the round where its budget stops it.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from fedjax_dp.privacy.accounting import selection


def plan_line(run) -> str | None:
    """``privacy: z = ..., S = ...: the N rounds will spend epsilon E at delta D (accountant)`` for
    ``run`` (a ``RunContext`` before its first round), or None where nothing private is released
    or the run's ledger is the algorithm's own (its per-example figures come round by round)."""
    tracker = run.tracker
    if tracker is None or not tracker.planned:
        return None
    plan = copy.deepcopy(tracker)
    uploads = run.runner.specialized(run.state)
    stopped = None
    for t in range(1, run.cfg.rounds + 1):
        releases = uploads.releases(t, run.state.uploads)
        if not plan.allows(t, releases):
            stopped = t
            break
        # every client that may take part (a participation scheme's own limits hold)
        eligible = plan.eligible(t, releases)
        everyone = np.flatnonzero(eligible) if eligible is not None else np.arange(0)
        plan.record(t, everyone, releases)
    if not plan.rounds:
        return f"privacy: the budget allows no round (round 1 would exceed it); {_noise(plan)}"
    report = plan.report()
    calibrated = report.accounting.get("calibrated_epsilon")
    how = (
        f"calibrated to epsilon {calibrated:g} ({report.accounting['calibrated_for']})"
        if calibrated is not None
        else "as configured (privacy.target_epsilon = 0: not calibrated)"
    )
    span = (
        f"the budget stops the run before round {stopped}: its {plan.rounds} rounds"
        if stopped
        else f"{plan.rounds} rounds"
    )
    epsilon = plan.epsilon()
    spent = f"{epsilon:.4g}" if math.isfinite(epsilon) else "unbounded (no noise)"
    who = ", a client in every round" if plan.local else ""
    return (
        f"privacy: {_noise(plan)} {how}; {span} will spend epsilon {spent} at delta"
        f" {report.delta:g} ({report.accountant}{who})"
        + ("" if plan.private else ", formal: false (NO guarantee)")
    )


def _noise(plan) -> str:
    """``z = ...`` and ``S = ...`` as the planned releases state them."""
    report = plan.report()
    z = ", ".join(f"{v:.4g}" for v in report.noise_multipliers[:3]) or "?"
    bounds = sorted(
        {
            r["bound_value"]
            for r in report.releases
            if r.get("noise_multiplier") and r.get("bound_value") is not None
        }
    )
    clip = f", S = {', '.join(f'{b:.4g}' for b in bounds[:3])}" if bounds else ""
    return f"z = {z}{clip}"


def planned_run_event(cfg):
    """``(event, neighbouring relation)`` of a whole run of ``cfg`` as its tracker will compose it,
    before any data loads (``build.planned_releases``: every planned round's releases on the
    ledger the run uses, every client that may take part taking part, up to the round a budget rule
    stops it; ``selection.run_event``), or None where that is known only once the data is loaded or
    nothing private is released."""
    from fedjax_dp.training import build

    planned = build.planned_releases(cfg)
    if planned is None:
        return None
    tracker, uploads = planned
    for t in range(1, cfg.rounds + 1):
        releases = uploads.releases(t)
        if not tracker.allows(t, releases):
            break
        tracker.record(t, np.flatnonzero(tracker.eligible(t, releases)), releases)
    return selection.run_event(tracker), selection.run_relation(tracker)
