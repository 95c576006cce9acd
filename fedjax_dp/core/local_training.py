"""One client's local training as a pure, jittable, vmappable function.

``make_local_trainer`` builds ``train(params, batches, mask, key) -> (params, LocalStats)``:
minibatch steps of any optax optimizer under ``lax.scan``. Clients with different amounts of data
share one compiled program through padding: ``batches`` has a leading steps axis and a batch axis,
``mask`` (steps, batch) marks the real examples. A padded example contributes nothing to the masked
mean loss, and a step whose batch is all padding leaves parameters *and* optimizer state untouched,
so a padded client gets exactly the result of an unpadded loop over its real batches (McMahan et al.
2017,
ClientUpdate: E epochs of minibatch SGD).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

PerExampleLoss = Callable[..., jax.Array]
"""``per_example_loss(params, batch, key) -> (batch_size,)`` losses."""

Regularizer = Callable[[object, object], jax.Array]
"""``regularizer(params, initial_params) -> scalar`` added to every step's loss (FedProx,
FedDyn)."""

GradientHook = Callable[..., tuple]
"""``hook(per_example_loss, params, batch, mask, key, **noise) -> (loss, grads)``: the step's
data-term loss and the gradient the optimizer receives, in place of ``value_and_grad`` of the masked
mean loss. It runs inside the scan (jittable, vmappable): per-example or per-batch clipping and
noise for example-level DP (``privacy.mechanisms.step_dp``). ``noise`` holds ``noise_key`` (this
step's, from the client's noise stream) and ``noise_multiplier`` (a traced per-client value) when
``train`` is given them. A regularizer's gradient is added after it: it touches no data."""


class LocalStats(NamedTuple):
    """What local training reports besides the trained parameters."""

    # mean training loss over the real examples of all steps (with the regulariser, if any)
    loss: jax.Array
    num_examples: jax.Array  # real examples processed (counted once per step they appear in)
    num_steps: jax.Array  # steps with at least one real example
    data_loss: jax.Array  # the same mean of the data term alone (``loss`` without the regulariser)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``values`` over the entries where ``mask`` is true (0 when none is)."""
    if values.shape != mask.shape:
        raise ValueError(
            f"per_example_loss must return one scalar loss per example, shape {mask.shape}; "
            f"got shape {values.shape}"
        )
    total = jnp.sum(jnp.where(mask, values, 0.0))
    return total / jnp.maximum(jnp.sum(mask), 1)


def make_local_trainer(
    per_example_loss: PerExampleLoss,
    optimizer: optax.GradientTransformation,
    *,
    unroll: int | bool = 1,
    regularizer: Regularizer | None = None,
    remat: bool | int | str = False,
    first_order: bool = False,
    gradient_hook: GradientHook | None = None,
):
    """Returns ``train(params, batches, mask, key, lr_scale=1.0, noise_key=None,
    noise_multiplier=None) -> (params, LocalStats)``; the last two reach ``gradient_hook`` (per-step
    noise keys split from ``noise_key``).

    ``train`` is differentiable in ``params``: ``jax.grad`` through it differentiates through the
    whole trajectory (UGA's keep-trace SGD, ALGORITHMS.md §2). ``lr_scale`` multiplies every update,
    which for SGD, momentum SGD and Adam is exactly a learning-rate factor (per-round decay without
    recompiling); a vector of one factor per step (shape ``(S,)``) scales each step's update by its
    own (a local learning-rate schedule, differentiable: ``hypergrad``).

    Args:
      per_example_loss: ``(params, batch, key) -> (B,)`` losses of one batch.
      optimizer: the client optimizer (any optax transformation).
      unroll: ``lax.scan`` unroll factor; ``True`` unrolls every step (fastest for convolutions on
        XLA:CPU, where a conv inside a loop body runs several times slower).
      regularizer: optional term ``R(params, initial_params)`` added to each step's loss.
      remat: rematerialisation for differentiating *through* local training (UGA). ``True`` or 1:
        ``jax.checkpoint`` on every step, so the backward pass stores one carried state (parameters
        + optimizer state) per step instead of each step's residuals; k > 1: checkpoint segments of
        k steps (stores S/k carried states, recomputes one segment at a time: about S/k + k states);
        ``"sqrt"``: k = ceil(sqrt(S)), memory O(sqrt(S)) states (Griewank's checkpointing
        trade-off).
      first_order: stop gradients through each step's gradient, so differentiating the trajectory
        drops the Hessian terms (first-order UGA; for SGD d w_final / d w_initial becomes I).
      gradient_hook: computes each step's (loss, gradient) of the data term (``GradientHook``);
        ``None`` is ``mean_loss_and_grad`` on the step key as it is (the numbers of a run without DP
        are unchanged by the hook's existence).
    """

    def step_loss_and_grad(params, initial_params, batch, mask, key, noise):
        """``((loss, data_loss), grads)``: the step's objective, its data term, the objective's
        gradient."""
        if gradient_hook is None:

            def step_loss(params):
                data_loss = masked_mean(per_example_loss(params, batch, key), mask)
                if regularizer is None:
                    return data_loss, data_loss
                return data_loss + regularizer(params, initial_params), data_loss

            return jax.value_and_grad(step_loss, has_aux=True)(params)
        data_loss, grads = gradient_hook(per_example_loss, params, batch, mask, key, **noise)
        loss = data_loss
        if regularizer is not None:
            penalty, penalty_grads = jax.value_and_grad(regularizer)(params, initial_params)
            loss, grads = data_loss + penalty, jax.tree_util.tree_map(jnp.add, grads, penalty_grads)
        return (loss, data_loss), grads

    def step(carry, inputs, initial_params, lr_scale, noise_multiplier):
        batch, mask, key, noise_key = inputs
        noise = {} if noise_key is None else {"noise_key": noise_key}
        if noise_multiplier is not None:
            noise["noise_multiplier"] = noise_multiplier

        def take_step(state):
            params, opt_state = state
            losses, grads = step_loss_and_grad(params, initial_params, batch, mask, key, noise)
            if first_order:
                grads = jax.lax.stop_gradient(grads)
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
            updates = jax.tree_util.tree_map(lambda u: u * lr_scale, updates)
            return (optax.apply_updates(params, updates), new_opt_state), losses

        real = jnp.any(mask)
        carry, losses = skips_padded_steps(take_step, carry, real)
        return carry, (losses, jnp.sum(mask), real)

    segment_of = remat_segment_length(remat)

    def train(params, batches, mask, key, lr_scale=1.0, noise_key=None, noise_multiplier=None):
        num_steps = mask.shape[0]
        step_scales = None
        if jnp.ndim(lr_scale) == 1:  # one factor per step, scanned beside the batches
            if jnp.shape(lr_scale)[0] != num_steps:
                raise ValueError(
                    f"lr_scale has {jnp.shape(lr_scale)[0]} per-step factors for {num_steps} steps"
                )
            step_scales = lr_scale

        def body(carry, inputs):
            scale = lr_scale if step_scales is None else inputs[4]
            return step(carry, inputs[:4], params, scale, noise_multiplier)

        keys = jax.random.split(key, num_steps)
        noise_keys = None if noise_key is None else jax.random.split(noise_key, num_steps)
        init = (params, optimizer.init(params))
        segment = segment_of(num_steps)
        if segment == 1:
            body = jax.checkpoint(body)
        xs = (batches, mask, keys, noise_keys, step_scales)
        if segment > 1:
            (final_params, _), (losses, counts, real) = _segmented_scan(
                body, init, xs, segment, unroll
            )
        else:
            (final_params, _), (losses, counts, real) = jax.lax.scan(body, init, xs, unroll=unroll)
        return final_params, local_stats(losses, counts, real)

    return train


def local_stats(losses, counts, real) -> LocalStats:
    """``LocalStats`` from a scan's per-step ``losses`` (``(objective, data term)`` or one array for
    both), real-example ``counts`` and ``real`` flags: example-weighted means over the steps."""
    num_examples = jnp.sum(counts)
    loss, data_loss = losses if isinstance(losses, tuple) else (losses, losses)
    mean = lambda values: jnp.sum(values * counts) / jnp.maximum(num_examples, 1)  # noqa: E731
    return LocalStats(mean(loss), num_examples, jnp.sum(real), mean(data_loss))


def skips_padded_steps(take_step, carry, real):
    """``take_step(carry) -> (carry, loss)`` where ``real``, else ``(carry, zeros)``: an all-padding
    step changes nothing. ``lax.cond`` skips its computation where clients run one at a time
    (sequential, loop
    strategies: with natural partitions most steps of a padded cohort are padding); under vmap it
    becomes a select and both branches run. A step holding an XLA convolution on XLA:CPU is computed
    and its result discarded instead (``_slow_in_control_flow``)."""
    step_jaxpr, (_, loss_shape) = jax.make_jaxpr(take_step, return_shape=True)(carry)
    if _slow_in_control_flow(step_jaxpr.jaxpr):  # compute the step, keep the old state if padding
        new_carry, loss = take_step(carry)
        keep = lambda new, old: jnp.where(real, new, old)  # noqa: E731
        zero_loss = lambda value: jnp.where(real, value, 0.0)  # noqa: E731
        return jax.tree_util.tree_map(keep, new_carry, carry), jax.tree_util.tree_map(
            zero_loss, loss
        )

    def skip_step(state):  # an all-padding step: nothing changes, nothing is computed
        return state, jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), loss_shape)

    return jax.lax.cond(real, take_step, skip_step, carry)


def _slow_in_control_flow(jaxpr) -> bool:
    """Whether a step holds an XLA convolution and runs on XLA:CPU, which executes a convolution
    inside a conditional (or loop) body several times slower than at the top level: a 6-step
    FedAvg-CNN client with XLA convolutions took 597 ms with the padded-step ``lax.cond`` vs 95 ms
    with im2col (``benchmarks/cohort_throughput.py`` case ``cnn:10:loop:-:full:xla``).
    Such steps are masked with a select instead (padding steps computed and discarded): the same
    numbers, no conditional."""
    return jax.default_backend() == "cpu" and "conv_general_dilated" in _primitive_names(jaxpr)


def _primitive_names(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                inner = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(inner, "eqns"):
                    names |= _primitive_names(inner)
    return names


def remat_segment_length(remat):
    """``remat`` option -> ``num_steps -> k`` (0: no rematerialisation, 1: every step, k:
    segments)."""
    if remat is False or remat is None or remat == 0:
        return lambda num_steps: 0
    if remat is True:
        return lambda num_steps: 1
    if remat == "sqrt":
        return lambda num_steps: max(1, math.ceil(math.sqrt(num_steps)))
    if isinstance(remat, int) and remat >= 1:
        return lambda num_steps: remat
    raise ValueError(f"remat must be False, True, a segment length >= 1 or 'sqrt', got {remat!r}")


def _segmented_scan(body, init, xs, segment: int, unroll):
    """``lax.scan(body, init, xs)`` as an outer scan over checkpointed segments of ``segment``
    steps.

    The steps axis is padded to a multiple of ``segment`` with all-padding steps (mask False), which
    leave the carry untouched, so the result is identical; padded outputs are cut off.
    """
    num_steps = xs[1].shape[0]
    total = math.ceil(num_steps / segment) * segment

    def pad(x):
        shape = (total - num_steps,) + x.shape[1:]
        is_key = jnp.issubdtype(x.dtype, jax.dtypes.prng_key)  # keys cannot be zeros; repeat one
        extra = jnp.broadcast_to(x[:1], shape) if is_key else jnp.zeros(shape, x.dtype)
        return jnp.concatenate([x, extra]).reshape((total // segment, segment) + x.shape[1:])

    padded = jax.tree_util.tree_map(pad, xs)

    @jax.checkpoint
    def run_segment(carry, segment_xs):
        return jax.lax.scan(body, carry, segment_xs, unroll=unroll)

    carry, outputs = jax.lax.scan(run_segment, init, padded)
    return carry, jax.tree_util.tree_map(
        lambda y: y.reshape((total,) + y.shape[2:])[:num_steps], outputs
    )


DATA_GRADIENT_REDUCTIONS = ("mean", "sum_of_batch_means")


def make_data_value_and_grad(per_example_loss: PerExampleLoss, reduction: str = "mean"):
    """Returns ``value_and_grad(params, batches, mask, key) -> (loss, grad)``: the mean loss over
    every real example of a packed client and its gradient in ``params``. UGA's gradient evaluation
    grad L(w; D_k) and FedMeta's grad L(w; D_meta) are this function.

    ``reduction`` picks the gradient: ``mean`` (the gradient of the mean loss, Eq. 13 of seed 002 as
    written) or ``sum_of_batch_means`` (the sum over batches of each batch's mean-loss gradient:
    what a loop of ``loss.backward()`` over a data loader accumulates when nothing divides it; for
    full batches it is the mean gradient times the number of batches). The returned loss is the mean
    either way.

    A ``lax.scan`` over the batches accumulates each batch's loss sum and gradient, so memory stays
    one batch of activations deep however much data there is. (``jax.grad`` of a scanned loss would
    instead keep every batch's activations for the backward pass: for UGA that grew with the
    client's data.)
    """
    if reduction not in DATA_GRADIENT_REDUCTIONS:
        raise ValueError(f"reduction must be one of {DATA_GRADIENT_REDUCTIONS}, got {reduction!r}")

    def value_and_grad(params, batches, mask, key):
        def batch_sum(p, batch, batch_mask, batch_key):
            losses = per_example_loss(p, batch, batch_key)
            masked_mean(losses, batch_mask)  # raises at trace time unless one loss per example
            return jnp.sum(jnp.where(batch_mask, losses, 0.0))

        def accumulate(carry, inputs):
            total, grad_total = carry
            value, grad = jax.value_and_grad(batch_sum)(params, *inputs)
            if reduction == "sum_of_batch_means":  # an all-padding batch adds nothing
                grad = jax.tree_util.tree_map(
                    lambda g: g / jnp.maximum(jnp.sum(inputs[1]), 1), grad
                )
            return (total + value, jax.tree_util.tree_map(jnp.add, grad_total, grad)), None

        keys = jax.random.split(key, mask.shape[0])
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        (total, grad_total), _ = jax.lax.scan(
            accumulate, (jnp.zeros(()), zeros), (batches, mask, keys)
        )
        count = jnp.maximum(jnp.sum(mask), 1)
        if reduction == "sum_of_batch_means":
            return total / count, grad_total
        return total / count, jax.tree_util.tree_map(lambda g: g / count, grad_total)

    return value_and_grad
