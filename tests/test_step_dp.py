"""The per-step gradient hook of local training: DP-SGD and clipped-minibatch steps inside the scan
equal a hand-written loop, under jit and vmap, and padded steps stay untouched."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.models import get_model
from fedjax_dp.privacy.mechanisms.gaussian import add_gaussian_noise
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient

LR, C, Z = 0.1, 0.5, 0.8


def problem(steps=3, batch=4, seed=0):
    model = get_model("mlp_2nn", (3, 3, 1), 3)
    rng = np.random.default_rng(seed)
    batches = {
        "x": rng.standard_normal((steps, batch, 3, 3, 1)).astype(np.float32),
        "y": rng.integers(0, 3, (steps, batch)).astype(np.int32),
    }
    mask = np.ones((steps, batch), bool)
    if steps >= 3:
        mask[1, 3] = False  # a padded example
        mask[2, :] = False  # an all-padding step
    return model, model.init(jax.random.key(0)), batches, mask


def hand_written(model, params, batches, mask, key, per_example):
    """Plain Python: per step, the gradient of each example (or of the batch mean), clip, noise,
    SGD."""
    step_keys = jax.random.split(key, mask.shape[0])
    for s in range(mask.shape[0]):
        if not mask[s].any():
            continue
        loss_key, noise_key = jax.random.split(step_keys[s])
        real = [i for i in range(mask.shape[1]) if mask[s, i]]
        if per_example:
            total = None
            for i in real:
                example = {k: v[s, i : i + 1] for k, v in batches.items()}
                g = jax.grad(lambda p: model.per_example_loss(p, example, loss_key)[0])(params)
                norm = jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(g)))
                g = jax.tree_util.tree_map(lambda x: x * jnp.minimum(1.0, C / norm), g)
                total = g if total is None else jax.tree_util.tree_map(jnp.add, total, g)
            grad = jax.tree_util.tree_map(
                lambda x: x / mask.shape[1], add_gaussian_noise(total, Z * C, noise_key)
            )
        else:
            batch = {k: v[s][np.array(real)] for k, v in batches.items()}
            g = jax.grad(lambda p: model.per_example_loss(p, batch, loss_key).mean())(params)
            norm = jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(g)))
            g = jax.tree_util.tree_map(lambda x: x * jnp.minimum(1.0, C / norm), g)
            grad = add_gaussian_noise(g, Z * C, noise_key)
        params = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grad)
    return params


@pytest.mark.parametrize("per_example", [True, False])
def test_hook_in_the_scan_equals_a_hand_written_loop(per_example):
    model, params, batches, mask = problem()
    train = make_local_trainer(
        model.per_example_loss,
        optax.sgd(LR),
        gradient_hook=ClippedNoisyGradient(C, Z, per_example=per_example),
    )
    got, _ = jax.jit(train)(params, batches, mask, jax.random.key(7))
    want = hand_written(model, params, batches, mask, jax.random.key(7), per_example)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_hook_vmaps_over_clients_and_noise_differs_per_client():
    model, params, batches, mask = problem()
    train = make_local_trainer(
        model.per_example_loss, optax.sgd(LR), gradient_hook=ClippedNoisyGradient(C, Z)
    )
    stacked = jax.tree_util.tree_map(lambda x: np.stack([x, x]), batches)
    keys = jax.random.split(jax.random.key(1), 2)
    got, _ = jax.vmap(train, in_axes=(None, 0, None, 0))(params, stacked, mask, keys)
    for i in range(2):
        one, _ = train(params, batches, mask, keys[i])
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(one)):
            np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6)
    first = jax.tree_util.tree_leaves(got)[0]
    assert not np.allclose(first[0], first[1])  # same data, different noise keys


def test_clipping_bounds_each_example_and_noise_is_calibrated():
    """With z = 0 a step moves by at most lr * C (the mean of clipped gradients); with z > 0 the
    step's deviation from the noiseless one has the std z C / B per entry."""
    model, params, batches, mask = problem(steps=1, batch=4)
    mask[:] = True
    batches["x"] = batches["x"] * 100.0  # large gradients: every example is clipped
    noiseless = make_local_trainer(
        model.per_example_loss, optax.sgd(LR), gradient_hook=ClippedNoisyGradient(C, 0.0)
    )
    moved, _ = noiseless(params, batches, mask, jax.random.key(0))
    step = jnp.sqrt(
        sum(
            jnp.sum((a - b) ** 2)
            for a, b in zip(jax.tree_util.tree_leaves(moved), jax.tree_util.tree_leaves(params))
        )
    )
    assert float(step) <= LR * C * (1 + 1e-5)
    noisy = make_local_trainer(
        model.per_example_loss, optax.sgd(LR), gradient_hook=ClippedNoisyGradient(C, 4.0)
    )
    out, _ = noisy(params, batches, mask, jax.random.key(0))
    deviation = np.concatenate(
        [
            np.ravel(a - b)
            for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(moved))
        ]
    )
    np.testing.assert_allclose(deviation.std(), LR * 4.0 * C / 4, rtol=0.05)


def test_step_release_states_the_sensitivity_relation_and_event():
    """Per example: add/remove one example, sensitivity C, Gaussian(z); the clipped batch mean:
    replace-one, 2C, Gaussian(z / 2) (replacing one example moves the clipped mean anywhere in the
    ball of radius C)."""
    import dp_accounting

    per_example = ClippedNoisyGradient(0.5, 2.0, per_example=True).step_release()
    assert per_example.unit == "example" and per_example.sensitivity == 0.5
    assert per_example.relation == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    assert per_example.event == dp_accounting.GaussianDpEvent(2.0)
    batch = ClippedNoisyGradient(0.5, 2.0, per_example=False).step_release(noise_multiplier=3.0)
    assert (
        batch.relation == dp_accounting.NeighboringRelation.REPLACE_ONE and batch.sensitivity == 1.0
    )
    assert batch.noise_multiplier == 3.0 and batch.event == dp_accounting.GaussianDpEvent(1.5)
    with pytest.raises(ValueError, match="clip_norm C must be > 0, got -1"):
        ClippedNoisyGradient(-1, 1.0)


def _equations(jaxpr):
    """Every equation of a jaxpr, nested ones (pjit, custom_jvp, ...) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                    yield from _equations(sub.jaxpr)
                elif hasattr(sub, "eqns"):
                    yield from _equations(sub)


@pytest.mark.parametrize("bookkeeping", [True, False], ids=["bookkeeping", "per_example"])
def test_clipped_sum_contracts_the_examples_instead_of_reducing_the_gradient_stack(bookkeeping):
    """Performance bug (issue 18): summing the stacked clipped per-example gradients with a reduce
    let XLA:CPU fuse the per-example gradient into the reduction: one DP-SGD step of the FedAvg CNN
    at B = 16 took 6.9 s instead of 0.14 s (``benchmarks/step_dp_cost.py``). The hook contracts the
    example axis with the clip weights (a dot_general); no reduce_sum runs over a (B, ...) stack of
    a weight matrix's gradients."""
    # 5: not the noise's NOISE_DRAWS stack of 4
    model, params, batches, mask = problem(steps=1, batch=5)
    batch = {k: v[0] for k, v in batches.items()}
    hook = ClippedNoisyGradient(C, Z, dense_bookkeeping=bookkeeping)
    jaxpr = jax.make_jaxpr(
        lambda p: hook(model.per_example_loss, p, batch, mask[0], jax.random.key(0))
    )(params)
    stacked = {(5,) + leaf.shape for leaf in jax.tree_util.tree_leaves(params) if leaf.ndim >= 2}
    reduced = [
        eqn.invars[0].aval.shape
        for eqn in _equations(jaxpr.jaxpr)
        if eqn.primitive.name == "reduce_sum"
        and 0 in eqn.params["axes"]
        and tuple(eqn.invars[0].aval.shape) in stacked
    ]
    assert not reduced, f"reduce_sum over stacked per-example gradients of shapes {reduced}"
