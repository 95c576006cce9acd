"""The ``hypergrad`` config section: online hyper-gradient adaptation of the round's settings
(``online``), registered with the algorithms' wrappers (``algorithms.registry``); on when
``hyper_lr`` > 0, with FedAvg, FedProx, DP-FedAvg and UGA.

Privacy: with ``source=server`` the hyper-gradient reads the server-held set. Under a DP algorithm
it may adapt only the server learning rate with a lookahead of one round, where it is
post-processing of the released aggregate (no privacy cost, recorded so in ``privacy.json``); the
derivative through local training reads the clients' data and would be an unaccounted release.
With ``source=clients`` the sampled clients compute it on their own local test data, clipped and
noised, in one or two Gaussian releases per round on the round's cohort that the run's ledger
composes with the round's own (``client_source``): every setting may adapt under DP, at that cost.
"""

from __future__ import annotations

import dataclasses

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.data.packing import num_steps
from fedjax_dp.hypergrad.client_source import (
    CLIENT_SETTINGS,
    ClientHyperGradient,
    ClientOptions,
    HeldOut,
    hyper_releases,
)
from fedjax_dp.hypergrad.differentiable import SETTINGS
from fedjax_dp.hypergrad.online import HyperOptions, OnlineHypertuned

SOURCES = ("server", "clients")
STEP_RULES = ("sgd", "normalized")

DEFAULTS = {
    "adapt": "client_lr,server_lr",
    "hyper_lr": 0.0,
    "step_rule": "sgd",
    "source": "server",
    "clip": 1.0,
    "setting_clip": 0.1,
    "noise_multiplier": 1.0,
    "lookahead": 1,
    "remat": False,
    "batch_size": 256,
    "backtrack": 0.0,
}

DOCS = {
    "adapt": (
        "the settings that adapt, comma-separated: client_lr, server_lr, step_weights (a factor on"
        " each local step's learning rate); each is optimised as the log of its multiplier"
    ),
    "hyper_lr": (
        "beta of the hyper-gradient step on the log-multipliers after every round (Baydin et al."
        " 2018); 0.0: off"
    ),
    "step_rule": (
        "sgd: theta -= hyper_lr g (Baydin et al. Eq. 2; the step scales with the loss) |"
        " normalized: theta -= hyper_lr g / ||g|| (each round moves the log-multipliers by"
        " hyper_lr: a rate 10x off is recovered in log(10) / hyper_lr rounds)"
    ),
    "source": (
        "server: the held-out loss on the server-held set (server_data; no privacy cost where it"
        " is post-processing) | clients: each sampled client's loss on its own local test data,"
        " its gradient and setting derivatives clipped and noised (accounted releases)"
    ),
    "clip": "source=clients: the L2 clip C of each client's held-out gradient",
    "setting_clip": (
        "source=clients: the L2 clip C' of each client's derivative in the adapted client"
        " settings (client_lr, step_weights); about |u . Delta| with u the released gradient"
        " times the server rate and Delta the clipped update"
    ),
    "noise_multiplier": (
        "source=clients: z of both hyper-gradient releases (std z C and z C' on the clipped sums);"
        " > 0 under DP"
    ),
    "lookahead": "rounds the hyper-gradient looks back through (truncated; 1 = the round just run)",
    "remat": "jax.checkpoint on each round of a lookahead > 1 (memory: one round's residuals)",
    "batch_size": "examples of the server-held set in each round's held-out batch",
    "backtrack": (
        "0.0: off | r > 0 (source=server): a round whose held-out loss rises by more than r"
        " (relative) is undone, the model kept and the adapted client and server rates halved"
    ),
}


def adapted(cfg) -> tuple[str, ...]:
    """``hypergrad.adapt`` as a tuple of names."""
    return tuple(name.strip() for name in str(cfg.hypergrad.adapt).split(",") if name.strip())


def enabled(cfg) -> bool:
    return cfg.hypergrad.hyper_lr != 0  # a negative rate turns it on to be refused


def check_hypergrad(cfg, need) -> None:
    h = cfg.hypergrad
    need(h.hyper_lr >= 0, f"hypergrad.hyper_lr must be >= 0, got {h.hyper_lr}")
    if not h.hyper_lr > 0:
        return
    need(
        cfg.algorithm in registry.with_scaled_rates(),
        f"hypergrad.hyper_lr={h.hyper_lr}: algorithm {cfg.algorithm!r} cannot adapt its settings;"
        f" use one of {registry.with_scaled_rates()}",
    )
    names = adapted(cfg)
    unknown = [n for n in names if n not in SETTINGS]
    need(
        bool(names) and not unknown,
        f"hypergrad.adapt={h.adapt!r}: unknown or empty; choose from {SETTINGS}",
    )
    need(
        h.step_rule in STEP_RULES,
        f"hypergrad.step_rule={h.step_rule!r} unknown; available: {STEP_RULES}",
    )
    need(h.source in SOURCES, f"hypergrad.source={h.source!r} unknown; available: {SOURCES}")
    need(h.clip > 0, f"hypergrad.clip must be > 0, got {h.clip}")
    need(h.setting_clip > 0, f"hypergrad.setting_clip must be > 0, got {h.setting_clip}")
    need(
        h.noise_multiplier >= 0,
        f"hypergrad.noise_multiplier must be >= 0, got {h.noise_multiplier}",
    )
    need(
        isinstance(h.lookahead, int) and h.lookahead >= 1,
        f"hypergrad.lookahead must be an integer >= 1, got {h.lookahead!r}",
    )
    need(h.batch_size >= 1, f"hypergrad.batch_size must be >= 1, got {h.batch_size}")
    need(h.backtrack >= 0, f"hypergrad.backtrack must be >= 0, got {h.backtrack}")
    need(
        not (h.backtrack and h.source == "clients"),
        f"hypergrad.backtrack={h.backtrack} with source='clients': the clients' held-out loss is"
        " not released, so the server cannot compare it; use source='server'",
    )
    need(
        not cfg.fedmeta.enabled,
        "hypergrad.hyper_lr > 0 with fedmeta.enabled: two wrappers of the server step; use one",
    )
    need(
        not cfg.audit.canaries,
        f"hypergrad.hyper_lr > 0 with audit.canaries={cfg.audit.canaries}: not supported together",
    )
    entry = registry.get(cfg.algorithm) if cfg.algorithm in registry.names() else None
    private = entry is not None and "dp" in entry.sections
    if h.source == "clients":
        _check_client_source(cfg, need, private)
        return
    need(
        not private or (names == ("server_lr",) and h.lookahead == 1),
        f"hypergrad.adapt={h.adapt!r}, lookahead={h.lookahead} under {cfg.algorithm}: the"
        " derivative through local training reads the clients' data (an unaccounted release);"
        " with source='server' a DP run may adapt only server_lr with lookahead 1; or use"
        " source='clients' (accounted)",
    )


def _check_client_source(cfg, need, private: bool) -> None:
    h = cfg.hypergrad
    need(
        h.lookahead == 1,
        f"hypergrad.lookahead={h.lookahead} with source='clients': the clients' derivative is of"
        " the round just run (lookahead 1)",
    )
    if not private:
        return
    need(
        h.noise_multiplier > 0,
        f"hypergrad.noise_multiplier={h.noise_multiplier} with source='clients' under"
        f" {cfg.algorithm}: the clients' hyper-gradients would be released without noise",
    )
    need(
        cfg.dp.noise_mode == "central",
        f"hypergrad.source='clients' with dp.noise_mode={cfg.dp.noise_mode!r}: the"
        " hyper-gradient releases are noised by the server (central); use dp.noise_mode='central'",
    )
    need(
        cfg.dp.noise == "gaussian",
        f"hypergrad.source='clients' with dp.noise={cfg.dp.noise!r}: the per-round hyper-gradient"
        " releases cannot join a correlated-noise stream's account; use dp.noise='gaussian'",
    )


def wrap_hypergrad(ctx, algorithm, server_set) -> OnlineHypertuned:
    h = ctx.cfg.hypergrad
    if h.source == "server" and server_set is None:
        raise ValueError("hypergrad.source='server' needs a server-held set (server_data)")
    if not isinstance(algorithm, FedAvg):
        raise ValueError(
            f"hypergrad: {type(algorithm).__name__} is not a FedAvg-family algorithm"
            f" ({registry.with_scaled_rates()})"
        )
    cfg = ctx.cfg
    sizes = ctx.client_sizes or (1,)
    steps = num_steps(max(sizes), cfg.client.batch_size, cfg.client.epochs)
    # the deferred-dense trainer takes one scalar rate: the per-step factors need the plain one
    base = dataclasses.replace(algorithm, deferred_dense_rate=None)
    options = HyperOptions(
        adapted(cfg),
        h.hyper_lr,
        h.lookahead,
        bool(h.remat),
        h.batch_size,
        h.step_rule,
        float(h.backtrack),
    )
    tuned = OnlineHypertuned(
        base,
        steps,
        options=options,
        held_x=None if server_set is None else server_set.x,
        held_y=None if server_set is None else server_set.y,
        client_lr=cfg.client.learning_rate,
        server_lr=cfg.server.learning_rate,
    )
    if h.source != "clients":
        return tuned
    dataset = ctx.dataset
    if dataset is not None and not any(len(i) for i in dataset.client_test):
        raise ValueError(
            f"hypergrad.source='clients' on data.source={cfg.data.source!r}: no client holds local"
            " test data (client_test) to compute a held-out loss on; use source='server'"
        )
    held_out = (
        None
        if dataset is None
        else HeldOut(dataset.x, dataset.y, dataset.client_test, int(h.batch_size))
    )
    client = ClientOptions(
        float(h.clip), float(h.setting_clip), float(h.noise_multiplier), adapted(cfg)
    )
    return dataclasses.replace(tuned, client_source=ClientHyperGradient(tuned, held_out, client))


def own_releases(cfg) -> list:
    """What ``source=clients`` releases each round on the round's cohort (``client_source``); none
    for the server source."""
    h = cfg.hypergrad
    if h.source != "clients":
        return []
    client_side = any(name in CLIENT_SETTINGS for name in adapted(cfg))
    return hyper_releases(h.clip, h.setting_clip, h.noise_multiplier, client_side)


def privacy_label(cfg) -> dict:
    """What ``privacy.json`` records of the hyper-gradients (under ``hypergrad``)."""
    names = adapted(cfg)
    if cfg.hypergrad.source == "clients":
        return {
            "source": "clients",
            "adapt": list(names),
            "privacy_cost": "accounted",
            "why": (
                "each sampled client's held-out gradient (and, for client settings, its derivative"
                " in them) clipped and noised by the server: Gaussian releases on the round's"
                " cohort, composed with the round's own (listed under mechanisms)"
            ),
        }
    server_only = names == ("server_lr",) and cfg.hypergrad.lookahead == 1
    return {
        "source": cfg.hypergrad.source,
        "adapt": list(names),
        "privacy_cost": "none",
        "why": (
            "computed on the server-held set from the released aggregate alone (post-processing)"
            if server_only
            else "computed on the server-held set through the clients' local training: only in"
            " a run without a privacy guarantee (config refuses it under DP)"
        ),
    }


registry.register_wrapper(
    "hypergrad",
    DEFAULTS,
    docs=DOCS,
    wrap=wrap_hypergrad,
    validate=check_hypergrad,
    needs_server_set=lambda cfg: cfg.hypergrad.source == "server",
    switch=enabled,
    switch_key="hyper_lr",
    privacy_label=privacy_label,
    releases=own_releases,
    privacy_note=(
        "hyper-gradients (hypergrad, source=server) use the server-held set; the guarantee holds"
        " only if it holds no protected client's data"
    ),
)
