"""Gaussian noise as an upload transform, central or local (seed 001), calibrated to the bound of
the clip before it: std = z_t * bound.

Central: the server adds one draw of N(0, (z_t S)^2 I) to the sum of the clipped uploads. Local:
every present client adds its own draw before sending. ``schedule`` gives z_t per round (piecewise
constant, Geyer et al.'s dynamic adaptation). With an adaptive clip whose noised count is released
in the same round (``count_noise_std`` = sigma_b), the update noise is raised to
z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al. 2021, Thm. 1) so that the pair is z-private;
the tracker composes both releases, so the accounting follows from the noise that ran either way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.core import rng, tree
from fedjax_dp.core.schedules import parse_schedule, schedule_value  # noqa: F401  (re-exported)
from fedjax_dp.core.uploads import (
    ClientContext,
    Flow,
    KeyDrawing,
    Release,
    RunVarying,
    Scheduled,
    ServerContext,
    UploadTransform,
)
from fedjax_dp.privacy.mechanisms import clipping
from fedjax_dp.privacy.mechanisms.gaussian import add_gaussian_noise


@dataclasses.dataclass(frozen=True)
class GaussianNoise(Scheduled, KeyDrawing, RunVarying, UploadTransform):
    kind: ClassVar[str] = "noise"
    # z reaches the program through ``inputs``; the rest is the release's text (``RunVarying``)
    run_varying: ClassVar[tuple] = ("schedule", "note", "details", "claims")
    schedule: tuple = ((1, 1.0),)  # ((first round, z), ...)
    local: bool = False
    # sigma_b of an adaptive clip's count released with the update (0: none)
    count_noise_std: float = 0.0
    # local only: z_n per population client (heterogeneous DP)
    client_multipliers: tuple | None = None
    # local only: the per-client epsilon budgets the noise is calibrated to
    client_budgets: tuple | None = None
    # what the method's paper claims (``core.release.Claim``), reported beside the epsilon
    claims: tuple = ()
    note: str = ""  # said of the release in privacy.json (how the noise was calibrated)
    details: tuple = ()  # (key, value) pairs for privacy.json's accounting (``Release.details``)

    def __post_init__(self):
        if (self.client_budgets is not None) and not self.local:
            raise ValueError(
                "per-client budgets are held by per-client ledgers: they need local noise"
            )
        if self.client_multipliers is not None:
            if not self.local or self.count_noise_std:
                raise ValueError("per-client noise multipliers need local noise and a fixed clip")
            if not self.client_multipliers or any(not z > 0 for z in self.client_multipliers):
                raise ValueError(
                    f"per-client noise multipliers must all be > 0, got {self.client_multipliers}"
                )
        if not self.schedule or self.schedule[0][0] != 1:
            raise ValueError(f"noise schedule must start at round 1, got {self.schedule}")
        if any(b[0] <= a[0] for a, b in zip(self.schedule, self.schedule[1:])):
            raise ValueError(f"noise schedule rounds must increase, got {self.schedule}")
        if any(not z >= 0 for _, z in self.schedule):
            raise ValueError(f"noise multipliers must be >= 0, got {self.schedule}")

    def update_multiplier(self, z: float) -> float:
        if self.count_noise_std and z > 0:
            return clipping.adaptive_update_noise_multiplier(z, self.count_noise_std)
        return z

    def inputs(self, round_index: int) -> dict:
        z = schedule_value(self.schedule, round_index)
        return {"z": z, "z_update": self.update_multiplier(z)}

    def client(self, upload, ctx: ClientContext) -> Flow:
        if not self.local:
            return Flow(upload, ctx.bound)
        z = ctx.inputs["z_update"]
        if self.client_multipliers is not None:
            z = jnp.asarray(self.client_multipliers, jnp.float32)[ctx.client_id]
        noised = add_gaussian_noise(upload, z * ctx.bound, ctx.noise_key)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, upload)
        return Flow(tree.where(ctx.present, noised, zeros), ctx.bound)

    def server(self, total, ctx: ServerContext):
        if not self.local:
            std = ctx.inputs["z_update"] * ctx.bound
            total = add_gaussian_noise(
                total, std, rng.purpose_key(ctx.noise_key, rng.Purpose.SERVER_NOISE)
            )
        return total, ctx.state, {"noise_multiplier": ctx.inputs["z"]}

    def key_uses(self) -> tuple:
        return (rng.Purpose.CLIENT_NOISE if self.local else rng.Purpose.SERVER_NOISE,)

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        where = "local" if self.local else "central"
        stated = dict(
            client_budgets=self.client_budgets,
            claims=tuple(self.claims),
            details=dict(self.details) or None,
        )
        if self.client_multipliers is not None:
            return (
                Release(
                    "Gaussian noise on the clipped update (local, z_n per client)",
                    where,
                    min(self.client_multipliers),
                    "the clip before it (S, or sqrt(sum C_l^2))",
                    client_multipliers=tuple(self.client_multipliers),
                    bound_value=bound,
                    note=self.note,
                    **stated,
                ),
            )
        note = ""
        if self.count_noise_std:
            note = (
                f"z = {inputs['z']:.6g} for the round; the update noise is raised to z_Delta ="
                f" {inputs['z_update']:.6g} for the adaptive clip's count released beside it"
                f" (sigma_b = {self.count_noise_std:.6g}, count sensitivity 1/2 per client: z_count"
                f" = {2 * self.count_noise_std:.6g})"
            )
        note = "; ".join(n for n in (note, self.note) if n)
        return (
            Release(
                f"Gaussian noise on the clipped update ({where})",
                where,
                float(inputs["z_update"]),
                "the clip before it (S, or sqrt(sum C_l^2))",
                note=note,
                bound_value=bound,
                **stated,
            ),
        )
