"""Does the chain add the noise its release declares, and bound what it declares?

The canary audit (``audit``) bounds epsilon from below: it catches a mechanism with no noise or no
clip, but not one with half its noise (a claim of 2.34 that truly spends 5.17 gave a lower bound of
1.05 at 600 trials). This check measures the mechanism directly, through the real round (the
algorithm's own round, chain and engine), with a probe inserted just before the chain's noise
transform:

* noise: every client's upload is replaced by zeros, so what the server sums after the noise
  transform is the noise alone: one central draw of std z S per entry, or the sum over the kept
  clients of their local draws, std sqrt(sum_k (z_k S)^2), z the multiplier the release declares and
  S the per-client bound the chain holds before the noise. Over N entries sum_j x_j^2 / sigma^2 is
  chi-square with N degrees of freedom; the check fails when its standardised value (chi2 - N) /
  sqrt(2N) lies beyond ``tolerance`` (5: a false alarm below 1e-6; halved noise at N = 7850 sits 47
  standard deviations out).
* a correlated stream adds row t of C^-1 Z in round t: the check runs the stream's rounds 1..t
  from its first state and tests each round's noise against its own std, z sens(C) S ||C^-1[t]||;
* distributed DP: the decoded sum of the surviving clients' discrete shares, std sqrt(survivors)
  sigma per entry (sigma the share's std, unscaled; the rotation keeps it);
* bound: every client's upload is replaced by a huge one (each entry 1e3), and the probe reads the
  norm of what enters the noise transform: it must not exceed the bound S the noise is calibrated
  to.

A release with ``formal=False`` (no finite bound, a paper's own figure) is listed as not checked.
Count releases of adaptive clips are not measured here (their noise enters the clip's next
threshold, not the upload); ``tests/test_key_discipline.py`` and
``tests/test_layer_quantile_clip.py`` check their draws.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import tree
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.core.uploads import Chain, ClientContext, Flow, ServerContext, UploadTransform

HUGE_ENTRY = 1e3


@dataclasses.dataclass(frozen=True)
class _Probe(UploadTransform):
    """Sits before the noise transform: reads each client's upload norm and its bound (client side)
    and the summed upload after the noise (server side, which runs after the noise's in reverse
    chain order)."""

    kind: ClassVar[str] = "diagnostic"

    def client(self, upload, ctx: ClientContext) -> Flow:
        return Flow(upload, ctx.bound, {}, {"norm": tree.l2_norm(upload), "bound": ctx.bound})

    def server(self, total, ctx: ServerContext):
        flat = jnp.concatenate(
            [jnp.ravel(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(total)]
        )
        return (
            total,
            ctx.state,
            {
                "release_check_total": flat,
                "release_check_norm": ctx.stats["norm"],
                "release_check_bound": ctx.stats["bound"],
                "release_check_kept": ctx.kept,
            },
        )


@dataclasses.dataclass(frozen=True)
class _FixedUploads:
    """The algorithm with every client's upload set to ``value`` in every entry (0: zero signal)."""

    base: Any
    value: float

    def __getattr__(self, name):
        return getattr(self.base, name)

    def client_update(self, shared, client, client_state, key):
        out = self.base.client_update(shared, client, client_state, key)
        upload = jax.tree_util.tree_map(lambda u: jnp.full_like(u, self.value), out.upload)
        return out._replace(upload=upload, ok=jnp.bool_(True))


@dataclasses.dataclass(frozen=True)
class ReleaseCheck:
    mechanism: str
    checked: bool  # False: a release with formal=False (nothing declared to check against)
    declared_std: float = math.nan  # of the summed noise per entry
    measured_std: float = math.nan
    entries: int = 0
    chi2_z: float = math.nan  # (sum x^2 / sigma^2 - N) / sqrt(2 N)
    # the largest client's upload norm entering the noise / its bound
    max_norm_over_bound: float = math.nan
    tolerance: float = 5.0

    @property
    def passed(self) -> bool:
        return (not self.checked) or (
            abs(self.chi2_z) <= self.tolerance and self.max_norm_over_bound <= 1 + 1e-5
        )


def check_upload_noise(
    runner: FederatedRound,
    state,
    cohort: dict,
    key: jax.Array,
    client_states=None,
    round_index: int = 1,
    tolerance: float = 5.0,
) -> ReleaseCheck:
    """The noise and bound of the chain's noise release, measured through ``runner``'s own round on
    ``cohort`` (module docstring). ``state``: the server state the round starts from."""
    uploads = runner.specialized(state)
    position = next((i for i, t in enumerate(uploads) if t.kind == "noise"), None)
    if position is None:
        raise ValueError(
            f"the upload chain {[type(t).__name__ for t in uploads]} has no noise transform to"
            " check"
        )
    noise = uploads[position]
    (release,) = noise.releases(noise.inputs(round_index))
    if not release.formal:
        return ReleaseCheck(release.mechanism, checked=False, tolerance=tolerance)
    probed = Chain(uploads[:position] + (_Probe(),) + uploads[position:])
    probed_state = state.replace(
        uploads=state.uploads[:position] + ((),) + state.uploads[position:]
    )
    options = dict(runner._engine_options, strategy="vmap", mesh=None, devices=None)

    def metrics(value, start=probed_state, t=round_index, round_key=key):
        probe = FederatedRound(_FixedUploads(runner.algorithm, value), probed, **options)
        result = probe(
            start,
            cohort,
            round_key,
            t,
            client_states=client_states,
            uploads=probed,
            noise_key=jax.random.fold_in(round_key, 1),
        )
        found = {k: np.asarray(v) for k, v in result.metrics.items() if k.startswith(PREFIXES)}
        return found, result.state

    loud = metrics(HUGE_ENTRY)[0]
    if release.stream:  # every round of the stream from the first: each one's own std
        totals, variances, start = [], [], probed_state
        for t in range(1, round_index + 1):
            quiet, start = metrics(0.0, start, t, jax.random.fold_in(key, t))
            bound = float(quiet["release_check_bound"][quiet["release_check_kept"].astype(bool)][0])
            totals.append(quiet["release_check_total"])
            variances.append(
                np.full(quiet["release_check_total"].size, stream_variance(noise, t, bound))
            )
        total, variance = np.concatenate(totals).astype(np.float64), np.concatenate(variances)
    else:
        quiet = metrics(0.0)[0]
        kept = quiet["release_check_kept"].astype(bool)
        bound = float(quiet["release_check_bound"][kept][0])
        if release.locality == "local":
            ids = np.asarray(cohort.get("client_id", np.zeros(len(kept), np.int32)))[kept]
            variance = float(np.sum(np.square(release.multipliers_for(ids) * bound)))
        elif release.locality == "distributed":  # the surviving shares' sum
            d = release.details
            share = d["ddp_share_std_integer_units"] * d["ddp_gamma"]
            variance = float(quiet["ddp_survivors"]) * share**2
        else:
            variance = float((release.noise_multiplier * bound) ** 2)
        total = quiet["release_check_total"].astype(np.float64)
        variance = np.full(total.size, variance)
    entries = total.size
    chi2 = float(np.sum(np.square(total) / variance))
    loud_kept = loud["release_check_kept"].astype(bool)
    ratio = float(
        np.max(loud["release_check_norm"][loud_kept] / loud["release_check_bound"][loud_kept])
    )
    return ReleaseCheck(
        release.mechanism,
        True,
        float(np.sqrt(np.mean(variance))),
        float(np.sqrt(np.mean(np.square(total)))),
        entries,
        (chi2 - entries) / math.sqrt(2 * entries),
        ratio,
        tolerance,
    )


PREFIXES = ("release_check_", "ddp_survivors")


def stream_variance(noise, t: int, bound: float) -> float:
    """Round t's noise variance per entry under a correlated stream: (z sens(C) S)^2 times the
    squared norm of row t of C^-1 (the round adds row t of C^-1 Z; Choquette-Choo et al. 2023)."""
    plan = noise.plan
    if plan.strategy.draws != 1:
        raise ValueError(
            f"the {plan.strategy.name!r} stream draws {plan.strategy.draws} vectors a round: its"
            " per-round std is not checked here"
        )
    inverse = np.linalg.inv(plan.strategy.matrix(t))
    return float((plan.std_over_clip * bound * np.linalg.norm(inverse[t - 1])) ** 2)
