"""DP-UGA: UGA clients (seed 002) under client-level DP: each client's meta-gradient upload -g^k
goes through DP-FedAvg's chain (clip, Gaussian noise, fixed denominator; ``dp_fedavg.dp_uploads``),
so the server step is w_{t+1} = w_t - eta_g (1/D) (sum_k clip(g^k) + N(0, z^2 S^2 I)) and the
accountant is DP-FedAvg's."""

from __future__ import annotations

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.dp_fedavg import dp_uploads
from fedjax_dp.algorithms.dp_section import DP_PRIVACY_KEYS, check_dp
from fedjax_dp.algorithms.uga import build_uga, check_uga


def build_dp_uga(ctx) -> tuple:
    algorithm, _ = build_uga(ctx)
    return algorithm, dp_uploads(ctx)


def check_dp_uga(cfg, need) -> None:
    check_uga(cfg, need)
    check_dp(cfg, need)


registry.register(
    "dp_uga",
    build=build_dp_uga,
    sections=("dp", "ddp", "uga"),
    validate=check_dp_uga,
    privacy_keys=DP_PRIVACY_KEYS,
    participation=True,
    summary="DP-UGA: UGA + DP-FedAvg's upload chain",
)
