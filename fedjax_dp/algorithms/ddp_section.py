"""The ``ddp`` configuration section: distributed DP under a simulated secure aggregation
(``dp.noise_mode = distributed``, ``privacy.distributed``), read by the client-level DP algorithms
beside ``dp``. Its keys, their meanings and checks, and the plan a run's round is built from."""

from __future__ import annotations

import math

import jax

from fedjax_dp.algorithms import registry
from fedjax_dp.data.known_shapes import known_shapes
from fedjax_dp.privacy.distributed.modular import MAX_BITS
from fedjax_dp.privacy.distributed.plan import (
    MECHANISMS,
    ROTATIONS,
    DistributedPlan,
    survivors_floor,
)
from fedjax_dp.privacy.distributed.transform import DistributedNoise
from fedjax_dp.privacy.sampling import build as client_sampler

DISTRIBUTED = "distributed"
SHARES = ("per_client", "summed")


def distributed(cfg) -> bool:
    return cfg.dp.noise_mode == DISTRIBUTED


def survivor_threshold(cfg, sampler) -> int:
    """n_min: ``ddp.min_survivors``, or the expected survivors less three standard deviations."""
    if cfg.ddp.min_survivors:
        return int(cfg.ddp.min_survivors)
    return survivors_floor(sampler.expected_cohort(), sampler.rate_at(1), cfg.ddp.dropout)


def plan(cfg, num_clients: int, z: float, dim: int) -> DistributedPlan:
    """The round's distributed-DP parameters at noise multiplier z for a ``dim``-coordinate
    upload."""
    d, sampler = cfg.ddp, client_sampler(cfg.sampling, num_clients)
    return DistributedPlan(
        mechanism=d.mechanism,
        bits=int(d.bits),
        beta=float(d.beta),
        k_stddevs=float(d.k_stddevs),
        clip_norm=float(cfg.dp.clip_norm),
        noise_multiplier=float(z),
        dim=int(dim),
        min_survivors=survivor_threshold(cfg, sampler),
        max_clients=int(sampler.capacity()),
        rotation=d.rotation,
    )


def denominator(cfg, expected: float) -> float:
    """The fixed denominator: the expected survivors, (1 - dropout) x the expected cohort."""
    return expected * (1.0 - cfg.ddp.dropout)


def build_from_plan(distributed_plan: DistributedPlan) -> DistributedNoise:
    """The transform of a plan on a flat upload (what its releases need; the run's keeps the
    upload's structure)."""
    template = jax.ShapeDtypeStruct((distributed_plan.dim,), jax.numpy.float32)
    return DistributedNoise(distributed_plan, template)


def build_noise(ctx, schedule, details) -> DistributedNoise:
    dim = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(ctx.params_template))
    return DistributedNoise(
        plan(ctx.cfg, ctx.num_clients, schedule[0][1], dim),
        ctx.params_template,
        float(ctx.cfg.ddp.dropout),
        ctx.cfg.ddp.shares == "summed",
        details=details,
    )


def stand_in_dimension(cfg) -> int | None:
    """The model's parameter count on its source's known input shape and classes, before any data
    loads (None where the source's name does not say them)."""
    from fedjax_dp.models import get_model

    shape, classes = known_shapes(cfg.data.source)
    if shape is None:
        return None
    params = jax.eval_shape(get_model(cfg.model.name, shape, classes).init, jax.random.key(0))
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))


def check_ddp(cfg, need) -> None:
    """The section's rules (before any data loads)."""
    d = cfg.ddp
    need(
        d.mechanism in MECHANISMS, f"ddp.mechanism {d.mechanism!r} unknown; available: {MECHANISMS}"
    )
    need(
        isinstance(d.bits, int) and 2 <= d.bits <= MAX_BITS,
        f"ddp.bits must be an integer in [2, {MAX_BITS}] (int32 modular sums), got {d.bits!r}",
    )
    need(0 <= d.beta < 1, f"ddp.beta must lie in [0, 1), got {d.beta}")
    need(d.k_stddevs > 0, f"ddp.k_stddevs must be > 0, got {d.k_stddevs}")
    need(0 <= d.dropout < 1, f"ddp.dropout must lie in [0, 1), got {d.dropout}")
    need(d.rotation in ROTATIONS, f"ddp.rotation {d.rotation!r} unknown; available: {ROTATIONS}")
    need(d.shares in SHARES, f"ddp.shares {d.shares!r} unknown; available: {SHARES}")
    need(
        d.shares != "summed" or d.mechanism == "skellam",
        f"ddp.shares='summed' with ddp.mechanism={d.mechanism!r}: only Skellam shares sum to a"
        " draw of their own family (a sum of discrete Gaussians is not one); use"
        " ddp.shares='per_client'",
    )
    need(
        isinstance(d.min_survivors, int) and d.min_survivors >= 0,
        f"ddp.min_survivors must be an integer >= 0 (0 = the default), got {d.min_survivors!r}",
    )
    need(
        cfg.dp.clip in ("fixed", "per_layer"),
        f"dp.noise_mode='distributed' with dp.clip={cfg.dp.clip!r}: the quantised sum is bounded by"
        " a fixed clip; use dp.clip='fixed' or 'per_layer'",
    )
    need(
        not cfg.dp.noise_schedule,
        f"dp.noise_mode='distributed' with dp.noise_schedule={cfg.dp.noise_schedule!r}: one noise"
        " multiplier for the run",
    )
    sampler = client_sampler(cfg.sampling, cfg.data.num_clients)
    capacity = sampler.capacity()
    if isinstance(d.bits, int) and d.k_stddevs > 0:
        need(
            2.0 ** (2 * d.bits) > d.k_stddevs**2 * capacity,
            f"ddp.bits={d.bits} is too few for the {capacity} clients a round may hold at"
            f" ddp.k_stddevs={d.k_stddevs}: 2^(2 bits) must exceed k^2 n; raise ddp.bits or lower"
            " ddp.k_stddevs",
        )
    if isinstance(d.min_survivors, int):
        need(
            d.min_survivors <= capacity,
            f"ddp.min_survivors={d.min_survivors} exceeds the {capacity} clients a round may hold",
        )


registry.register_section(
    "ddp",
    docs={
        "mechanism": "ddgauss (distributed discrete Gaussian, Kairouz, Liu and Steinke 2021) |"
        " skellam (Agarwal, Kairouz and Liu 2021): each client's share of integer noise",
        "bits": "the modular sum's bit width (at most 32: int32 secure-aggregation words)",
        "beta": "conditional randomized rounding's failure probability (the rounded norm bound)",
        "k_stddevs": "standard deviations of the noised, quantised sum that must fit the bit width"
        " (chooses the quantisation step gamma)",
        "dropout": "the chance a sampled client drops out before sending (its noise share missing)",
        "rotation": "hadamard (random signs, then the Walsh-Hadamard transform) | none",
        "min_survivors": "the fewest surviving clients the noise is calibrated for; a round with"
        " fewer aborts, as secure aggregation does (0 = the expected survivors less 3 sd)",
        "shares": "per_client (each client draws its share) | summed (Skellam only: the surviving"
        " shares' sum drawn once at the aggregator; the modular sum has the same law, at a"
        " fraction of the simulation's cost)",
    },
    read_when=tuple(
        (f"ddp.{key}", "dp.noise_mode", (DISTRIBUTED,))
        for key in (
            "mechanism",
            "bits",
            "beta",
            "k_stddevs",
            "dropout",
            "rotation",
            "min_survivors",
            "shares",
        )
    ),
    defaults={
        "mechanism": "ddgauss",
        "bits": 16,
        "beta": math.exp(-0.5),
        "k_stddevs": 4.0,
        "dropout": 0.0,
        "rotation": "hadamard",
        "min_survivors": 0,
        "shares": "per_client",
    },
)
