"""The ``compression`` config section: compressed-sensing uploads (CUAG-PFL, Li, Xiao and Chen
2024, Alg. 2-3) composable with any algorithm and DP, its defaults, what each key means and its
checks, registered with the config (``core.config_sections``); on when ``enabled``."""

from __future__ import annotations

from fedjax_dp.compression.operators import KINDS
from fedjax_dp.compression.reconstruction import METHODS
from fedjax_dp.compression.refresh import REFRESH
from fedjax_dp.compression.signs import SIGNS
from fedjax_dp.compression.upload_transform import FIXED_MATRIX_FEEDBACK, CompressedSensing
from fedjax_dp.core import config_sections
from fedjax_dp.core.uploads import Chain, chain

DEFAULTS = {
    "enabled": False,
    "kind": "block",
    "rates": "dynamic",
    "r_min": 0.2,
    "r_max": 0.5,
    "method": "min_norm",
    "seed": 0,
    "materialize_gb": 1.0,
    "refresh": "fixed",
    "signs": "none",
    "error_feedback": False,
}

DOCS = {
    "enabled": (
        "compressed-sensing uploads (CUAG-PFL Alg. 2-3), composable with any algorithm and DP"
    ),
    "kind": "measurement operator: block (Alg. 3, O(I)) | gaussian | bernoulli",
    "rates": "'dynamic' (Alg. 2, layer-wise) or a fixed rate such as '0.5'",
    "r_min": "Alg. 2: the least measurement rate",
    "r_max": "Alg. 2: the largest measurement rate",
    "method": "server reconstruction: min_norm | ista_dct",
    "seed": "seed of the measurement matrices (shared by clients and server)",
    "materialize_gb": (
        "gaussian/bernoulli: hold the round's matrices in memory up to this many GB (float32; "
        "one generation a round instead of one a product); 0 = regenerate tile by tile"
    ),
    "refresh": (
        "fixed: the same measurement matrices every round (Alg. 3 as written: the model moves only"
        " in their fixed row space) | round: each layer's entries permuted per round from the"
        " shared seed (not in seed 004; same traffic)"
    ),
    "signs": (
        "none: Alg. 3 as written (its block rows sum to all-ones, so each layer's mean shift is"
        " kept whole: measured to collapse CIFAR-100) | random: a shared +-1 per entry before"
        " measuring, so every direction is kept alike (not in seed 004; same cost and traffic)"
    ),
    "error_feedback": (
        "keep each client's residual x - Rec(Phi x) and add it to its next upload (error "
        "feedback, Karimireddy et al. 2019; not in seed 004; needs refresh='round'; with partial "
        "participation the residuals go stale (Li & Li 2023): it lowered seed 004's accuracy)"
    ),
}


def check_compression(cfg, need) -> None:
    c = cfg.compression
    if not c.enabled:
        need(
            not c.error_feedback,
            "compression.error_feedback=True feeds back the compression residual; it needs"
            " compression.enabled=True",
        )
        return
    need(c.kind in KINDS, f"compression.kind {c.kind!r} unknown; available: {KINDS}")
    need(c.method in METHODS, f"compression.method {c.method!r} unknown; available: {METHODS}")
    need(
        0 < c.r_min <= 1 and 0 < c.r_max <= 1,
        f"compression rates must lie in (0, 1]; got r_min={c.r_min}, r_max={c.r_max}",
    )
    need(c.r_min <= c.r_max, f"compression.r_min={c.r_min} exceeds r_max={c.r_max}")
    need(c.seed >= 0, f"compression.seed must be >= 0, got {c.seed}")
    need(
        c.materialize_gb >= 0,
        f"compression.materialize_gb must be >= 0 (0 = never), got {c.materialize_gb}",
    )
    need(c.refresh in REFRESH, f"compression.refresh {c.refresh!r} unknown; available: {REFRESH}")
    need(c.signs in SIGNS, f"compression.signs {c.signs!r} unknown; available: {SIGNS}")
    need(not c.error_feedback or c.refresh != "fixed", FIXED_MATRIX_FEEDBACK)
    if c.rates != "dynamic":
        try:
            rate = float(c.rates)
        except ValueError:
            rate = None
        need(
            rate is not None and 0 < rate <= 1,
            f"compression.rates must be 'dynamic' or a rate in (0, 1], got {c.rates!r}",
        )


config_sections.register_section(
    "compression", DEFAULTS, docs=DOCS, validate=check_compression, switch="enabled"
)


def with_compression(uploads: Chain, c) -> Chain:
    """Compressed-sensing uploads (``compression`` section) added to a chain. Without DP the server
    reconstructs each upload (exact for non-linear Rec); with a clip in the chain the client
    measures first, the clip bounds the measurements, the noise covers them, and the server
    reconstructs the noised sum (the only thing it sees under central DP). A noise transform that
    needs no clip (CUAG-PFL's paper mode) is placed after the compression the same way: Alg. 4
    noises the measurements."""
    options = dict(
        rates=c.rates,
        r_min=c.r_min,
        r_max=c.r_max,
        operator=c.kind,
        method=c.method,
        seed=c.seed,
        materialize_gb=float(c.materialize_gb),
        error_feedback=bool(c.error_feedback),
        refresh=c.refresh,
        signs=c.signs,
    )
    privatising = [i for i, t in enumerate(uploads) if t.kind in ("clip", "noise")]
    if not privatising:
        return chain(*uploads, CompressedSensing(**options, reconstruct="each"))
    first = privatising[0]
    return chain(
        *uploads[:first], CompressedSensing(**options, reconstruct="aggregate"), *uploads[first:]
    )
