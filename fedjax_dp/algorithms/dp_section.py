"""The ``dp`` configuration section shared by the client-level DP algorithms (DP-FedAvg, DP-UGA):
the mechanism's knobs (Geyer et al. 2017's z and S, Andrew et al. 2021's adaptive clip, central or
local noise), their validation, and the noise multiplier calibrated to ``privacy.target_epsilon``.
The delta, accountant, budgets and stops are the ``privacy`` section's (``privacy.settings``)."""

from __future__ import annotations

import math

from fedjax_dp.algorithms import registry
from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy import settings
from fedjax_dp.privacy.accounting import client_sampling
from fedjax_dp.privacy.accounting.client_sampling import client_sampler
from fedjax_dp.privacy.correlated import plan, strategies
from fedjax_dp.privacy.correlated.participation import SCHEMES as PARTICIPATION_SCHEMES
from fedjax_dp.privacy.accounting.accountant import (
    ACCOUNTANTS,
    Accountant,
    RoundEvent,
    parse_rdp_orders,
)
from fedjax_dp.privacy.mechanisms.upload_noise import parse_schedule

NOISES = ("gaussian",) + tuple(n for n in strategies.STRATEGIES if n != "identity")
"""dp.noise: independent Gaussian noise, or a correlated-noise strategy
(``privacy.correlated.strategies``)."""
CLIP_MODES = ("fixed", "per_layer", "adaptive", "per_layer_adaptive", "median")
DP_PRIVACY_KEYS = settings.ACCOUNTING + settings.BUDGETS + settings.CALIBRATION
"""What DP-FedAvg and DP-UGA read of the privacy section: all of it."""


def correlated(cfg) -> bool:
    """Whether the run adds correlated noise (or independent noise under a participation scheme, the
    identity strategy): ``privacy.correlated``."""
    return cfg.dp.noise != "gaussian" or cfg.sampling.method in PARTICIPATION_SCHEMES


def strategy_rounds(cfg) -> int:
    """The rounds the noise strategy is built (optimised) for: ``dp.strategy_rounds``, or the
    run's."""
    return cfg.dp.strategy_rounds or cfg.rounds


def check_correlated(cfg, need) -> None:
    """Correlated noise's own refusals (issue 75, "Bad input"), from the configuration alone."""
    dp, s = cfg.dp, cfg.sampling
    need(dp.noise in NOISES, f"dp.noise {dp.noise!r} unknown; available: {NOISES}")
    need(
        isinstance(dp.bands, int) and dp.bands >= 0,
        f"dp.bands must be an integer >= 0 (0 = the separation), got {dp.bands!r}",
    )
    need(
        isinstance(dp.tree_restart, int) and dp.tree_restart >= 0,
        f"dp.tree_restart must be an integer >= 0 (0 = the separation), got {dp.tree_restart!r}",
    )
    need(
        isinstance(dp.strategy_rounds, int) and dp.strategy_rounds >= 0,
        f"dp.strategy_rounds must be an integer >= 0 (0 = rounds), got {dp.strategy_rounds!r}",
    )
    if not correlated(cfg):
        return
    noise = f"dp.noise={dp.noise!r}"
    need(
        s.method in PARTICIPATION_SCHEMES,
        f"{noise} is calibrated for a participation scheme the sampler must enforce, and"
        f" sampling.method={s.method!r} enforces none (a client may be drawn in any round): use one"
        f" of {PARTICIPATION_SCHEMES}",
    )
    need(
        dp.noise_mode == "central",
        f"{noise} with dp.noise_mode={dp.noise_mode!r}: correlated noise is added by the "
        "server across rounds; a client cannot correlate noise over rounds it does not see",
    )
    need(
        dp.clip in ("fixed", "per_layer"),
        f"{noise} with dp.clip={dp.clip!r}: correlated noise runs on a fixed clip "
        "(an adaptive clip's count would be a second release to compose with the "
        "stream); use dp.clip='fixed' or 'per_layer'",
    )
    need(
        not dp.noise_schedule,
        f"{noise} with dp.noise_schedule={dp.noise_schedule!r}: the stream has one noise "
        "multiplier; set dp.noise_multiplier or privacy.target_epsilon",
    )
    need(
        not dp.strategy_rounds or dp.strategy_rounds >= cfg.rounds,
        f"dp.strategy_rounds={dp.strategy_rounds} < rounds={cfg.rounds}: the {dp.noise} strategy"
        " would be built for fewer rounds than the run (its noise is not defined past them)",
    )
    n, b = strategy_rounds(cfg), s.min_separation
    if dp.noise == "banded" and s.method != "single":
        need(
            dp.bands <= b,
            f"dp.bands={dp.bands} > sampling.min_separation={b}: a client's participations b rounds"
            " apart would overlap in the bands, which the banded sensitivity does not cover; use"
            f" dp.bands <= {b}",
        )
    if s.method == "cyclic_poisson":
        need(
            dp.noise in ("gaussian", "banded"),
            f"{noise} with sampling.method='cyclic_poisson': amplification by "
            "sampling is proved for banded strategies (amplified BandMF) only; use "
            "dp.noise='banded' (or 'gaussian'), or sampling.method='cyclic'",
        )
    if dp.noise == "dense":
        need(
            n <= strategies.MAX_DENSE_ROUNDS,
            "dp.noise='dense' is for short runs: at most "
            f"{strategies.MAX_DENSE_ROUNDS} rounds, got {n}; use 'blt' or 'banded'",
        )
        need(
            s.method != "cyclic" or n % b == 0,
            f"dp.noise='dense' with cyclic groups: sampling.min_separation={b} "
            f"must divide the strategy's rounds {n}",
        )
    if dp.noise == "tree_restart":
        need(
            dp.tree_restart <= n,
            f"dp.tree_restart={dp.tree_restart} > the strategy's rounds {n}: the first tree "
            "would never restart; use dp.noise='tree' for one tree over the run",
        )
    if dp.noise in ("tree", "tree_restart", "tree_honaker"):
        need(
            n <= strategies.MAX_MATERIALIZED_ROUNDS,
            f"dp.noise={dp.noise!r} is built for at most "
            f"{strategies.MAX_MATERIALIZED_ROUNDS} rounds, got {n}",
        )


def check_dp(cfg, need) -> None:
    dp, p = cfg.dp, cfg.privacy
    check_correlated(cfg, need)
    need(
        dp.noise_multiplier >= 0,
        f"dp.noise_multiplier (sigma) must be >= 0, got {dp.noise_multiplier}",
    )
    need(dp.clip in CLIP_MODES, f"dp.clip {dp.clip!r} unknown; available: {CLIP_MODES}")
    need(dp.clip_norm > 0, f"dp.clip_norm S must be > 0, got {dp.clip_norm}")
    need(
        dp.noise_mode in ("central", "local"),
        f"dp.noise_mode {dp.noise_mode!r} unknown; use central or local",
    )
    need(
        0 < dp.target_quantile < 1,
        f"dp.target_quantile must lie in (0, 1), got {dp.target_quantile}",
    )
    need(
        not (dp.clip == "median" and dp.noise_mode == "local"),
        "dp.clip='median' cannot run with local noise",
    )
    need(
        not (dp.clip == "adaptive" and dp.noise_mode == "local"),
        "dp.clip='adaptive' with dp.noise_mode='local' is refused: each client's clip bit would"
        " reach the server un-noised (not locally private); use dp.clip='fixed', 'per_layer' or"
        " 'per_layer_adaptive' (whose counts each client noises itself) with local noise",
    )
    need(
        not (p.target_epsilon and dp.noise_schedule),
        f"privacy.target_epsilon={p.target_epsilon} and dp.noise_schedule={dp.noise_schedule!r}"
        " both choose z; set one",
    )
    rate_schedule = (
        cfg.sampling.get("rate_schedule", "") if cfg.sampling.method == "poisson" else ""
    )
    if rate_schedule:
        need(
            not p.target_epsilon,
            f"privacy.target_epsilon={p.target_epsilon} calibrates one z for a constant rate; "
            f"with sampling.rate_schedule={rate_schedule!r} set dp.noise_multiplier",
        )
        need(
            dp.clip not in ("adaptive", "per_layer_adaptive"),
            f"dp.clip={dp.clip!r} estimates its quantile against a fixed expected count; with "
            f"sampling.rate_schedule={rate_schedule!r} use dp.clip='fixed', 'per_layer' or"
            " 'median'",
        )
    valid = 0 < p.delta < 1 and p.accountant in ACCOUNTANTS
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
    if not p.target_epsilon and (p.max_epsilon or p.stop_epsilon) and valid and not correlated(cfg):
        spent = first_round_spends(cfg, schedule[0][1])
        if spent is not None:
            key, value, limit = spent
            need(
                value <= limit,
                f"{key}={limit} is spent before round 1 ends ({value:.4g} for one round at "
                f"z={schedule[0][1]}): the run could not train; raise the budget or the noise",
            )


def calibrated_noise_multiplier(cfg, num_clients: int) -> float:
    """z such that ``rounds`` rounds spend ``privacy.target_epsilon`` at ``privacy.delta`` as the
    tracker accounts them. Central noise: the sampler's own (amplified) event, dp_accounting's
    calibration. Local noise: each client's ledger composes, without amplification, a Gaussian of
    sensitivity 2S (replace-one) per participation, i.e. mu = 2 sqrt(T) / z for a client in all T
    rounds (exact GDP: Dong, Roth and Su 2022, Cor. 3.3), so z = 2 sqrt(T) / mu(epsilon, delta)."""
    p = cfg.privacy
    # one Gaussian for the stream (or amplified BandMF's rounds): plan.calibrate
    if correlated(cfg):
        return plan.calibrate(
            strategy_rounds(cfg),
            client_sampling.participation(cfg.sampling),
            p.target_epsilon,
            p.delta,
            p.accountant,
        )
    if cfg.dp.noise_mode == "local":
        return 2.0 * math.sqrt(cfg.rounds) / gdp.mu_from_epsilon(p.target_epsilon, p.delta)
    return client_sampler(cfg.sampling, num_clients).calibrate(
        p.target_epsilon, p.delta, cfg.rounds, p.accountant
    )


def first_round_spends(cfg, z: float):
    """``(key, one round's figure, the budget)`` of the configured budget rule for round 1, from the
    configuration alone (fixed-size sampling: over ``data.num_clients`` clients), or None."""
    p, s = cfg.privacy, cfg.sampling
    if z <= 0:
        return ("privacy.max_epsilon", math.inf, p.max_epsilon) if p.max_epsilon else None
    if cfg.dp.noise_mode == "local":
        mu = 2.0 / z  # replace-one, sensitivity 2S
        if p.max_epsilon:
            return "privacy.max_epsilon", gdp.epsilon_from_mu(mu, p.delta), p.max_epsilon
        return "privacy.stop_max_delta", gdp.delta_from_mu(mu, p.stop_epsilon), p.stop_max_delta
    if s.method == "uniform":
        if not 0 < s.cohort_size <= cfg.data.num_clients:
            return None
        event = RoundEvent("fixed", z, population=cfg.data.num_clients, cohort_size=s.cohort_size)
    else:
        event = RoundEvent("poisson", z, sampling_rate=s.rate)
    accountant = Accountant(
        p.accountant, p.pld_discretization, parse_rdp_orders(p.rdp_orders)
    ).compose(event)
    if p.max_epsilon:
        return "privacy.max_epsilon", accountant.epsilon(p.delta), p.max_epsilon
    return "privacy.stop_max_delta", accountant.delta(p.stop_epsilon), p.stop_max_delta


ADAPTIVE_CLIPS = ("adaptive", "per_layer_adaptive")

SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "noise_multiplier": "z: Gaussian noise std on the clipped sum / S",
    "noise_schedule": "piecewise-constant z_t, e.g. '1:1.2,100:1.0' ('' = constant z)",
    "clip": (
        "fixed | per_layer | adaptive (private quantile, Andrew et al. 2021) | per_layer_adaptive"
        " (the same per layer from S / sqrt(L) each; counts noised by the server, or by each client"
        " under local noise) | median (NOT private, labelled)"
    ),
    "clip_norm": "S: per-client clip norm (initial S for adaptive)",
    "target_quantile": "adaptive clipping: the quantile of update norms S tracks",
    "clip_learning_rate": "adaptive clipping: geometric step of S per round",
    "noise_mode": (
        "central (server adds noise to the sum) | local (each client noises its own update)"
    ),
    "noise": (
        "gaussian (independent per round; under a participation scheme: the identity strategy, no"
        " amplification) | tree (binary-tree aggregation, DP-FTRL) | tree_restart (the tree"
        " restarted every dp.tree_restart rounds, DP-FTRL's TreeRestart) | tree_honaker (the tree"
        " with Honaker's efficient estimator) | banded (banded MF) | blt (buffered-linear-Toeplitz"
        " MF) | dense (optimised dense MF, short runs): correlated noise needs sampling.method ="
        " min_separation | single | cyclic | cyclic_poisson"
    ),
    "bands": (
        "dp.noise='banded': the strategy's bands (0 = sampling.min_separation, at most it; single "
        "participation: 0 = the run)"
    ),
    "tree_restart": (
        "dp.noise='tree_restart': the rounds of each tree (0 = sampling.min_separation, so a client"
        " takes part at most once per tree; single participation: the run)"
    ),
    "strategy_rounds": (
        "correlated noise: the rounds the strategy is built for (0 = rounds; never fewer)"
    ),
}
registry.register_section(
    "dp",
    docs=SECTION_DOCS,
    read_when=(
        ("dp.noise_multiplier", "privacy.target_epsilon", (0.0,)),  # calibration chooses z
        ("dp.noise_multiplier", "dp.noise_schedule", ("",)),  # the schedule gives z_t
        ("dp.target_quantile", "dp.clip", ADAPTIVE_CLIPS),  # Andrew et al. 2021's gamma and eta
        ("dp.clip_learning_rate", "dp.clip", ADAPTIVE_CLIPS),
        (
            "privacy.accountant",
            "dp.noise_mode",
            ("central",),
        ),  # local releases: per-client exact GDP
        ("privacy.pld_discretization", "dp.noise_mode", ("central",)),
        ("privacy.rdp_orders", "dp.noise_mode", ("central",)),
        ("dp.bands", "dp.noise", ("banded",)),
        ("dp.tree_restart", "dp.noise", ("tree_restart",)),
        ("dp.strategy_rounds", "dp.noise", NOISES[1:]),
    ),
    defaults={
        # z: noise std on the clipped sum / S (privacy.target_epsilon > 0 calibrates it)
        "noise_multiplier": 1.0,
        "noise_schedule": "",  # piecewise-constant z_t, e.g. "1:1.2,100:1.0"
        # fixed | per_layer | adaptive | per_layer_adaptive | median (median: NOT private)
        "clip": "fixed",
        "clip_norm": 1.0,  # S (initial S for adaptive)
        "target_quantile": 0.5,
        "clip_learning_rate": 0.2,  # adaptive clipping (Andrew et al. 2021)
        "noise_mode": "central",  # central | local
        # gaussian | tree | tree_restart | tree_honaker | banded | blt | dense (correlated:
        # sampling.method a participation scheme)
        "noise": "gaussian",
        # dp.noise='banded': bands (0 = sampling.min_separation; single participation: the run)
        "bands": 0,
        "tree_restart": (
            0
        ),  # dp.noise='tree_restart': rounds of each tree (0 = sampling.min_separation)
        "strategy_rounds": 0,
    },
)  # correlated noise: rounds the strategy is built for (0 = rounds)
