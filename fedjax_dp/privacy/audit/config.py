"""The ``audit`` config section: canary clients inside the run and the empirical epsilon they give
(``privacy.audit.in_run``), registered with the config (``core.config_sections``); on when
``canaries`` > 0."""

from __future__ import annotations

from fedjax_dp.core import canary_uploads, config_sections

PARTICIPATION = ("sampled", "every_round")
DIRECTIONS = tuple(canary_uploads.DIRECTIONS)

DEFAULTS = {
    "canaries": 0,
    "participation": "sampled",
    "scale": 1.0,
    "confidence": 0.95,
    "all_iterates": True,
    "side_by_side": False,
    "directions": "gaussian",
}

DOCS = {
    "canaries": (
        "k > 0: 2k canary clients, each inserted into the run on a fair coin (about k join), plus"
        " k reference directions never inserted; their statistics give an empirical epsilon beside"
        " the formal one (an estimate, not a guarantee). 0: off"
    ),
    "participation": (
        "sampled: a canary takes part when the client it shadows is drawn (the real clients' law;"
        " compared with their epsilon) | every_round: every inserted canary in every round (the"
        " unamplified threat model; compared with the unamplified composition)"
    ),
    "scale": (
        "a canary's update norm, in multiples of dp.clip_norm (the chain clips it; > 1 also"
        " tests the clipping)"
    ),
    "confidence": "confidence of the one-run lower bound and of the estimate's interval",
    "all_iterates": (
        "also estimate for an adversary who sees every round's aggregate (keeps each round's"
        " aggregate on disk under <workdir>/audit until the run ends)"
    ),
    "side_by_side": (
        "train a second model with the canaries beside the run's own, which has none: the metrics"
        " are the canary-free model's, the estimate the canary model's (twice the training; the"
        " estimate then comes from a model the epsilon does not cover, and says so)"
    ),
    "directions": (
        "the canaries' random unit directions: gaussian (isotropic, Andrew et al.'s) | rademacher"
        " (signs +-1/sqrt(d) from a counter hash: the same null statistics, about a tenth of the"
        " cost to regenerate each round, so 1,000 canaries cost a few per cent of a round)"
    ),
}


def check_audit(cfg, need) -> None:
    a = cfg.audit
    need(
        isinstance(a.canaries, int) and a.canaries >= 0,
        f"audit.canaries must be an integer >= 0, got {a.canaries!r}",
    )
    if not a.canaries:
        return
    need(a.canaries >= 8, f"audit.canaries={a.canaries}: an estimate needs at least 8 canaries")
    need(
        a.participation in PARTICIPATION,
        f"audit.participation {a.participation!r} unknown; available: {PARTICIPATION}",
    )
    need(
        a.directions in DIRECTIONS,
        f"audit.directions {a.directions!r} unknown; available: {DIRECTIONS}",
    )
    need(a.scale > 0, f"audit.scale must be > 0, got {a.scale}")
    need(0.5 < a.confidence < 1, f"audit.confidence must lie in (0.5, 1), got {a.confidence}")
    from fedjax_dp.algorithms import registry  # the algorithms register after this section

    entry = registry.get(cfg.algorithm) if cfg.algorithm in registry.names() else None
    need(
        entry is not None and "dp" in entry.sections,
        f"audit.canaries={a.canaries}: canaries are audited against the clip and epsilon of the dp"
        f" section; algorithm {cfg.algorithm!r} has none (use dp_fedavg or dp_uga)",
    )
    if entry is None or "dp" not in entry.sections:
        return
    dp = cfg.dp
    need(
        dp.clip != "median",
        "audit.canaries: dp.clip='median' clips the cohort as a whole; canary clients cannot"
        " join it (and it has no formal guarantee to compare with)",
    )
    need(
        not (a.side_by_side and cfg.compression.error_feedback),
        "audit.side_by_side: the canary model would share the clients' error-feedback residuals;"
        " set compression.error_feedback=False",
    )
    if a.participation == "every_round":
        need(
            dp.noise_mode in ("central", "distributed") and dp.noise == "gaussian",
            "audit.participation='every_round' is compared with the unamplified composition of"
            f" independent central noise; under dp.noise_mode={dp.noise_mode!r},"
            f" dp.noise={dp.noise!r} use audit.participation='sampled'",
        )


config_sections.register_section("audit", DEFAULTS, DOCS, check_audit)
