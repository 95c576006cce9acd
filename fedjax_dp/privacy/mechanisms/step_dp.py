"""Example-level DP inside local training: a clipped, noised gradient at every local step, plugged
into ``core.local_training.make_local_trainer(gradient_hook=...)``.

* ``per_example=True``: DP-SGD (Abadi et al. 2016, Alg. 1): each example's gradient is clipped to C
  (dense layers by book-keeping, without per-example gradients:
  ``privacy.mechanisms.ghost_clipping``), the clipped gradients of the real examples are summed,
  N(0, (z C)^2 I) is added, and the sum is divided by the FIXED batch size B (the real count would
  leak; padded slots count as absent; with Poisson batches padded beyond B, ``normalizer`` = the
  expected size B). One step is the Gaussian mechanism with sensitivity C on the sum (add/remove one
  example): noise multiplier z.
* ``per_example=False``: the minibatch-gradient reading of the local-DP patent (seed 003,
  ALGORITHMS.md Sec. 3): the batch's mean gradient is clipped to C and N(0, (z C)^2 I) added.
  Replacing one example can move the clipped mean anywhere in the ball of radius C, so the
  sensitivity is 2C (replace-one): the step's effective multiplier is z / 2, and nothing is gained
  from the batch size.

``step_release`` states per step what the accountant must compose (noise multiplier relative to the
sensitivity, the neighbouring relation, the unit); the caller composes it over the client's steps.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from fedjax_dp.core import tree
from fedjax_dp.core.local_training import masked_mean
from dp_accounting import NeighboringRelation

from fedjax_dp.core.release import Release
from fedjax_dp.privacy.mechanisms.clipping import clip_by_global_norm, example_clip_weights
from fedjax_dp.privacy.mechanisms.ghost_clipping import clipped_gradient_sum
from fedjax_dp.privacy.mechanisms.gaussian import add_gaussian_noise


def clipped_sum(grads, mask, clip_norm, median: bool = False):
    """sum_i mask_i g_i / max(1, ||g_i|| / C) over the leading example axis of ``grads``; returns it
    and the C used: ``clip_norm``, or with ``median`` the median of the real examples' norms.

    Written as a contraction of the example axis with the clip weights (a dot_general), not as a
    reduce over the stacked clipped gradients: XLA:CPU fused the per-example gradient into such a
    reduce, which made one step of the FedAvg CNN at B = 16 about 50x slower
    (``benchmarks/step_dp_cost.py``). Padded slots get weight 0; their gradients are those of real
    or zero inputs under the same parameters, so finite whenever the real ones are.
    """
    weights, clip_norm = example_clip_weights(
        jax.vmap(tree.l2_norm)(grads), mask, clip_norm, median
    )
    return (
        jax.tree_util.tree_map(lambda g: jnp.tensordot(weights.astype(g.dtype), g, axes=1), grads),
        clip_norm,
    )


@dataclasses.dataclass(frozen=True)
class ClippedNoisyGradient:
    """A ``GradientHook``: clip (per example or per batch) to ``clip_norm`` C, add N(0, (z C)^2 I).

    ``median_clip``: C is each step's median per-example gradient norm instead (DP-SCAFFOLD as seed
    004 describes it). The threshold then depends on the batch, so the noise no longer bounds what
    one example reveals: NO formal guarantee (``step_release`` says so)."""

    clip_norm: float
    noise_multiplier: float
    per_example: bool = True
    # what the noised sum is divided by (0: the padded batch length, = B for fixed batches)
    normalizer: int = 0
    median_clip: bool = False
    # dense layers without per-example gradients (ghost_clipping.py); same numbers
    dense_bookkeeping: bool = True

    def __post_init__(self):
        if self.median_clip and not self.per_example:
            raise ValueError(
                "a median clip is the median of per-example gradient norms: it needs"
                " per_example=True"
            )
        if not self.clip_norm > 0:
            raise ValueError(f"step clip_norm C must be > 0, got {self.clip_norm!r}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"step noise_multiplier z must be >= 0, got {self.noise_multiplier!r}")

    def __call__(
        self, per_example_loss, params, batch, mask, key, noise_key=None, noise_multiplier=None
    ):
        """``noise_key`` (default: split from the step key) and ``noise_multiplier`` (default: the
        field; a traced per-client value for threshold schedules) come from ``train``'s
        arguments."""
        loss_key, own_noise_key = jax.random.split(key)
        noise_key = own_noise_key if noise_key is None else noise_key
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        if not self.per_example:
            loss, grads = jax.value_and_grad(
                lambda p: masked_mean(per_example_loss(p, batch, loss_key), mask)
            )(params)
            return loss, add_gaussian_noise(
                clip_by_global_norm(grads, self.clip_norm).clipped, z * self.clip_norm, noise_key
            )

        if self.dense_bookkeeping:
            losses, summed, clip_norm = clipped_gradient_sum(
                per_example_loss, params, batch, mask, loss_key, self.clip_norm, self.median_clip
            )
        else:

            def one_example(p, example):
                single = jax.tree_util.tree_map(lambda x: x[None], example)
                return per_example_loss(p, single, loss_key)[0]

            losses, grads = jax.vmap(jax.value_and_grad(one_example), in_axes=(None, 0))(
                params, batch
            )
            summed, clip_norm = clipped_sum(grads, mask, self.clip_norm, self.median_clip)
        noised = add_gaussian_noise(summed, z * clip_norm, noise_key)
        batch_size = self.normalizer or mask.shape[0]
        return masked_mean(losses, mask), jax.tree_util.tree_map(lambda g: g / batch_size, noised)

    def step_release(self, noise_multiplier: float | None = None) -> Release:
        """What one step at ``noise_multiplier`` (default: the field) releases about one example of
        this client: per example, add/remove one example (sensitivity C); the clipped batch mean,
        replace-one (2C)."""
        z = self.noise_multiplier if noise_multiplier is None else float(noise_multiplier)
        if self.median_clip:
            return Release(
                "per-example gradient clipped at the batch's median norm + Gaussian",
                "local",
                z,
                "none: C = the step's median per-example gradient norm (data-dependent)",
                formal=False,
                bound_value=math.inf,
                unit="example",
                relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            )
        if self.per_example:
            return Release(
                "per-example clipped gradient + Gaussian (DP-SGD)",
                "local",
                z,
                f"C = {self.clip_norm} per example (add/remove one example)",
                bound_value=self.clip_norm,
                unit="example",
                relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            )
        return Release(
            "clipped minibatch gradient + Gaussian",
            "local",
            z,
            f"C = {self.clip_norm} on the batch mean; replacing one example moves it up to 2C",
            bound_value=self.clip_norm,
            unit="example",
            relation=NeighboringRelation.REPLACE_ONE,
        )
