"""The ``dp`` configuration section shared by the client-level DP algorithms (DP-FedAvg, DP-UGA):
its defaults and its validation (Geyer et al. 2017's z, S, budget stop; Andrew et al. 2021's
adaptive clip; the accountant and the per-client budget)."""

from __future__ import annotations

from fedjax_dp.algorithms import registry
from fedjax_dp.privacy.accounting import ACCOUNTANTS
from fedjax_dp.privacy.upload_noise import parse_schedule

CLIP_MODES = ("fixed", "per_layer", "adaptive", "median")


def check_dp(cfg, need) -> None:
    dp = cfg.dp
    need(dp.noise_multiplier >= 0, f"dp.noise_multiplier (sigma) must be >= 0, got {dp.noise_multiplier}")
    need(dp.clip in CLIP_MODES, f"dp.clip {dp.clip!r} unknown; available: {CLIP_MODES}")
    need(dp.clip_norm > 0, f"dp.clip_norm S must be > 0, got {dp.clip_norm}")
    need(dp.noise_mode in ("central", "local"), f"dp.noise_mode {dp.noise_mode!r} unknown; use central or local")
    need(dp.accountant in ACCOUNTANTS, f"dp.accountant {dp.accountant!r} unknown; available: {ACCOUNTANTS}")
    need(not (dp.accountant == "pld" and cfg.sampling.method == "uniform"),
         "dp.accountant='pld' needs sampling.method='poisson' (dp_accounting's PLD has no fixed-size sampling event)")
    need(0 < dp.delta < 1, f"dp.delta must lie in (0, 1), got {dp.delta}")
    need(dp.target_epsilon >= 0, f"dp.target_epsilon must be >= 0 (0 = off), got {dp.target_epsilon}")
    need(0 <= dp.max_delta < 1, f"dp.max_delta Q must lie in (0, 1) (0 = off), got {dp.max_delta}")
    need((dp.target_epsilon > 0) == (dp.max_delta > 0), "dp.target_epsilon and dp.max_delta (Q) go together")
    need(dp.max_epsilon >= 0, f"dp.max_epsilon must be >= 0 (0 = off), got {dp.max_epsilon}")
    need(dp.calibrate_epsilon >= 0, f"dp.calibrate_epsilon must be >= 0 (0 = off), got {dp.calibrate_epsilon}")
    need(dp.client_epsilon_budget >= 0, f"dp.client_epsilon_budget must be >= 0, got {dp.client_epsilon_budget}")
    need(0 < dp.target_quantile < 1, f"dp.target_quantile must lie in (0, 1), got {dp.target_quantile}")
    need(not (dp.clip == "median" and dp.noise_mode == "local"), "dp.clip='median' cannot run with local noise")
    try:
        parse_schedule(dp.noise_schedule, dp.noise_multiplier)
    except ValueError as error:
        need(False, str(error))


registry.register_section("dp", {
    "noise_multiplier": 1.0,  # z: noise std on the clipped sum / S
    "noise_schedule": "",  # piecewise-constant z_t, e.g. "1:1.2,100:1.0"
    "calibrate_epsilon": 0.0,  # > 0: choose z so that `rounds` rounds spend this epsilon at `delta`
    "clip": "fixed",  # fixed | per_layer | adaptive | median (median: NOT private)
    "clip_norm": 1.0,  # S (initial S for adaptive)
    "target_quantile": 0.5, "clip_learning_rate": 0.2,  # adaptive clipping (Andrew et al. 2021)
    "noise_mode": "central",  # central | local
    "accountant": "rdp",  # rdp | pld (pld needs Poisson sampling)
    "delta": 1e-5,
    "target_epsilon": 0.0, "max_delta": 0.0,  # Geyer's stop: delta(target_epsilon) would exceed Q
    "max_epsilon": 0.0,  # stop when epsilon(delta) would exceed this
    "client_epsilon_budget": 0.0})  # per-client budget (ledger); 0 = none
