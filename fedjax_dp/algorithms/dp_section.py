"""The ``dp`` configuration section shared by the client-level DP algorithms (DP-FedAvg, DP-UGA):
its defaults and its validation (Geyer et al. 2017's z, S, budget stop; Andrew et al. 2021's
adaptive clip; the accountant and the per-client budget)."""

from __future__ import annotations

import math

from fedjax_dp.algorithms import registry
from fedjax_dp.privacy import gdp
from fedjax_dp.privacy.client_sampling import client_sampler
from fedjax_dp.privacy.accounting import ACCOUNTANTS, Accountant, RoundEvent, parse_rdp_orders
from fedjax_dp.privacy.upload_noise import parse_schedule

CLIP_MODES = ("fixed", "per_layer", "adaptive", "per_layer_adaptive", "median")


def check_dp(cfg, need) -> None:
    dp = cfg.dp
    need(dp.noise_multiplier >= 0, f"dp.noise_multiplier (sigma) must be >= 0, got {dp.noise_multiplier}")
    need(dp.clip in CLIP_MODES, f"dp.clip {dp.clip!r} unknown; available: {CLIP_MODES}")
    need(dp.clip_norm > 0, f"dp.clip_norm S must be > 0, got {dp.clip_norm}")
    need(dp.noise_mode in ("central", "local"), f"dp.noise_mode {dp.noise_mode!r} unknown; use central or local")
    need(dp.accountant in ACCOUNTANTS, f"dp.accountant {dp.accountant!r} unknown; available: {ACCOUNTANTS}")
    need(0 < dp.delta < 1, f"dp.delta must lie in (0, 1), got {dp.delta}")
    need(0 < dp.pld_discretization <= 0.1, f"dp.pld_discretization must lie in (0, 0.1], got {dp.pld_discretization}")
    try:
        parse_rdp_orders(dp.rdp_orders)
    except ValueError as error:
        need(False, f"dp.rdp_orders={dp.rdp_orders!r}: {error}")
    need(dp.target_epsilon >= 0, f"dp.target_epsilon must be >= 0 (0 = off), got {dp.target_epsilon}")
    need(0 <= dp.max_delta < 1, f"dp.max_delta Q must lie in (0, 1) (0 = off), got {dp.max_delta}")
    need((dp.target_epsilon > 0) == (dp.max_delta > 0), "dp.target_epsilon and dp.max_delta (Q) go together")
    need(dp.max_epsilon >= 0, f"dp.max_epsilon must be >= 0 (0 = off), got {dp.max_epsilon}")
    need(dp.calibrate_epsilon >= 0, f"dp.calibrate_epsilon must be >= 0 (0 = off), got {dp.calibrate_epsilon}")
    need(dp.client_epsilon_budget >= 0, f"dp.client_epsilon_budget must be >= 0, got {dp.client_epsilon_budget}")
    need(0 < dp.target_quantile < 1, f"dp.target_quantile must lie in (0, 1), got {dp.target_quantile}")
    need(not (dp.clip == "median" and dp.noise_mode == "local"), "dp.clip='median' cannot run with local noise")
    need(not (dp.clip == "adaptive" and dp.noise_mode == "local"),
         "dp.clip='adaptive' with dp.noise_mode='local' is refused: each client's clip bit would reach the server "
         "un-noised (not locally private); use dp.clip='fixed', 'per_layer' or 'per_layer_adaptive' (whose counts each "
         "client noises itself) with local noise")
    need(not (dp.calibrate_epsilon and dp.noise_schedule),
         f"dp.calibrate_epsilon={dp.calibrate_epsilon} and dp.noise_schedule={dp.noise_schedule!r} both choose z; set one")
    if dp.calibrate_epsilon > 0 and 0 < dp.delta < 1 and cfg.rounds >= 1 and cfg.data.num_clients >= 1:
        try:  # cached: the build calibrates with the same arguments
            calibrated_noise_multiplier(cfg, cfg.data.num_clients)
        except ValueError as error:
            need(False, f"dp.calibrate_epsilon={dp.calibrate_epsilon}: {error}")
    try:
        schedule = parse_schedule(dp.noise_schedule, dp.noise_multiplier)
    except ValueError as error:
        need(False, str(error))
        return
    if not dp.calibrate_epsilon and (dp.max_epsilon or dp.target_epsilon) and 0 < dp.delta < 1:
        spent = first_round_spends(cfg, schedule[0][1])
        if spent is not None:
            key, value, limit = spent
            need(value <= limit, f"{key}={limit} is spent before round 1 ends ({value:.4g} for one round at "
                                 f"z={schedule[0][1]}): the run could not train; raise the budget or the noise")


def calibrated_noise_multiplier(cfg, num_clients: int) -> float:
    """z such that ``rounds`` rounds spend ``dp.calibrate_epsilon`` at ``dp.delta`` as the tracker
    accounts them. Central noise: the sampler's own (amplified) event, dp_accounting's calibration.
    Local noise: each client's ledger composes, without amplification, a Gaussian of sensitivity 2S
    (replace-one) per participation, i.e. mu = 2 sqrt(T) / z for a client in all T rounds (exact GDP:
    Dong, Roth and Su 2022, Cor. 3.3), so z = 2 sqrt(T) / mu(epsilon, delta)."""
    dp = cfg.dp
    if dp.noise_mode == "local":
        return 2.0 * math.sqrt(cfg.rounds) / gdp.mu_from_epsilon(dp.calibrate_epsilon, dp.delta)
    return client_sampler(cfg.sampling, num_clients).calibrate(dp.calibrate_epsilon, dp.delta, cfg.rounds, dp.accountant)


def first_round_spends(cfg, z: float):
    """``(key, one round's figure, the budget)`` of the configured budget rule for round 1, from the
    configuration alone (fixed-size sampling: over ``data.num_clients`` clients), or None."""
    dp, s = cfg.dp, cfg.sampling
    if z <= 0:
        return ("dp.max_epsilon", math.inf, dp.max_epsilon) if dp.max_epsilon else None
    if dp.noise_mode == "local":
        mu = 2.0 / z  # replace-one, sensitivity 2S
        if dp.max_epsilon:
            return "dp.max_epsilon", gdp.epsilon_from_mu(mu, dp.delta), dp.max_epsilon
        return "dp.max_delta", gdp.delta_from_mu(mu, dp.target_epsilon), dp.max_delta
    if s.method == "uniform":
        if not 0 < s.cohort_size <= cfg.data.num_clients:
            return None
        event = RoundEvent("fixed", z, population=cfg.data.num_clients, cohort_size=s.cohort_size)
    else:
        event = RoundEvent("poisson", z, sampling_rate=s.rate)
    accountant = Accountant(dp.accountant if dp.accountant in ACCOUNTANTS else "rdp", dp.pld_discretization,
                            parse_rdp_orders(dp.rdp_orders)).compose(event)
    if dp.max_epsilon:
        return "dp.max_epsilon", accountant.epsilon(dp.delta), dp.max_epsilon
    return "dp.max_delta", accountant.delta(dp.target_epsilon), dp.max_delta


registry.register_section("dp", {
    "noise_multiplier": 1.0,  # z: noise std on the clipped sum / S
    "noise_schedule": "",  # piecewise-constant z_t, e.g. "1:1.2,100:1.0"
    "calibrate_epsilon": 0.0,  # > 0: choose z so that `rounds` rounds spend this epsilon at `delta`
    "clip": "fixed",  # fixed | per_layer | adaptive | per_layer_adaptive | median (median: NOT private)
    "clip_norm": 1.0,  # S (initial S for adaptive)
    "target_quantile": 0.5, "clip_learning_rate": 0.2,  # adaptive clipping (Andrew et al. 2021)
    "noise_mode": "central",  # central | local
    "accountant": "rdp",  # rdp | pld (fixed-size sampling under pld: the Dong-Roth-Su reduction)
    "pld_discretization": 1e-4,  # PLD value discretisation (pessimistic: epsilon over-reported by ~this)
    "rdp_orders": "",  # RDP order grid, e.g. "1.5,2,4,8,16,32,64" ("" = privacy.accounting.RDP_ORDERS)
    "delta": 1e-5,
    "target_epsilon": 0.0, "max_delta": 0.0,  # Geyer's stop: delta(target_epsilon) would exceed Q
    "max_epsilon": 0.0,  # stop when epsilon(delta) would exceed this
    "client_epsilon_budget": 0.0})  # per-client budget (ledger); 0 = none
