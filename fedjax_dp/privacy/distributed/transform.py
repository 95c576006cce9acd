"""Distributed DP under a simulated secure aggregation, as an upload transform (Kairouz, Liu and
Steinke 2021, "The distributed discrete Gaussian mechanism for federated learning with secure
aggregation", Alg. 1-2; Agarwal, Kairouz and Liu 2021, "The Skellam mechanism for differentially
private federated learning").

Client side (inside the cohort map, after the clip to c): flatten the update, pad it to D and
rotate it (``rotation``: random signs from the round's public rotation key, then the fast
Walsh-Hadamard transform), scale by 1 / gamma, round to integers conditionally on the norm bound
the accounting assumes (``rounding``), add the client's share of discrete noise (discrete Gaussian
or Skellam, ``discrete_noise``) and reduce modulo 2^bits (``modular``). A sampled client drops out
with probability ``dropout`` after sampling: it sends nothing, so its noise share is missing.

Server side: the cohort engine sums the int32 vectors (a wrapping sum, exact modulo 2^bits: what
secure aggregation reveals); the transform maps the modular sum to the signed range, multiplies by
gamma, rotates back, drops the padding and restores the update's structure. A round with fewer
survivors than the plan's threshold is aborted (zero update). Each round reports its survivors,
whether it aborted, the coordinates whose true sum left the signed range (wrapped: a simulation's
diagnostic, which secure aggregation would not reveal) and the rounding draws.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.core import rng
from fedjax_dp.core.release import Release
from fedjax_dp.core.uploads import (
    ClientContext,
    Flow,
    KeyDrawing,
    Resizing,
    Scheduled,
    ServerContext,
    UploadTransform,
)
from fedjax_dp.privacy.distributed import modular, rotation
from fedjax_dp.privacy.distributed.discrete_noise import SAMPLERS, skellam
from fedjax_dp.privacy.distributed.plan import DistributedPlan
from fedjax_dp.privacy.distributed.rounding import conditional_round

ROTATION_SEED = 0x5EC_A66  # the public seed of every round's rotation signs (the server knows them)


def flatten(upload) -> jax.Array:
    return jnp.concatenate(
        [jnp.ravel(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(upload)]
    )


def unflatten(vector: jax.Array, template) -> Any:
    """``vector``'s leading entries in the structure, shapes and dtypes of ``template``."""
    leaves, treedef = jax.tree_util.tree_flatten(template)
    out, start = [], 0
    for leaf in leaves:
        size = math.prod(leaf.shape)
        out.append(vector[start : start + size].reshape(leaf.shape).astype(leaf.dtype))
        start += size
    return jax.tree_util.tree_unflatten(treedef, out)


@dataclasses.dataclass(frozen=True, eq=False)
class DistributedNoise(Scheduled, KeyDrawing, Resizing, UploadTransform):
    """``plan``: the round's parameters (``plan.DistributedPlan``); ``template``: the upload's
    structure (shapes and dtypes); ``dropout``: the chance a sampled client drops out;
    ``summed_shares`` (Skellam only): the surviving shares' sum drawn once at the aggregator, not
    each share by its client (``ddp.shares=summed``: the sum of independent Skellam shares of
    variance v is Skellam of variance n v, and reduction modulo 2^bits commutes with the sum, so
    the modular sum, the only thing secure aggregation reveals, has the same law; the per-client
    words it would hide are not simulated)."""

    kind: ClassVar[str] = "noise"
    plan: DistributedPlan = None
    template: Any = None
    dropout: float = 0.0
    summed_shares: bool = False
    note: str = ""
    details: tuple = ()

    def __post_init__(self):
        if not isinstance(self.plan, DistributedPlan):
            raise TypeError(f"DistributedNoise needs a DistributedPlan, got {self.plan!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"ddp.dropout must lie in [0, 1), got {self.dropout}")
        if self.summed_shares and self.plan.mechanism != "skellam":
            raise ValueError(
                f"ddp.shares='summed' with ddp.mechanism={self.plan.mechanism!r}: only Skellam"
                " shares sum to a draw of their own family; draw the shares per client"
            )
        size = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(self.template))
        if size != self.plan.dim:
            raise ValueError(f"the plan is for {self.plan.dim} coordinates, the upload has {size}")

    def inputs(self, round_index: int) -> dict:
        return {"round": round_index}

    def _signs(self, inputs) -> jax.Array:
        key = jax.random.fold_in(jax.random.key(ROTATION_SEED), inputs["round"].astype(jnp.int32))
        return rotation.random_signs(key, self.plan.padded_dim)

    def client(self, upload, ctx: ClientContext) -> Flow:
        plan = self.plan
        x = flatten(upload)
        if plan.rotation == "hadamard":
            x = rotation.rotate(x, self._signs(ctx.inputs))
        round_key, noise_key, drop_key = (
            jax.random.fold_in(ctx.noise_key, purpose) for purpose in range(3)
        )
        rounded, draws = conditional_round(round_key, x / plan.gamma, plan.l2_sensitivity)
        if self.summed_shares:
            noised = rounded  # the shares' sum is drawn by the server
        else:
            noised = rounded + SAMPLERS[plan.mechanism](noise_key, plan.share_parameter(), x.shape)
        survives = ctx.keep & ~jax.random.bernoulli(drop_key, self.dropout)
        sent = jnp.where(survives, modular.reduce(noised, plan.bits), 0)
        extras = {
            "survivors": survives.astype(jnp.float32),
            "true_sum": jnp.where(survives, noised.astype(jnp.float32), 0.0),
        }
        stats = {"rounding_draws": draws, "rounding_failed": ctx.keep & (draws == 0)}
        return Flow(sent, ctx.bound, extras, stats)

    def server(self, total, ctx: ServerContext):
        plan = self.plan
        survivors = ctx.extras["survivors"]
        true_sum = ctx.extras["true_sum"]
        if self.summed_shares:
            shares = self._summed_shares(ctx.noise_key, survivors, total.shape)
            total, true_sum = total + shares, true_sum + shares.astype(jnp.float32)
        signed = modular.to_signed(total, plan.bits).astype(jnp.float32) * plan.gamma
        if plan.rotation == "hadamard":
            x = rotation.unrotate(signed, self._signs(ctx.inputs), plan.dim)
        else:
            x = signed[: plan.dim]
        aborted = survivors < plan.min_survivors
        update = unflatten(jnp.where(aborted, 0.0, x), self.template)
        metrics = {
            "ddp_survivors": survivors,
            "ddp_aborted": aborted.astype(jnp.float32),
            "ddp_wrapped": jnp.sum(modular.wrapped(true_sum, plan.bits)),
            "ddp_rounding_failed": jnp.sum(ctx.stats["rounding_failed"]),
            "noise_multiplier": plan.noise_multiplier,
        }
        return update, ctx.state, metrics

    def _summed_shares(self, noise_key, survivors, shape) -> jax.Array:
        """Skellam of variance survivors x v, v one share's: the survivors' shares summed (canary
        clients count among the survivors; the chunking allows twice the round's capacity)."""
        share = self.plan.share_parameter()
        key = rng.purpose_key(noise_key, rng.Purpose.SERVER_NOISE)
        most = 2.0 * self.plan.max_clients * share
        return skellam(key, survivors * share, shape, max_variance=most)

    def key_uses(self) -> tuple:
        if self.summed_shares:
            return (rng.Purpose.CLIENT_NOISE, rng.Purpose.SERVER_NOISE)
        return (rng.Purpose.CLIENT_NOISE,)

    def upload_bytes(self, template_bytes: int) -> int:
        """What a client sends: D words of ``bits`` bits."""
        return math.ceil(self.plan.padded_dim * self.plan.bits / 8)

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        plan = self.plan
        name = {"ddgauss": "distributed discrete Gaussian", "skellam": "distributed Skellam"}
        note = (
            f"noise of the >= {plan.min_survivors} surviving shares (a round with fewer aborts and"
            " is still accounted); secure aggregation simulated, not cryptographic"
        )
        return (
            Release(
                f"{name[plan.mechanism]} noise on the quantised sum (simulated secure aggregation)",
                "distributed",
                plan.noise_multiplier,
                "the clip before it (c), after rotation, scaling and conditional rounding",
                note="; ".join(n for n in (note, self.note) if n),
                bound_value=bound,
                event=plan.event(),
                details={
                    **plan.describe(),
                    "ddp_dropout": self.dropout,
                    "ddp_shares": "summed" if self.summed_shares else "per_client",
                    **dict(self.details),
                },
            ),
        )
