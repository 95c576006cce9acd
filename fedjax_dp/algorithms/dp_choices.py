"""The clip rules (``dp.clip``) and noise families (``dp.noise``) of the ``dp`` section, each a
registered choice (``privacy.mechanisms.choices``) with its builder, its keys and its checks.

A clip rule's ``build(ctx, denominator)`` gives its upload transform; an adaptive one also states,
from the config alone, the release of its count (``count_release(cfg, denominator)``), which the
update noise is raised for. A noise family's ``build(ctx, schedule, details)`` gives its transform
for the run's noise multipliers; ``releases_of(cfg, z, denominator)`` what it releases at z,
from the config alone (what calibration solves over). Adding one: a transform in
``privacy/mechanisms/`` and a ``register_choice`` call (``docs/adding_an_algorithm.md``, "Adding a
mechanism").
"""

from __future__ import annotations

import math

import jax

from fedjax_dp.algorithms import ddp_section
from fedjax_dp.core.release import Release
from fedjax_dp.privacy.correlated import soundness, strategies
from fedjax_dp.privacy.correlated.plan import NoisePlan
from fedjax_dp.privacy.mechanisms import choices
from fedjax_dp.privacy.mechanisms.choices import get, register_choice
from fedjax_dp.privacy.mechanisms.upload_clipping import (
    AdaptiveQuantileClip,
    FlatClip,
    MedianClip,
    PerLayerClip,
)
from fedjax_dp.privacy.mechanisms.upload_correlated_noise import CorrelatedNoise, stream_release
from fedjax_dp.privacy.mechanisms.upload_layer_quantile_clip import PerLayerQuantileClip
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.privacy.sampling import participation_of, participation_schemes

ADAPTIVE_KEYS = {
    "target_quantile": (0.5, "adaptive clipping: the quantile of update norms S tracks"),
    "clip_learning_rate": (0.2, "adaptive clipping: geometric step of S per round"),
}


def count_noise_std(denominator: float) -> float:
    """sigma_b of an adaptive clip's count: D / 20 for large cohorts (Andrew et al. 2021), at
    least 1."""
    return max(denominator / 20, 1.0)


def _count_release(cfg, denominator: float, local: bool = False) -> Release:
    """The count an adaptive clip releases each round, as ``AdaptiveQuantileClip`` states it (the
    per-layer counts at L = 1: L counts at sigma_b sqrt(L) each release what one at sigma_b
    does)."""
    std = count_noise_std(denominator)
    return Release(
        "adaptive-clip count of unclipped clients (Andrew et al. 2021)",
        "local" if local else "central",
        std / AdaptiveQuantileClip.COUNT_BOUND,
        "1/2 per client (b - 1/2)",
        bound_value=AdaptiveQuantileClip.COUNT_BOUND,
    )


def _check_adaptive(cfg, need) -> None:
    dp = cfg.dp
    need(
        0 < dp.target_quantile < 1,
        f"dp.target_quantile must lie in (0, 1), got {dp.target_quantile}",
    )
    schedule = cfg.sampling.get("rate_schedule", "") if cfg.sampling.method == "poisson" else ""
    need(
        not schedule,
        f"dp.clip={dp.clip!r} estimates its quantile against a fixed expected count; with "
        f"sampling.rate_schedule={schedule!r} use dp.clip='fixed', 'per_layer' or 'median'",
    )


def _check_central_adaptive(cfg, need) -> None:
    _check_adaptive(cfg, need)
    need(
        cfg.dp.noise_mode != "local",
        "dp.clip='adaptive' with dp.noise_mode='local' is refused: each client's clip bit would"
        " reach the server un-noised (not locally private); use dp.clip='fixed', 'per_layer' or"
        " 'per_layer_adaptive' (whose counts each client noises itself) with local noise",
    )


def _check_median(cfg, need) -> None:
    need(cfg.dp.noise_mode != "local", "dp.clip='median' cannot run with local noise")


def _per_layer_adaptive(ctx, denominator: float) -> PerLayerQuantileClip:
    dp = ctx.cfg.dp
    layers = len(jax.tree_util.tree_leaves(ctx.params_template))
    return PerLayerQuantileClip(
        initial_layer_norms=(dp.clip_norm / math.sqrt(layers),) * layers,
        target_quantile=dp.target_quantile,
        learning_rate=dp.clip_learning_rate,
        count_noise_std=count_noise_std(denominator) * math.sqrt(layers),
        denominator=denominator,
        local=dp.noise_mode == "local",
    )


register_choice(
    "dp",
    "clip",
    "fixed",
    build=lambda ctx, denominator: FlatClip(ctx.cfg.dp.clip_norm),
    doc="S on the whole update (Geyer et al. 2017)",
    fixed_bound=True,
)
register_choice(
    "dp",
    "clip",
    "per_layer",
    build=lambda ctx, denominator: PerLayerClip.equal_split(
        ctx.params_template, ctx.cfg.dp.clip_norm
    ),
    doc="S / sqrt(L) on each of L layers",
    fixed_bound=True,
)
register_choice(
    "dp",
    "clip",
    "adaptive",
    build=lambda ctx, denominator: AdaptiveQuantileClip(
        initial_clip_norm=ctx.cfg.dp.clip_norm,
        target_quantile=ctx.cfg.dp.target_quantile,
        learning_rate=ctx.cfg.dp.clip_learning_rate,
        count_noise_std=count_noise_std(denominator),
        denominator=denominator,
    ),
    doc="private quantile, Andrew et al. 2021",
    keys=ADAPTIVE_KEYS,
    validate=_check_central_adaptive,
    count_release=lambda cfg, denominator: _count_release(cfg, denominator),
)
register_choice(
    "dp",
    "clip",
    "per_layer_adaptive",
    build=_per_layer_adaptive,
    doc="the same per layer from S / sqrt(L) each; counts noised by the server, or by each client"
    " under local noise",
    keys=ADAPTIVE_KEYS,
    validate=_check_adaptive,
    count_release=lambda cfg, denominator: _count_release(
        cfg, denominator, local=cfg.dp.noise_mode == "local"
    ),
)
register_choice(
    "dp",
    "clip",
    "median",
    build=lambda ctx, denominator: MedianClip(),
    doc="Geyer et al.'s median norm: NOT private, labelled",
    validate=_check_median,
)


def strategy_rounds(cfg) -> int:
    """The rounds the noise strategy is built (optimised) for: ``dp.strategy_rounds``, or the
    run's."""
    return cfg.dp.strategy_rounds or cfg.rounds


def correlated(cfg) -> bool:
    """Whether the run adds correlated noise (or independent noise under a participation scheme,
    the identity strategy): ``privacy.correlated``."""
    family = choices.get("dp", "noise", cfg.dp.noise) if cfg.dp.noise in noises() else None
    return bool(family and family.correlated) or cfg.sampling.method in participation_schemes()


def noises() -> tuple[str, ...]:
    """The registered noise families (``dp.noise``)."""
    return choices.names("dp", "noise")


def strategy_name(cfg) -> str:
    return "identity" if cfg.dp.noise == "gaussian" else cfg.dp.noise


def _independent(ctx, schedule, details):
    dp = ctx.cfg.dp
    if ddp_section.distributed(ctx.cfg):
        return ddp_section.build_noise(ctx, schedule, details)
    adaptive = get("dp", "clip", dp.clip).traits.get("count_release") is not None
    return GaussianNoise(
        schedule,
        local=dp.noise_mode == "local",
        count_noise_std=count_noise_std(ctx.expected_cohort()) if adaptive else 0.0,
        details=details,
    )


def _correlated_noise(ctx, schedule, details) -> CorrelatedNoise:
    """The server's correlated noise: ``dp.noise``'s strategy (``gaussian``: the identity) for the
    strategy's rounds under the sampler's participation scheme, at z."""
    cfg = ctx.cfg
    participation = participation_of(cfg.sampling)
    strategy = strategies.build(
        strategy_name(cfg), strategy_rounds(cfg), participation, cfg.dp.bands, cfg.dp.tree_restart
    )
    return CorrelatedNoise(NoisePlan(strategy, participation, schedule[0][1]), details=details)


def build_noise(ctx, schedule, details) -> object:
    """Gaussian noise: independent, or the identity strategy's stream under a participation
    scheme."""
    if correlated(ctx.cfg):
        return _correlated_noise(ctx, schedule, details)
    return _independent(ctx, schedule, details)


def _independent_releases(cfg, z: float, denominator: float, dim=None) -> list[Release]:
    if ddp_section.distributed(cfg):
        if dim is None:
            raise ValueError("distributed noise's releases need the upload's dimension")
        num_clients = cfg.data.num_clients
        noise = ddp_section.build_from_plan(ddp_section.plan(cfg, num_clients, z, dim))
        return list(noise.releases(noise.inputs(1)))
    counted = get("dp", "clip", cfg.dp.clip).traits.get("count_release")
    noise = GaussianNoise(
        ((1, z),),
        local=cfg.dp.noise_mode == "local",
        count_noise_std=count_noise_std(denominator) if counted else 0.0,
    )
    return list(noise.releases(noise.inputs(1)))


def _stream_releases(cfg, z: float, denominator: float, dim=None) -> list[Release]:
    return [stream_release(participation_of(cfg.sampling), z, strategy_rounds(cfg))]


def _gaussian_releases(cfg, z: float, denominator: float, dim=None) -> list[Release]:
    if correlated(cfg):
        return _stream_releases(cfg, z, denominator)
    return _independent_releases(cfg, z, denominator, dim)


def noise_releases(
    cfg, num_clients: int, z: float, denominator: float, dim: int | None = None
) -> list[Release]:
    """What round 1 releases at noise multiplier z, from the config alone (no model; distributed
    noise: for an upload of ``dim`` coordinates): the noise family's release (a correlated stream:
    the whole stream's) and an adaptive clip's count beside it."""
    releases = get("dp", "noise", cfg.dp.noise).releases_of(cfg, z, denominator, dim)
    counted = get("dp", "clip", cfg.dp.clip).traits.get("count_release")
    if counted and not correlated(cfg):
        releases = releases + [counted(cfg, denominator)]
    return releases


def check_correlated(cfg, need) -> None:
    """Correlated noise's refusals from the configuration alone; the strategy's soundness rules are
    ``privacy.correlated.soundness``'s, the ones ``NoisePlan`` applies."""
    dp, s = cfg.dp, cfg.sampling
    for key in ("bands", "tree_restart", "strategy_rounds"):
        value = dp[key]
        need(
            isinstance(value, int) and value >= 0,
            f"dp.{key} must be an integer >= 0 (0 = the default), got {value!r}",
        )
    if not correlated(cfg):
        return
    noise, schemes = f"dp.noise={dp.noise!r}", participation_schemes()
    if s.method not in schemes:
        need(
            False,
            f"{noise} is calibrated for a participation scheme the sampler must enforce, and"
            f" sampling.method={s.method!r} enforces none (a client may be drawn in any round):"
            f" use one of {schemes}",
        )
        return
    need(
        dp.noise_mode == "central",
        f"{noise} with dp.noise_mode={dp.noise_mode!r}: correlated noise is added by the "
        "server across rounds; a client cannot correlate noise over rounds it does not see",
    )
    need(
        get("dp", "clip", dp.clip).traits.get("fixed_bound", False),
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
    if not all(isinstance(dp[k], int) and dp[k] >= 0 for k in ("bands", "tree_restart")):
        return
    n = strategy_rounds(cfg)
    found = soundness.problems(
        strategy_name(cfg), n, participation_of(s), dp.bands, dp.tree_restart
    )
    keys = {
        "bands": f"dp.bands={dp.bands} > sampling.min_separation={s.min_separation}",
        "amplification": f"{noise} with sampling.method={s.method!r}",
        "dense_rounds": f"{noise} for {n} rounds",
        "dense_groups": f"{noise} with sampling.min_separation={s.min_separation}",
        "restart": f"dp.tree_restart={dp.tree_restart} > the strategy's rounds {n}",
        "tree_rounds": f"{noise} for {n} rounds",
    }
    for rule, why in found.items():
        need(False, f"{keys[rule]}: {why}")


CORRELATED_DOCS = {
    "tree": "binary-tree aggregation, DP-FTRL",
    "tree_restart": "the tree restarted every dp.tree_restart rounds, DP-FTRL's TreeRestart",
    "tree_honaker": "the tree with Honaker's efficient estimator",
    "banded": "banded MF",
    "blt": "buffered-linear-Toeplitz MF",
    "dense": "optimised dense MF, short runs",
}
STRATEGY_ROUNDS = (0, "correlated noise: the rounds the strategy is built for (0 = rounds)")
CORRELATED_KEYS = {
    "banded": {
        "bands": (
            0,
            "dp.noise='banded': the strategy's bands (0 = sampling.min_separation, at most it;"
            " single participation: 0 = the run)",
        )
    },
    "tree_restart": {
        "tree_restart": (
            0,
            "dp.noise='tree_restart': the rounds of each tree (0 = sampling.min_separation, so a"
            " client takes part at most once per tree; single participation: the run)",
        )
    },
}

register_choice(
    "dp",
    "noise",
    "gaussian",
    build=build_noise,
    doc="independent per round; under a participation scheme: the identity strategy, no"
    " amplification",
    validate=check_correlated,
    correlated=False,
    releases_of=_gaussian_releases,
)
for _name, _doc in CORRELATED_DOCS.items():
    register_choice(
        "dp",
        "noise",
        _name,
        build=_correlated_noise,
        doc=_doc + "; correlated: needs a participation scheme (sampling.method)",
        keys={"strategy_rounds": STRATEGY_ROUNDS, **CORRELATED_KEYS.get(_name, {})},
        validate=check_correlated,
        correlated=True,
        releases_of=_stream_releases,
    )
