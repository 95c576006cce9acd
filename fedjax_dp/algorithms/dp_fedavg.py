"""Client-level differentially-private FedAvg (Geyer, Klein, Nabi 2017, "Differentially Private
Federated Learning: A Client Level Perspective", Alg. 1; McMahan et al. 2018, DP-FedAvg).

Round t (ALGORITHMS.md Sec. 1): every sampled client k runs ClientUpdate from w_t and uploads
Delta w^k; the upload chain clips it, Delta w^k / max(1, ||Delta w^k|| / S), and noises it:
    w_{t+1} = w_t + (1 / D) (sum_k clipped Delta w^k + N(0, z_t^2 S^2 I))       (central)
    w_{t+1} = w_t + (1 / D)  sum_k (clipped Delta w^k + N(0, z_t^2 S^2 I))       (local, seed 001)
through the server optimizer (SGD, lr 1, reproduces the formula). D is FIXED: m under fixed-size
sampling, qK under Poisson sampling (the realised count would leak membership). So DP-FedAvg is
FedAvg with ``chain(clip, gaussian, fixed_denominator)``; each transform declares its release and
the privacy tracker composes them, Geyer's budget stop included.

Clip modes (``dp.clip``): ``fixed`` S; ``per_layer`` C_l = S / sqrt(L) (joint bound S); ``adaptive``
(Andrew et al. 2021: S follows the target quantile through a noised count, the update noise raised
to z_Delta so that the pair is z-private); ``per_layer_adaptive`` (the same rule per layer from S /
sqrt(L), ``privacy.mechanisms.upload_layer_quantile_clip``; L counts at sigma_b sqrt(L) cost what
one at sigma_b does, and under local noise each client noises its own counts); ``median`` (Geyer et
al.'s S = median norm): NOT private, released with ``formal=False``. ``UpdateStatistics`` adds
Geyer's Fig. 2 diagnostics V_c and U_s.
"""

from __future__ import annotations

import jax

from fedjax_dp.algorithms import ddp_section, registry
from fedjax_dp.algorithms.dp_section import (
    DP_PRIVACY_KEYS,
    calibrated_noise_multiplier,
    check_dp,
    correlated,
    strategy_rounds,
)
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core.uploads import Chain, chain, fixed_denominator
from fedjax_dp.privacy.mechanisms import choices
from fedjax_dp.privacy.mechanisms.update_statistics import UpdateStatistics
from fedjax_dp.privacy.mechanisms.upload_noise import parse_schedule


def noise_schedule(ctx) -> tuple[tuple[int, float], ...]:
    """z_t per round: ``dp.noise_schedule``, or ``dp.noise_multiplier``, or calibrated so that
    ``rounds`` rounds spend ``privacy.target_epsilon`` at ``privacy.delta`` (dp_accounting's
    calibration)."""
    dp = ctx.cfg.dp
    if not ctx.cfg.privacy.target_epsilon:
        return parse_schedule(dp.noise_schedule, dp.noise_multiplier)
    dim = sum(x.size for x in jax.tree_util.tree_leaves(ctx.params_template))
    return ((1, calibrated_noise_multiplier(ctx.cfg, ctx.num_clients, dim)),)


def calibration(ctx) -> tuple:
    """What z was calibrated to, for privacy.json and the printed summary: under
    local noise for a client taking part in every round (the realised figure is the busiest
    client's, often less)."""
    p, rounds = ctx.cfg.privacy, ctx.cfg.rounds
    if not p.target_epsilon:
        return ()
    if correlated(ctx.cfg):
        what = (
            f"the whole stream of {strategy_rounds(ctx.cfg)} rounds of correlated noise, one event "
            f"({p.accountant})"
        )
    elif ctx.cfg.dp.noise_mode == "local":
        what = (
            f"a client taking part in every one of the {rounds} rounds (local noise: no"
            " amplification by sampling)"
        )
    else:
        what = f"{rounds} rounds of the sampled Gaussian ({p.accountant})"
    return (("calibrated_epsilon", float(p.target_epsilon)), ("calibrated_for", what))


def dp_uploads(ctx) -> Chain:
    """Geyer's Alg. 1 uploads: clip (``dp.clip``'s rule), noise (``dp.noise``'s family, central or
    local), divide by the fixed D."""
    dp, denominator = ctx.cfg.dp, ctx.expected_cohort()
    if ddp_section.distributed(ctx.cfg):  # the sum holds the survivors
        denominator = ddp_section.denominator(ctx.cfg, denominator)
    clip = choices.get("dp", "clip", dp.clip).build(ctx, denominator)
    noise = choices.get("dp", "noise", dp.noise).build(ctx, noise_schedule(ctx), calibration(ctx))
    schedule = () if correlated(ctx.cfg) else ctx.denominators()
    return chain(UpdateStatistics(), clip, noise, fixed_denominator(denominator, schedule))


def build_dp_fedavg(ctx) -> tuple:
    return FedAvg(
        ctx.model.per_example_loss,
        ctx.client_optimizer(),
        **ctx.client_fields(),
        deferred_dense_rate=ctx.deferred_dense_rate(),
    ), dp_uploads(ctx)


registry.register(
    "dp_fedavg",
    build=build_dp_fedavg,
    sections=("dp", "ddp"),
    validate=check_dp,
    privacy_keys=DP_PRIVACY_KEYS,
    participation=True,
    scaled_rates=True,
    summary="DP-FedAvg (Geyer et al. 2017): FedAvg + chain(clip, gaussian, fixed_denominator)",
)
