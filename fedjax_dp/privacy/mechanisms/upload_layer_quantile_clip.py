"""Per-layer adaptive clipping: Andrew et al. 2021's quantile rule run on every layer's own
threshold.

Each layer l has a threshold C_l^t (the transform's state). A client clips every layer of its upload
to C_l^t (joint bound sqrt(sum_l (C_l^t)^2)) and reports, per layer, b_l - 1/2 with b_l = 1 when
that layer was not clipped. The server updates every threshold as ``AdaptiveQuantileClip`` does one:
C_l^{t+1} = C_l^t exp(-eta (b_bar_l - gamma)), b_bar_l = clamp((sum_k (b_kl - 1/2) + noise_l) / D +
1/2, 0, 1).

The L counts are one Gaussian release: a client moves each by at most 1/2 (add/remove; 1 under
replace-one), so its count vector has L2 bound sqrt(L) / 2 and the release's multiplier is
sigma_b / (sqrt(L) / 2). Where the noise is added decides who may see the counts:

* ``local=False``: the server adds N(0, sigma_b^2) to each summed count (central DP, as DP-FedAvg's
  adaptive clip); composed with the update's central noise.
* ``local=True``: each client adds N(0, sigma_b^2) to each of its own counts before sending (local
  DP, for CUAG-PFL's sound mode, whose server is not trusted with raw uploads); each client's ledger
  composes (2 / z)^2 = L / sigma_b^2 per participation beside its update noise. The server's count
  noise is then the sum of the clients' draws (std sigma_b sqrt(cohort)).

ALGORITHMS.md §4 asks for it as the sound mode's alternative to a fixed C_l.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.core import rng
from fedjax_dp.core.uploads import (
    BoundMapping,
    ClientContext,
    Flow,
    KeyDrawing,
    Release,
    ServerContext,
    Stateful,
    UploadTransform,
)
from fedjax_dp.privacy.mechanisms import clipping
from fedjax_dp.privacy.mechanisms.gaussian import standard_normal
from fedjax_dp.privacy.mechanisms.upload_clipping import (
    AdaptiveQuantileClip,
    clip_metrics,
    unclipped_fraction,
)

# |b - 1/2|: one client's contribution to one layer's count
COUNT_BOUND = AdaptiveQuantileClip.COUNT_BOUND


@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: no float can take another's place
class PerLayerQuantileClip(Stateful, BoundMapping, KeyDrawing, UploadTransform):
    kind: ClassVar[str] = "clip"
    initial_layer_norms: tuple = ()  # C_l^1 per leaf, in jax.tree_util leaf order
    target_quantile: float = 0.5  # gamma
    learning_rate: float = 0.2  # eta
    count_noise_std: float = 1.0  # sigma_b, per layer count
    denominator: float = 1.0  # D, the fixed expected cohort size
    local: bool = False

    def __post_init__(self):
        if not self.initial_layer_norms or any(not c > 0 for c in self.initial_layer_norms):
            raise ValueError(
                "per-layer adaptive clipping: initial_layer_norms must all be > 0, got"
                f" {self.initial_layer_norms}"
            )
        for name in ("count_noise_std", "denominator", "learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"per-layer adaptive clipping: {name} must be > 0, got {getattr(self, name)}"
                )
        if not 0 < self.target_quantile < 1:
            raise ValueError(
                "per-layer adaptive clipping: target_quantile must lie in (0, 1), got"
                f" {self.target_quantile}"
            )

    @property
    def layers(self) -> int:
        return len(self.initial_layer_norms)

    @property
    def count_multiplier(self) -> float:
        """sigma_b / (the L counts' L2 bound sqrt(L) / 2)."""
        return self.count_noise_std / (COUNT_BOUND * math.sqrt(self.layers))

    def count_mu_squared(self) -> float:
        """What one participation's local counts cost in GDP mu^2 (replace-one): L / sigma_b^2."""
        return (2.0 / self.count_multiplier) ** 2

    def init(self, upload_template):
        return jnp.asarray(self.initial_layer_norms, jnp.float32)

    def bound_after(self, bound, state, inputs):
        return jnp.sqrt(jnp.sum(jnp.square(state)))

    def client(self, upload, ctx: ClientContext) -> Flow:
        leaves, treedef = jax.tree_util.tree_flatten(upload)
        if len(leaves) != self.layers:
            raise ValueError(
                f"{self.layers} per-layer clip norms for an upload of {len(leaves)} layers"
            )
        thresholds = [ctx.state[i] for i in range(self.layers)]
        result = clipping.clip_per_layer(upload, jax.tree_util.tree_unflatten(treedef, thresholds))
        norms = jnp.stack([jnp.sqrt(jnp.sum(jnp.square(x))) for x in leaves])
        unclipped = (ctx.keep & (norms <= ctx.state)).astype(jnp.float32)
        count = jnp.where(ctx.present, unclipped - COUNT_BOUND, 0.0)
        if self.local:
            # its own key: ctx.noise_key is the upload noise's
            noise = standard_normal(ctx.count_key, (self.layers,))
            count = count + jnp.where(ctx.present, self.count_noise_std * noise, 0.0)
        bound = self.bound_after(None, ctx.state, None)
        return Flow(
            result.clipped,
            bound,
            {"layer_counts": count},
            {"norm": result.norm, "clipped": result.was_clipped & ctx.keep},
        )

    def server(self, total, ctx: ServerContext):
        count = ctx.extras["layer_counts"]
        if not self.local:
            key = rng.purpose_key(ctx.noise_key, rng.Purpose.CLIP_ADAPTATION)
            count = count + self.count_noise_std * standard_normal(key, (self.layers,))
        # b_bar_l per layer, clamped to [0, 1]
        fraction = unclipped_fraction(count, self.denominator)
        next_norms = ctx.state * jnp.exp(-self.learning_rate * (fraction - self.target_quantile))
        metrics = {
            **clip_metrics(ctx, self.bound_after(None, ctx.state, None)),
            "layer_clip_min": jnp.min(ctx.state),
            "layer_clip_max": jnp.max(ctx.state),
        }
        return total, next_norms, metrics

    def key_uses(self) -> tuple:
        return (rng.Purpose.CLIENT_COUNT_NOISE if self.local else rng.Purpose.CLIP_ADAPTATION,)

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        where = (
            "each client noises its own counts"
            if self.local
            else "the server noises the summed counts"
        )
        return (
            Release(
                "per-layer adaptive-clip counts of unclipped layers (Andrew et al. 2021,"
                f" {self.layers} layers)",
                "local" if self.local else "central",
                self.count_multiplier,
                f"1/2 per client and layer (b - 1/2): sqrt({self.layers}) / 2",
                note=where,
                bound_value=COUNT_BOUND * math.sqrt(self.layers),
            ),
        )
