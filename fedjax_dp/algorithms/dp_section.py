"""The ``dp`` configuration section shared by the client-level DP algorithms (DP-FedAvg, DP-UGA):
the mechanism's knobs (Geyer et al. 2017's z and S, central or local noise), their validation, and
the noise multiplier calibrated to ``privacy.target_epsilon``. The clip rules (``dp.clip``) and
noise families (``dp.noise``) are registered choices with their own keys and checks
(``algorithms.dp_choices``); the delta, accountant, budgets and stops are the ``privacy`` section's
(``privacy.settings``). How a run is accounted is the tracker's decision, from the releases and the
sampler (``privacy.tracker``), never this section's."""

from __future__ import annotations

import dataclasses

from fedjax_dp.algorithms import ddp_section, dp_choices, registry
from fedjax_dp.algorithms.dp_choices import correlated, strategy_rounds  # noqa: F401
from fedjax_dp.privacy import settings
from fedjax_dp.privacy.accounting.accountant import ACCOUNTANTS
from fedjax_dp.privacy.mechanisms.upload_noise import parse_schedule
from fedjax_dp.privacy.sampling import build as client_sampler
from fedjax_dp.privacy.settings import PrivacySettings
from fedjax_dp.privacy.tracker import calibrate_for, ledger_for

NOISE_MODES = ("central", "local", ddp_section.DISTRIBUTED)
DP_PRIVACY_KEYS = settings.ACCOUNTING + settings.BUDGETS + settings.CALIBRATION
"""What DP-FedAvg and DP-UGA read of the privacy section: all of it."""


def check_dp(cfg, need) -> None:
    """The section's own rules (each clip rule's and noise family's: ``dp_choices``)."""
    dp, p = cfg.dp, cfg.privacy
    need(
        dp.noise_multiplier >= 0,
        f"dp.noise_multiplier (sigma) must be >= 0, got {dp.noise_multiplier}",
    )
    need(dp.clip_norm > 0, f"dp.clip_norm S must be > 0, got {dp.clip_norm}")
    need(
        dp.noise_mode in NOISE_MODES,
        f"dp.noise_mode {dp.noise_mode!r} unknown; available: {NOISE_MODES}",
    )
    if ddp_section.distributed(cfg):
        ddp_section.check_ddp(cfg, need)
    need(
        not (p.target_epsilon and dp.noise_schedule),
        f"privacy.target_epsilon={p.target_epsilon} and dp.noise_schedule={dp.noise_schedule!r}"
        " both choose z; set one",
    )
    rate_schedule = (
        cfg.sampling.get("rate_schedule", "") if cfg.sampling.method == "poisson" else ""
    )
    need(
        not (rate_schedule and p.target_epsilon),
        f"privacy.target_epsilon={p.target_epsilon} calibrates one z for a constant rate; "
        f"with sampling.rate_schedule={rate_schedule!r} set dp.noise_multiplier",
    )
    known = dp.clip in dp_choices.choices.names("dp", "clip") and dp.noise in dp_choices.noises()
    valid = 0 < p.delta < 1 and p.accountant in ACCOUNTANTS and known
    if ddp_section.distributed(cfg):  # checked; and the releases need the model's dimension
        valid = valid and _ddp_valid(cfg) and ddp_section.stand_in_dimension(cfg) is not None
    if (
        p.target_epsilon > 0
        and valid
        and cfg.rounds >= 1
        and cfg.data.num_clients >= 1
        and not rate_schedule
    ):
        try:  # cached: the build calibrates with the same arguments
            calibrated_noise_multiplier(cfg, cfg.data.num_clients)
        except ValueError as error:
            need(False, f"privacy.target_epsilon={p.target_epsilon}: {error}")
    try:
        schedule = parse_schedule(dp.noise_schedule, dp.noise_multiplier)
    except ValueError as error:
        need(False, str(error))
        return
    if valid and ddp_section.distributed(cfg) and not p.target_epsilon and schedule[0][1] > 0:
        releases = noise_releases(cfg, cfg.data.num_clients, schedule[0][1])
        sampler = client_sampler(cfg.sampling, cfg.data.num_clients)
        try:
            ledger_for(releases, PrivacySettings.from_config(cfg), sampler).check(releases)
        except ValueError as error:
            need(False, f"dp.noise_mode='distributed': {error}")
    if not p.target_epsilon and (p.max_epsilon or p.stop_epsilon) and valid and not correlated(cfg):
        refusal = first_round_refusal(cfg, schedule[0][1])
        need(refusal is None, refusal or "")


def noise_releases(cfg, num_clients: int, z: float, dim: int | None = None) -> list:
    """What round 1 releases at noise multiplier z, from the configuration alone (no model): what
    calibration solves over and the first round's budget check asks the ledger about
    (``dp_choices.noise_releases``; distributed noise: for an upload of ``dim`` coordinates, by
    default the model's on its source's known shape), with a wrapper's own releases beside them
    (``hypergrad.source=clients``'s, at their own fixed noise)."""
    denominator = client_sampler(cfg.sampling, num_clients).expected_cohort()
    if ddp_section.distributed(cfg) and dim is None:
        dim = ddp_section.stand_in_dimension(cfg)
        if dim is None:
            raise ValueError(
                f"distributed noise on data.source={cfg.data.source!r}: the upload's dimension is"
                " known only once the data is loaded"
            )
    own = [r for wrapper in registry.wrappers() for r in wrapper.own_releases(cfg)]
    return dp_choices.noise_releases(cfg, num_clients, z, denominator, dim) + own


def calibrated_noise_multiplier(cfg, num_clients: int, dim: int | None = None) -> float:
    """z such that the run's rounds spend ``privacy.target_epsilon`` at ``privacy.delta`` as the
    tracker will account them: the ledger the releases and the sampler choose solves over its own
    events (``privacy.tracker.calibrate_for``; central noise: the sampler's amplified events;
    local: each client's exact Gaussian-DP book; correlated: the whole stream's event)."""
    return calibrate_for(
        lambda z: noise_releases(cfg, num_clients, z, dim),
        PrivacySettings.from_config(cfg),
        client_sampler(cfg.sampling, num_clients),
        cfg.rounds,
        cfg.privacy.target_epsilon,
    )


def first_round_refusal(cfg, z: float) -> str | None:
    """Why a budget rule would stop the run before round 1 ends at noise multiplier z (asked of the
    ledger that will account the run, for each configured rule alone), or None."""
    p = cfg.privacy
    settings = PrivacySettings.from_config(cfg)
    releases = noise_releases(cfg, cfg.data.num_clients, z)
    sampler = client_sampler(cfg.sampling, cfg.data.num_clients)
    rules = (
        ("privacy.max_epsilon", p.max_epsilon, dict(stop_epsilon=0.0, stop_max_delta=0.0)),
        ("privacy.stop_max_delta", p.stop_max_delta, dict(max_epsilon=0.0)),
    )
    for key, limit, others in rules:
        if limit and not ledger_for(
            releases, dataclasses.replace(settings, client_epsilon_budget=0.0, **others), sampler
        ).allows(1, releases):
            return (
                f"{key}={limit} is spent before round 1 ends (one round at z={z} passes it): the"
                " run could not train; raise the budget or the noise"
            )
    return None


registry.register_section(
    "dp",
    docs={
        "noise_multiplier": "z: Gaussian noise std on the clipped sum / S (privacy.target_epsilon"
        " > 0 calibrates it)",
        "noise_schedule": "piecewise-constant z_t, e.g. '1:1.2,100:1.0' ('' = constant z)",
        "clip_norm": "S: per-client clip norm (initial S for an adaptive clip)",
        "noise_mode": "central (server adds noise to the sum) | local (each client noises its own"
        " update) | distributed (each client adds a share of discrete noise to its quantised"
        " update; a simulated secure aggregation reveals only the modular sum: the ddp section)",
    },
    read_when=(
        ("dp.noise_multiplier", "privacy.target_epsilon", (0.0,)),  # calibration chooses z
        ("dp.noise_multiplier", "dp.noise_schedule", ("",)),  # the schedule gives z_t
        # local releases: each client's exact Gaussian-DP book, no accountant
        ("privacy.accountant", "dp.noise_mode", ("central", ddp_section.DISTRIBUTED)),
        ("privacy.pld_discretization", "dp.noise_mode", ("central", ddp_section.DISTRIBUTED)),
        ("privacy.rdp_orders", "dp.noise_mode", ("central", ddp_section.DISTRIBUTED)),
    ),
    defaults={
        "noise_multiplier": 1.0,
        "noise_schedule": "",
        "clip": "fixed",
        "clip_norm": 1.0,
        "noise_mode": "central",
        "noise": "gaussian",
    },
)


def _ddp_valid(cfg) -> bool:
    """Whether the ``ddp`` section passes its own checks (``ddp_section.check_ddp``)."""
    problems = []
    ddp_section.check_ddp(cfg, lambda ok, message: problems.append(message) if not ok else None)
    return not problems
