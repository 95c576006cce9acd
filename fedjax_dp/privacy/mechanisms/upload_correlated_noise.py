"""Correlated Gaussian noise on the clipped sum, as an upload transform: the server's
side of DP-FTRL (Kairouz et al. 2021) and of matrix-factorization DP-FL (Choquette-Choo et al. 2023;
McMahan et al. 2024's BLT-DP-FTRL for Gboard). Round t's noise is row t of C^{-1} Z: the round draws
Z_t ~ N(0, (z sens(C) S)^2 I) with its own server-noise key (exactly the draw of
``upload_noise.GaussianNoise``, so the identity strategy is today's DP-FedAvg bit for bit) and the
strategy's stream (``jax_privacy`` ``StreamingMatrix.multiply_next``) turns it into the correlated
noise it adds. The stream's buffers are this transform's server state: checkpointed with the model,
so a resumed run continues the band where it stopped.

Central only (a client cannot correlate noise across rounds it does not see), on a fixed clip (an
adaptive clip's count would be a second, separately composed release). The release it states is one
event for the stream of every round so far (``NoisePlan.event_through``), which the correlated
ledger keeps instead of composing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.core import rng
from fedjax_dp.core.uploads import (
    KeyDrawing,
    Release,
    Scheduled,
    ServerContext,
    Stateful,
    UploadTransform,
)
from fedjax_dp.privacy.correlated.participation import Participation
from fedjax_dp.privacy.correlated.plan import NoisePlan, stream_event, stream_parts
from fedjax_dp.privacy.mechanisms.gaussian import gaussian_noise_like

STRATEGY_NAMES = {
    "identity": "independent (identity strategy)",
    "tree": "binary-tree aggregation (DP-FTRL)",
    "tree_restart": "binary-tree aggregation restarted periodically (DP-FTRL's TreeRestart)",
    "tree_honaker": "binary-tree aggregation with Honaker's estimator (DP-FTRL)",
    "banded": "banded matrix factorization",
    "blt": "buffered-linear-Toeplitz matrix factorization",
    "dense": "dense matrix factorization",
}


@dataclasses.dataclass(frozen=True, eq=False)
class CorrelatedNoise(Stateful, Scheduled, KeyDrawing, UploadTransform):
    kind: ClassVar[str] = "noise"
    local: ClassVar[bool] = False
    plan: NoisePlan = None
    note: str = ""
    details: tuple = ()  # (key, value) pairs for privacy.json's accounting

    def __post_init__(self):
        if not isinstance(self.plan, NoisePlan):
            raise TypeError(f"CorrelatedNoise needs a NoisePlan, got {type(self.plan).__name__}")

    def init(self, upload_template):
        return self.plan.strategy.noising.init_multiply(upload_template)

    def inputs(self, round_index: int) -> dict:
        return {"std_over_clip": self.plan.std_over_clip, "round": round_index}

    def server(self, total, ctx: ServerContext):
        std = ctx.inputs["std_over_clip"] * ctx.bound
        draws = self.plan.strategy.draws  # Honaker's tree: one iid vector per level
        shape = (
            total
            if draws == 1
            else jax.tree_util.tree_map(lambda x: jnp.zeros((draws,) + x.shape, x.dtype), total)
        )
        draw = gaussian_noise_like(
            shape, std, rng.purpose_key(ctx.noise_key, rng.Purpose.SERVER_NOISE)
        )
        noise, state = self.plan.strategy.noising.multiply_next(draw, ctx.state)
        total = jax.tree_util.tree_map(
            lambda x, n: (x.astype(n.dtype) + n).astype(x.dtype), total, noise
        )
        return total, state, {"noise_multiplier": self.plan.noise_multiplier}

    def key_uses(self) -> tuple:
        return (rng.Purpose.SERVER_NOISE,)

    def mechanism(self) -> str:
        strategy = self.plan.strategy
        bands = (
            f", {strategy.bands} bands"
            if strategy.name == "banded"
            else (
                f", a new tree every {strategy.period} rounds"
                if strategy.name == "tree_restart"
                else ""
            )
        )
        return (
            f"correlated Gaussian noise on the clipped sum ({STRATEGY_NAMES[strategy.name]}{bands},"
            f" {strategy.rounds} rounds)"
        )

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        plan, t = self.plan, int(inputs["round"])
        if t > plan.rounds:
            raise ValueError(
                f"round {t}: the {plan.strategy.name!r} noise strategy is built for {plan.rounds}"
                " rounds"
            )
        event = plan.event_through(t)
        z_stream, count = stream_parts(event)
        details = {
            "noise_strategy": plan.strategy.name,
            "participation": plan.participation.describe(),
            "strategy_rounds": plan.rounds,
            "strategy_sensitivity": plan.sensitivity,
            "iid_draw_std_over_clip": plan.std_over_clip,
            "state_buffers": plan.strategy.buffers,
            **plan.error(),
            **dict(self.details),
        }
        note = (
            "the rounds so far are one Gaussian of multiplier z sens(C) / sens(C[:t, :t]) = "
            f"{z_stream:.6g}"
            if not plan.participation.amplified
            else (
                f"amplified BandMF: {count} Poisson-sampled Gaussian rounds (q ="
                f" {plan.participation.rate:g}) of multiplier {plan.noise_multiplier:.6g}"
            )
        )
        return (
            Release(
                self.mechanism(),
                "central",
                plan.noise_multiplier,
                "the clip before it (S)",
                note="; ".join(n for n in (note, self.note) if n),
                bound_value=bound,
                event=event,
                stream=True,
                details=details,
            ),
        )


def stream_release(participation: Participation, noise_multiplier: float, rounds: int) -> Release:
    """The release of a whole correlated stream of ``rounds`` rounds at multiplier z, what a
    calibration solves for (the strategy does not enter: z is relative to its sensitivity)."""
    return Release(
        "correlated Gaussian noise on the clipped sum",
        "central",
        noise_multiplier,
        "the clip before it (S)",
        event=stream_event(participation, noise_multiplier, rounds),
        stream=True,
        details={"participation": participation.describe()},
    )
