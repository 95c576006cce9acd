"""Model options: the backend's convolution by default, and bfloat16 compute with float32
parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core.strategy import choose_strategy
from fedjax_dp.models import get_model


def test_default_convolution_is_the_one_measured_fastest_here():
    """Issue 20: get_model defaulted to XLA convs, which run ~7x slower inside the local-step loop
    on XLA:CPU than the im2col that `auto` picks; the library default now follows `auto`."""
    assert get_model("cnn_fedavg").module.conv_impl == choose_strategy(True, 1).conv_impl
    assert get_model("cnn_fedavg", conv_impl="xla").module.conv_impl == "xla"


def test_bfloat16_compute_keeps_float32_parameters_and_gradients():
    full, mixed = (
        get_model("cnn_fedavg", (12, 12, 1), 5),
        get_model("cnn_fedavg", (12, 12, 1), 5, compute_dtype="bfloat16"),
    )
    params = full.init(jax.random.key(0))
    batch = {"x": jax.random.normal(jax.random.key(1), (8, 12, 12, 1)), "y": jnp.arange(8) % 5}
    loss = lambda model: lambda p: model.per_example_loss(p, batch).mean()  # noqa: E731
    # jitted: one compile, not op by op
    exact, exact_grad = jax.jit(jax.value_and_grad(loss(full)))(params)
    low, low_grad = jax.jit(jax.value_and_grad(loss(mixed)))(params)
    assert jax.eval_shape(mixed.apply, params, batch["x"]).dtype == jnp.float32
    assert {g.dtype for g in jax.tree_util.tree_leaves(low_grad)} == {jnp.dtype(jnp.float32)}
    np.testing.assert_allclose(low, exact, rtol=2e-2)
    flat = lambda tree: jnp.concatenate([g.ravel() for g in jax.tree_util.tree_leaves(tree)])  # noqa: E731
    error = jnp.linalg.norm(flat(low_grad) - flat(exact_grad)) / jnp.linalg.norm(flat(exact_grad))
    # bfloat16 ran (float32 would be ~1e-6) and stayed close: measured 0.076 here
    assert 1e-3 < error < 0.15


def test_unknown_compute_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="compute_dtype 'float16'"):
        get_model("mlp_2nn", compute_dtype="float16")


@pytest.mark.parametrize("shape", [(3, 28, 28, 5), (2, 7, 9, 3)])
def test_reshape_max_pool_equals_flax_max_pool_in_values_and_gradients(shape):
    """``max_pool_2x2`` (issue 20: about half the time of ``nn.max_pool`` forward + backward on
    XLA:CPU) computes the same values, and after a ReLU the same gradient (odd sizes drop the last
    row/column)."""
    import flax.linen as nn

    from fedjax_dp.models.pooling import max_pool_2x2

    x = jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)
    flax_pool = lambda v: nn.max_pool(v, (2, 2), strides=(2, 2))  # noqa: E731
    np.testing.assert_array_equal(max_pool_2x2(x), flax_pool(x))
    loss = lambda pool: lambda v: jnp.sum(jnp.sin(pool(jax.nn.relu(v))))  # noqa: E731
    np.testing.assert_array_equal(jax.grad(loss(max_pool_2x2))(x), jax.grad(loss(flax_pool))(x))


def assert_penultimate_feeds_the_output_layer(model, params, x):
    """``apply(..., penultimate=True)``: the last hidden layer after its ReLU, which the output
    layer maps to the logits (PFLDyn's authors build prototypes on it)."""
    hidden = model.apply(params, x, penultimate=True)
    last = params[sorted(k for k in params if k.startswith("Dense_"))[-1]]
    assert hidden.shape == (x.shape[0], last["kernel"].shape[0]) and float(jnp.min(hidden)) >= 0
    np.testing.assert_allclose(
        hidden @ last["kernel"] + last["bias"], model.apply(params, x), rtol=1e-4, atol=1e-5
    )
    return hidden


@pytest.mark.parametrize(
    "name, shape", [("mlp_2nn", (28, 28, 1)), ("cnn_fedavg", (12, 12, 1)), ("cnn_pfl", (32, 32, 3))]
)
def test_the_penultimate_representation_is_the_input_of_the_output_layer(name, shape):
    """The VGG16 models are checked in their own tests below, on the parameters those initialise."""
    model = get_model(name, shape, 7)
    assert_penultimate_feeds_the_output_layer(
        model, model.init(jax.random.key(0)), jax.random.normal(jax.random.key(1), (3,) + shape)
    )


def test_a_model_without_a_hidden_layer_has_no_penultimate_representation():
    model = get_model("logistic", (4, 4, 1), 3)
    with pytest.raises(ValueError, match="model 'logistic' has no hidden layer"):
        model.apply(model.init(jax.random.key(0)), jnp.zeros((1, 4, 4, 1)), penultimate=True)


def test_vgg16_passes_the_input_signal_through_its_15_relu_layers_at_initialisation():
    """Regression (the first VGG16 runs, experiments/RESULTS.md "Table 6 with VGG16"): with
    LeCun-normal weights and no normalisation the 15 ReLU layers shrank the signal ~100x (output std
    0.0012 on CIFAR inputs, gradient norm 3e-5: every prototype coincided and nothing trained).
    He-normal weights keep its scale."""
    model = get_model("vgg16", (32, 32, 3), 10)
    params = model.init(jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (16, 32, 32, 3))  # image-like: [0, 1]
    assert float(jnp.std(model.apply(params, x))) > 0.02
    assert float(jnp.std(assert_penultimate_feeds_the_output_layer(model, params, x))) > 0.05


def test_vgg16_gn_adds_a_groupnorm_per_conv_that_normalises_each_example_on_its_own():
    """``vgg16_gn``: VGG16 with a 32-group GroupNorm after each of its 13 convs (8,448 more
    parameters than vgg16's 15,245,130). Unlike batch norm, an example's output does not depend on
    the rest of its batch, so per-client vmapped training and per-example clipping stay what they
    are."""
    count = lambda p: sum(int(np.prod(a.shape)) for a in jax.tree.leaves(p))  # noqa: E731
    plain, grouped = get_model("vgg16", (32, 32, 3), 10), get_model("vgg16_gn", (32, 32, 3), 10)
    params = grouped.init(jax.random.key(0))
    # its sizes without compiling its initialiser
    plain_shapes = jax.eval_shape(plain.init, jax.random.key(0))
    assert count(plain_shapes) == 15_245_130 and count(params) == 15_245_130 + 8_448
    assert sum(k.startswith("GroupNorm_") for k in params) == 13
    x = jax.random.uniform(jax.random.key(1), (4, 32, 32, 3))
    other = x.at[1:].set(jax.random.uniform(jax.random.key(2), (3, 32, 32, 3)))
    out = grouped.apply(params, x)
    np.testing.assert_allclose(grouped.apply(params, other)[0], out[0], rtol=1e-5, atol=1e-6)
    assert float(jnp.std(assert_penultimate_feeds_the_output_layer(grouped, params, x))) > 0.05


@pytest.mark.parametrize(
    "name, shape, xla_layers", [("cnn_fedavg", (28, 28, 1), 1), ("cnn_pfl", (32, 32, 3), 2)]
)
def test_per_layer_convolutions_pick_by_shape_and_compute_the_same_function(
    name, shape, xla_layers
):
    """``conv_impl='per_layer'``: im2col for a thin input (the FedAvg CNN's 1 -> 32), XLA's
    convolution otherwise; values and gradients equal the all-XLA model's."""
    per_layer, xla = (
        get_model(name, shape, 5, conv_impl="per_layer"),
        get_model(name, shape, 5, conv_impl="xla"),
    )
    params = xla.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (3,) + shape)
    jaxpr = jax.make_jaxpr(per_layer.apply)(params, x)
    assert sum(e.primitive.name == "conv_general_dilated" for e in jaxpr.jaxpr.eqns) == xla_layers
    np.testing.assert_allclose(
        per_layer.apply(params, x), xla.apply(params, x), rtol=1e-5, atol=1e-5
    )
    grad = lambda model: jax.grad(lambda p: jnp.sum(jnp.tanh(model.apply(p, x))))(params)  # noqa: E731
    for a, b in zip(
        jax.tree_util.tree_leaves(grad(per_layer)), jax.tree_util.tree_leaves(grad(xla))
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "shape, size",
    [((3, 32, 32, 3), 5), ((2, 28, 28, 1), 5), ((2, 16, 12, 4), 7), ((1, 8, 8, 2), 9)],
)
def test_space_to_depth_convolution_equals_xla_in_values_and_gradients(shape, size):
    """``conv2d_space_to_depth``: the 2x2-block form of a SAME stride-1 convolution is the same
    function."""
    from fedjax_dp.models.conv import conv2d_space_to_depth

    x = jax.random.normal(jax.random.key(0), shape)
    kernel = jax.random.normal(jax.random.key(1), (size, size, shape[-1], 6))
    xla = lambda x, k: jax.lax.conv_general_dilated(
        x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )  # noqa: E731
    np.testing.assert_allclose(
        conv2d_space_to_depth(x, kernel), xla(x, kernel), rtol=1e-5, atol=1e-4
    )
    grads = [
        jax.grad(lambda k, x: jnp.sum(jnp.tanh(conv(x, k))), argnums=(0, 1))(kernel, x)
        for conv in (conv2d_space_to_depth, xla)
    ]
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_space_to_depth_takes_only_the_thin_5x5_layers():
    """``cnn_pfl``'s first layer (3 -> 16) runs on 2x2 blocks, its second (16 -> 16) as XLA's
    convolution."""
    model = get_model("cnn_pfl", (32, 32, 3), 5, conv_impl="space_to_depth")
    params = model.init(jax.random.key(0))
    jaxpr = jax.make_jaxpr(model.apply)(params, jnp.ones((2, 32, 32, 3)))
    convs = [
        e.invars[0].aval.shape
        for e in jaxpr.jaxpr.eqns
        if e.primitive.name == "conv_general_dilated"
    ]
    assert convs == [(2, 16, 16, 12), (2, 16, 16, 16)]


def test_space_to_depth_falls_back_to_xla_where_it_does_not_apply():
    """A 3x3 kernel (VGG16), an odd image side, or an output wider than 16 cin: the plain
    convolution."""
    for shape, kernel_size, features in (
        ((2, 8, 8, 3), (3, 3), 4),
        ((2, 7, 7, 3), (5, 5), 4),
        ((2, 8, 8, 1), (5, 5), 32),
    ):
        from fedjax_dp.models.conv import Conv2D

        layer = Conv2D(features, kernel_size, impl="space_to_depth")
        x = jnp.ones(shape)
        params = layer.init(jax.random.key(0), x)
        jaxpr = jax.make_jaxpr(layer.apply)(params, x)
        convs = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
        # the image itself, not its 2x2 blocks
        assert [e.invars[0].aval.shape for e in convs] == [shape]
        assert jaxpr.jaxpr.outvars[0].aval.shape == shape[:3] + (features,)
        assert params["params"]["kernel"].shape == kernel_size + (shape[-1], features)


@pytest.mark.parametrize("name, shape", [("mlp_2nn", (28, 28, 1)), ("cnn_fedavg", (28, 28, 1))])
def test_compiled_initialisation_gives_flax_eager_parameters_bit_for_bit(name, shape):
    """``Model.init`` compiles the whole initialisation once (``base.init_params``); the parameters
    are flax's eager ``module.init``'s exactly, so seeded runs keep their numbers (checked here for
    a dense and a conv model; every model of the golden runs is checked through their numbers)."""
    model = get_model(name, shape, 10)
    compiled = model.init(jax.random.key(1))
    eager = model.module.init(jax.random.key(1), jnp.zeros((1,) + shape))["params"]
    for a, b in zip(
        jax.tree_util.tree_leaves(compiled), jax.tree_util.tree_leaves(eager), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_the_pfldyn_authors_cnn_has_their_797962_parameters_and_unpadded_convolutions():
    """``cnn_pfl_authors``: conv5x5-64, pool, conv5x5-64, pool, dense 384-192 with PyTorch's
    unpadded convolutions (the CNN of PFLDyn's authors' CIFAR script); each conv equals
    ``nn.Conv(padding='VALID')``, in every implementation."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from fedjax_dp.models import get_model
    from fedjax_dp.models.pfl_cnn import valid_conv

    model = get_model("cnn_pfl_authors", (32, 32, 3), 10, conv_impl="xla")
    params = model.module.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
    assert sum(leaf.size for leaf in jax.tree_util.tree_leaves(params)) == 797_962
    x = jax.random.normal(jax.random.key(1), (2, 12, 12, 3))
    conv = params["params"]["Conv2D_0"]
    expected = nn.Conv(64, (5, 5), padding="VALID").apply({"params": conv}, x)
    for impl in ("xla", "im2col"):
        out = type(
            "Wrap", (nn.Module,), {"__call__": nn.compact(lambda self, v: valid_conv(64, impl, v))}
        )()
        assert out.apply({"params": {"Conv2D_0": conv}}, x).shape == expected.shape == (2, 8, 8, 64)
        assert jnp.allclose(out.apply({"params": {"Conv2D_0": conv}}, x), expected, atol=1e-5)
    assert model.module.apply(params, jnp.zeros((3, 32, 32, 3)), penultimate=True).shape == (3, 192)
