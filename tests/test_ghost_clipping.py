"""Book-keeping clipping (``privacy.mechanisms.ghost_clipping``) gives DP-SGD's clipped gradient sum
of the vmapped per-example gradients, for every model family: dense only, convolutions + dense, a
recurrent model whose output layer sees 12 positions per example, GroupNorm; padded slots; a median
clip; a loss with no dense layer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.models import get_model
from fedjax_dp.privacy.mechanisms.ghost_clipping import clipped_gradient_sum, find_dense_calls
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient, clipped_sum


def per_example_reference(per_example_loss, params, batch, mask, clip_norm, median=False):
    def one(p, example):
        return per_example_loss(p, jax.tree_util.tree_map(lambda x: x[None], example), None)[0]

    losses, grads = jax.vmap(jax.value_and_grad(one), in_axes=(None, 0))(params, batch)
    summed, used = clipped_sum(grads, mask, clip_norm, median)
    return losses, summed, used


def batch_for(name, shape, num_classes, size=6, seed=0):
    rng = np.random.default_rng(seed)
    if name == "char_gru":
        x = rng.integers(0, num_classes, (size,) + shape).astype(np.int32)
        return {"x": jnp.asarray(x), "y": jnp.asarray(np.roll(x, -1, axis=1))}
    return {
        "x": jnp.asarray(rng.standard_normal((size,) + shape).astype(np.float32)),
        "y": jnp.asarray(rng.integers(0, num_classes, size).astype(np.int32)),
    }


CASES = [
    ("logistic", (4, 4, 1), 3, 1),
    ("mlp_2nn", (6, 6, 1), 5, 3),
    ("cnn_fedavg", (8, 8, 1), 4, 2),
    ("cnn_pfl", (8, 8, 3), 4, 2),
    ("vgg16_gn", (32, 32, 3), 4, 3),
    ("char_gru", (12,), 7, 1),
]


@pytest.mark.parametrize("name,shape,num_classes,dense_layers", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("median", [False, True], ids=["fixed", "median"])
def test_the_clipped_sum_is_the_per_example_gradients_one(
    name, shape, num_classes, dense_layers, median
):
    model = get_model(name, shape, num_classes, conv_impl="xla")
    params = model.init(jax.random.key(1))
    batch = batch_for(name, shape, num_classes)
    mask = jnp.array([True, True, False, True, True, False])
    calls = find_dense_calls(
        model.per_example_loss, params, jax.tree_util.tree_map(lambda x: x[:1], batch), None
    )
    # the GRU's gate layers (nested in its cells, called per step) are left out
    assert len(calls) == dense_layers
    clip = 0.05  # below most examples' norms, so the clip acts
    run = jax.jit(
        lambda p, b, m: clipped_gradient_sum(model.per_example_loss, p, b, m, None, clip, median)
    )
    losses, summed, used = run(params, batch, mask)
    want_losses, want, want_used = per_example_reference(
        model.per_example_loss, params, batch, mask, clip, median
    )
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(used, want_used, rtol=1e-4)
    assert jax.tree_util.tree_structure(summed) == jax.tree_util.tree_structure(want)
    for got, expected in zip(jax.tree_util.tree_leaves(summed), jax.tree_util.tree_leaves(want)):
        scale = float(jnp.max(jnp.abs(expected))) + 1e-12
        np.testing.assert_allclose(got / scale, expected / scale, atol=2e-5)


def test_the_padded_slots_weigh_nothing_and_a_clip_above_every_norm_is_the_plain_sum():
    model = get_model("mlp_2nn", (6, 6, 1), 5)
    params = model.init(jax.random.key(0))
    batch = batch_for("mlp_2nn", (6, 6, 1), 5)
    batch["x"] = batch["x"].at[2].set(1e3)  # a padded slot with a huge gradient
    mask = jnp.array([True, True, False, True, True, True])
    _, summed, _ = clipped_gradient_sum(model.per_example_loss, params, batch, mask, None, 1e9)
    plain = jax.grad(lambda p: jnp.sum(model.per_example_loss(p, batch) * mask))(params)
    for got, expected in zip(jax.tree_util.tree_leaves(summed), jax.tree_util.tree_leaves(plain)):
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)


def test_a_dense_layer_called_twice_or_nested_keeps_per_example_gradients():
    class Inner(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(x)

    class Shared(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = nn.Dense(3)
            return dense(jnp.tanh(dense(x))) + Inner()(x)

    module = Shared()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    params = module.init(jax.random.key(0), x)["params"]

    def loss(p, batch, key):
        return jnp.sum(module.apply({"params": p}, batch["x"]) * batch["y"], axis=1)

    batch = {"x": x, "y": jnp.ones((5, 3))}
    assert (
        find_dense_calls(loss, params, jax.tree_util.tree_map(lambda v: v[:1], batch), None) == ()
    )
    mask = jnp.ones(5, bool)
    _, summed, _ = clipped_gradient_sum(loss, params, batch, mask, None, 0.1)
    _, want, _ = per_example_reference(loss, params, batch, mask, 0.1)
    for got, expected in zip(jax.tree_util.tree_leaves(summed), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_a_dense_kernel_also_read_elsewhere_keeps_per_example_gradients():
    """Issue 74, item 4: a root Dense whose kernel the loss also reads through ``variables`` (tied
    input and output embeddings) got book-keeping norms from its dense call alone: contributions up
    to 1.16 C and a clipped sum 71 % off ``vmap(grad)`` + clip. The kernel's second read is found in
    the loss's jaxpr, inside a jit too, and the layer keeps its per-example gradients; an untied
    layer beside it keeps book-keeping."""

    class Tied(nn.Module):
        @nn.compact
        def __call__(self, x):
            embed = nn.Dense(4, name="embed")
            hidden = jnp.tanh(embed(x))
            kernel = embed.variables["params"]["kernel"]
            # read again (the output layer tied to the input)
            tied = jax.jit(lambda h, k: h @ k.T)(hidden, kernel)
            return nn.Dense(3, name="head")(tied)

    module = Tied()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32))
    params = module.init(jax.random.key(0), x)["params"]

    def loss(p, batch, key):
        return jnp.sum(module.apply({"params": p}, batch["x"]) * batch["y"], axis=1) ** 2

    batch = {
        "x": x,
        "y": jnp.asarray(np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)),
    }
    calls = find_dense_calls(loss, params, jax.tree_util.tree_map(lambda v: v[:1], batch), None)
    # the tied layer is left to the per-example path
    assert [call.path for call in calls] == [("head",)]
    mask = jnp.ones(6, bool)
    clip = 0.05
    _, summed, _ = clipped_gradient_sum(loss, params, batch, mask, None, clip)
    _, want, _ = per_example_reference(loss, params, batch, mask, clip)
    for got, expected in zip(jax.tree_util.tree_leaves(summed), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    # one example's clipped contribution is within C
    one = jax.tree_util.tree_map(lambda v: v[:1], batch)
    _, alone, _ = clipped_gradient_sum(loss, params, one, jnp.ones(1, bool), None, clip)
    norm = float(jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(alone))))
    assert norm <= clip * (1 + 1e-5)


def test_the_hook_gives_the_same_step_either_way():
    model = get_model("cnn_fedavg", (8, 8, 1), 4, conv_impl="im2col")
    params = model.init(jax.random.key(2))
    batch = batch_for("cnn_fedavg", (8, 8, 1), 4)
    mask = jnp.array([True] * 5 + [False])
    key, noise_key = jax.random.key(3), jax.random.key(4)
    steps = [
        jax.jit(lambda p, h=hook: h(model.per_example_loss, p, batch, mask, key, noise_key))(params)
        for hook in (
            ClippedNoisyGradient(0.1, 1.3),
            ClippedNoisyGradient(0.1, 1.3, dense_bookkeeping=False),
        )
    ]
    np.testing.assert_allclose(steps[0][0], steps[1][0], rtol=1e-6)
    for got, expected in zip(
        jax.tree_util.tree_leaves(steps[0][1]), jax.tree_util.tree_leaves(steps[1][1])
    ):
        # the same noise on the same clipped sum
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-6)


def _output_shapes(jaxpr):
    for eqn in jaxpr.eqns:
        yield from (tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _output_shapes(inner)


@pytest.mark.parametrize("bookkeeping", [True, False])
def test_no_per_example_dense_kernel_gradient_is_built(bookkeeping):
    """What book-keeping is for: no (B, in, out) stack of the dense kernel's per-example gradients
    (B x 256 x 512 floats here; B x 3136 x 512 for the FedAvg CNN on MNIST) is computed; the vmapped
    hook does build one."""
    model = get_model("cnn_fedavg", (8, 8, 1), 4, conv_impl="im2col")
    params = model.init(jax.random.key(2))
    batch, mask = batch_for("cnn_fedavg", (8, 8, 1), 4), jnp.ones(6, bool)
    hook = ClippedNoisyGradient(0.1, 1.0, dense_bookkeeping=bookkeeping)
    jaxpr = jax.make_jaxpr(
        lambda p: hook(model.per_example_loss, p, batch, mask, jax.random.key(0))
    )(params)
    kernel = params["Dense_0"]["kernel"].shape
    stacks = [
        s for s in _output_shapes(jaxpr.jaxpr) if len(s) >= 3 and s[0] == 6 and s[-2:] == kernel
    ]
    assert bool(stacks) == (not bookkeeping), stacks
