"""Client-level differentially-private FedAvg (Geyer, Klein, Nabi 2017, "Differentially Private
Federated Learning: A Client Level Perspective", Alg. 1; McMahan et al. 2018, DP-FedAvg).

Round t (ALGORITHMS.md Sec. 1): every sampled client k runs ClientUpdate from w_t and returns
Delta w^k with zeta_k = ||Delta w^k||_2; the update is clipped, Delta w^k / max(1, zeta_k / S), and
    w_{t+1} = w_t + (1 / D) (sum_k clipped Delta w^k + N(0, z^2 S^2 I))           (central)
    w_{t+1} = w_t + (1 / D)  sum_k (clipped Delta w^k + N(0, z^2 S^2 I))           (local)
applied through the server optimizer (SGD, lr 1 reproduces the formula). The denominator D is
FIXED: the cohort size m for fixed-size sampling, the expected size q K for Poisson sampling (the
realised count would leak membership).

Clip modes: ``fixed`` S; ``per_layer`` thresholds C_l (sensitivity sqrt(sum C_l^2)); ``adaptive``
(Andrew et al. 2021: S follows the target quantile of the norms through a noised count, whose noise
is paid for by raising the update noise to z_Delta so that the pair is z-private); ``median``
(Geyer et al.'s S = median of the round's zeta_k): NOT PRIVATE, the median is computed from the
clients' updates without noise; runs in that mode are reported as having no formal guarantee.

Per-round metrics (Geyer et al., Fig. 2): V_c, the between-clients variance of the update entries,
and U_s, the update scale, over the round's finite, unclipped updates. They are diagnostics computed
from raw updates, not released privately.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from fedjax_dp.algorithms import base
from fedjax_dp.compression import traffic
from fedjax_dp.core import rng, tree
from fedjax_dp.core.local_training import PerExampleLoss
from fedjax_dp.privacy import clipping
from fedjax_dp.privacy.mechanisms import NoiseMode, add_gaussian_noise, gaussian_noise_like

CLIP_MODES = ("fixed", "per_layer", "adaptive", "median")


@flax.struct.dataclass
class DPServerState:
    params: Any
    opt_state: Any
    round: jax.Array
    clip_norm: jax.Array  # S_t (changes only under adaptive clipping)


@dataclasses.dataclass(frozen=True)
class DPFedAvg(base.EngineOptions):
    """DP-FedAvg. ``round(state, cohort, key, noise_multiplier)`` takes z_t per round (schedules).

    Attributes:
      denominator: the fixed D (m, or q K under Poisson sampling).
      clip_norm: S (initial S for ``adaptive``; total sensitivity split equally over layers for
        ``per_layer`` unless ``layer_clip_norms`` is given).
      target_quantile, clip_learning_rate, count_noise_std: adaptive clipping's gamma, eta_C, sigma_b
        (sigma_b defaults to max(D / 20, 1): Andrew et al. recommend D / 20 for large cohorts, and
        sigma_b must exceed z / 2).
      track_variance: compute V_c and U_s (costs one more model-sized sum).
      client_update: ``(params, client) -> (delta, stats, ok)`` replacing ClientUpdate; DP-UGA passes
        ``uga.as_client_delta(make_uga_gradient(...))`` (delta = -g^k, clipped and noised like any
        update) with ``needs_evaluation_pass=True``.
    """

    per_example_loss: PerExampleLoss
    client_optimizer: optax.GradientTransformation
    denominator: float
    clip: str = "fixed"
    clip_norm: float = 1.0
    layer_clip_norms: Any = None
    noise_mode: str = "central"
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_noise_std: float | None = None
    track_variance: bool = True
    client_update: Any = None
    needs_evaluation_pass: bool = False

    def __post_init__(self):
        if self.clip not in CLIP_MODES:
            raise ValueError(f"clip mode {self.clip!r} unknown; choose one of {CLIP_MODES}")
        if not self.clip_norm > 0:
            raise ValueError(f"clip norm S must be > 0, got {self.clip_norm}")
        if not self.denominator > 0:
            raise ValueError(f"denominator must be > 0, got {self.denominator}")
        NoiseMode(self.noise_mode)
        if self.clip == "median" and self.noise_mode == "local":
            raise ValueError("median clipping needs the server to see raw norms; it cannot run with local noise")
        client_delta = self.client_update or base.make_client_delta(self.per_example_loss, self.client_optimizer,
                                                                    self.unroll)
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        set_("_client_delta", client_delta)
        set_("_engine", self.cohort_engine(self._client_fn))
        set_("_server_step", jax.jit(self._server_step_impl))

    @property
    def private(self) -> bool:
        """False for ``median`` clipping, whose threshold is computed from private data."""
        return self.clip != "median"

    @property
    def sigma_b(self) -> float:
        return self.count_noise_std if self.count_noise_std is not None else max(self.denominator / 20, 1.0)

    def update_noise_multiplier(self, z: float) -> float:
        """The multiplier applied to the update sum: z, or z_Delta under adaptive clipping."""
        if self.clip == "adaptive" and z > 0:
            return clipping.adaptive_update_noise_multiplier(z, self.sigma_b)
        return z

    def sensitivity(self, clip_norm):
        """L2 bound of one client's clipped update (S, or sqrt(sum C_l^2) per layer)."""
        if self.clip == "per_layer":
            return clipping.per_layer_sensitivity(self.layer_clip_norms)
        return clip_norm

    def upload_bytes(self, params) -> int:
        """Bytes one client sends per round: its clipped (and, locally, noised) float32 update."""
        return traffic.dense_upload_bytes(params)

    def init(self, params) -> DPServerState:
        if self.clip == "per_layer" and self.layer_clip_norms is None:
            object.__setattr__(self, "layer_clip_norms", clipping.equal_per_layer_norms(params, self.clip_norm))
        return DPServerState(params, self.server_optimizer.init(params), jnp.zeros((), jnp.int32),
                             jnp.asarray(self.clip_norm, jnp.float32))

    # ----------------------------------------------------------------- client side
    def _client_fn(self, shared, client):
        params, clip_norm, update_std = shared
        delta, stats, ok = self._client_delta(params, client)
        present = client["num_examples"] > 0  # padding slots (Poisson cohorts) contribute nothing
        keep = ok & present
        zero = jax.tree_util.tree_map(jnp.zeros_like, delta)
        delta = tree.where(keep, delta, zero)
        per_client = {"loss": stats.loss, "finite": ok | ~present, "present": present, "norm": tree.l2_norm(delta)}
        if self.clip == "median":  # the server clips after seeing every norm: return raw updates
            return (), {**per_client, "delta": delta}
        if self.clip == "per_layer":
            result = clipping.clip_per_layer(delta, self.layer_clip_norms)
        else:
            result = clipping.clip_by_global_norm(delta, clip_norm)
        sent = result.clipped
        if self.noise_mode == NoiseMode.LOCAL:
            sent = tree.where(present, add_gaussian_noise(sent, update_std, client["noise_key"]), zero)
        summed = {"update": sent, "kept": keep.astype(jnp.float32),
                  "unclipped": (keep & ~result.was_clipped).astype(jnp.float32)}
        if self.track_variance:
            summed["raw"] = delta
            summed["raw_sq"] = jax.tree_util.tree_map(jnp.square, delta)
        return summed, {**per_client, "clipped": result.was_clipped & keep}

    # ----------------------------------------------------------------- server side
    def round(self, state: DPServerState, cohort, key: jax.Array, noise_multiplier: float):
        """One round with noise multiplier z_t; returns ``(new_state, metrics)``."""
        if not noise_multiplier >= 0:
            raise ValueError(f"noise multiplier must be >= 0, got {noise_multiplier}")
        z_update = self.update_noise_multiplier(noise_multiplier)
        update_std = z_update * self.sensitivity(state.clip_norm) if self.clip != "median" else 0.0
        sums, per_client = self._engine((state.params, state.clip_norm, jnp.asarray(update_std, jnp.float32)),
                                        base.client_inputs(cohort, key))
        return self._server_step(state, sums, per_client, key, jnp.float32(noise_multiplier),
                                 jnp.float32(z_update))

    def _server_step_impl(self, state, sums, per_client, key, z, z_update):
        clip_norm = state.clip_norm
        if self.clip == "median":
            sums, clip_norm, clipped = _median_clip(per_client, self.track_variance)
            per_client = {**per_client, "clipped": clipped}
        update = sums["update"]
        if self.noise_mode == NoiseMode.CENTRAL:
            std = z_update * self.sensitivity(clip_norm)
            update = add_gaussian_noise(update, std, rng.purpose_key(key, rng.Purpose.SERVER_NOISE))
        mean_update = jax.tree_util.tree_map(lambda u: u / self.denominator, update)
        new_state = base.apply_server_update(state, mean_update, self.server_optimizer)
        next_clip = clip_norm
        if self.clip == "adaptive":
            count_noise = self.sigma_b * jax.random.normal(rng.purpose_key(key, rng.Purpose.CLIP_ADAPTATION))
            next_clip = clipping.adaptive_clip_update(clip_norm, sums["unclipped"], jnp.where(z > 0, count_noise, 0.0),
                                                      self.denominator, self.target_quantile, self.clip_learning_rate)
        new_state = DPServerState(new_state.params, new_state.opt_state, new_state.round, next_clip)
        present = per_client["present"]
        metrics = {
            "train_loss": jnp.sum(jnp.where(present & per_client["finite"], per_client["loss"], 0.0))
            / jnp.maximum(jnp.sum(present), 1),
            "dropped_clients": jnp.sum(present & ~per_client["finite"]),
            "client_dropped": present & ~per_client["finite"],  # per cohort slot (the loop logs client ids)
            "clipped_fraction": jnp.sum(per_client["clipped"]) / jnp.maximum(jnp.sum(present), 1),
            "clip_norm": clip_norm,
            "median_update_norm": _masked_median(per_client["norm"], present & per_client["finite"]),
            "noise_multiplier": z,
        }
        if self.track_variance:
            metrics.update(_variance_metrics(sums))
        return new_state, metrics


def _masked_median(values, mask):
    return jnp.nanmedian(jnp.where(mask, values, jnp.nan))


def _median_clip(per_client, track_variance: bool):
    """Geyer et al.'s S = median of the round's norms, then flat clipping (NOT private)."""
    keep = per_client["present"] & per_client["finite"]
    clip_norm = _masked_median(per_client["norm"], keep)
    scale = jnp.where(keep, 1.0 / jnp.maximum(1.0, per_client["norm"] / clip_norm), 0.0)
    deltas = per_client["delta"]
    sums = {"update": jax.tree_util.tree_map(lambda d: jnp.tensordot(scale, d, axes=1), deltas),
            "kept": jnp.sum(keep).astype(jnp.float32)}
    if track_variance:
        sums["raw"] = jax.tree_util.tree_map(lambda d: jnp.sum(d, axis=0), deltas)
        sums["raw_sq"] = jax.tree_util.tree_map(lambda d: jnp.sum(jnp.square(d), axis=0), deltas)
    return sums, clip_norm, keep & (per_client["norm"] > clip_norm)


def _variance_metrics(sums):
    """V_c = mean_ij mean_k (D_kij - mu_ij)^2 and U_s = mean_ij mu_ij^2 (Geyer et al., Fig. 2)."""
    k = jnp.maximum(sums["kept"], 1.0)
    mean = jax.tree_util.tree_map(lambda s: s / k, sums["raw"])
    var = jax.tree_util.tree_map(lambda sq, m: jnp.maximum(sq / k - jnp.square(m), 0.0), sums["raw_sq"], mean)
    size = tree.num_params(mean)
    total = lambda t: sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(t))  # noqa: E731
    return {"between_client_variance": total(var) / size, "update_scale": total(jax.tree_util.tree_map(jnp.square, mean)) / size}
