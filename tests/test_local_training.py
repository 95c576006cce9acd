"""Local training: padded clients equal an unpadded Python loop over their real batches."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.core.local_training import make_local_trainer, masked_mean
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.models import get_model

from conftest import random_client_data


def unpadded_loop(model, optimizer, params, x, y, steps):
    """A plain loop: one optimizer step per real batch (``steps`` lists each batch's example ids;
    each step jitted on its own, so it compiles once per batch length instead of dispatching every
    op)."""

    @jax.jit
    def step(params, opt_state, xb, yb):
        grads = jax.grad(lambda p: jnp.mean(model.per_example_loss(p, {"x": xb, "y": yb})))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = optimizer.init(params)
    for idx in steps:
        params, opt_state = step(params, opt_state, x[idx], y[idx])
    return params


@pytest.mark.parametrize(
    "model_name,conv_impl,optimizer",
    [
        ("mlp_2nn", "auto", optax.sgd(0.1)),
        ("mlp_2nn", "auto", optax.adam(0.01)),
        ("mlp_2nn", "auto", optax.sgd(0.1, momentum=0.9)),
        # XLA convolutions on CPU: padded steps are masked by a select, not skipped by lax.cond
        # (issue
        # 20)
        ("cnn_fedavg", "xla", optax.sgd(0.1, momentum=0.9)),
        ("cnn_fedavg", "im2col", optax.adam(0.01)),
    ],
    ids=["sgd", "adam", "momentum", "xla-conv-momentum", "im2col-adam"],
)
def test_padded_client_equals_unpadded_loop(model_name, conv_impl, optimizer):
    model = get_model(model_name, (4, 4, 1), 3, conv_impl=conv_impl)
    params = model.init(jax.random.key(0))
    sizes = [7, 23, 1]  # partial last batches and a client far smaller than the padded length
    data = random_client_data(np.random.default_rng(0), sizes)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    offsets = np.cumsum([0] + sizes)
    clients = [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))]
    cohort = pack_cohort(
        x, y, clients, batch_size=5, epochs=2, rng=np.random.default_rng(1), max_steps=12
    )
    train = jax.jit(make_local_trainer(model.per_example_loss, optimizer))
    for c, n in enumerate(sizes):
        batches = jax.tree_util.tree_map(lambda a: a[c], cohort["batches"])
        got, stats = train(params, batches, cohort["mask"][c], jax.random.key(c))
        steps = [row[row >= 0] for row in cohort["example_index"][c] if (row >= 0).any()]
        assert len(steps) == 2 * int(np.ceil(n / 5)) and sorted(np.concatenate(steps)) == sorted(
            list(clients[c]) * 2
        )
        want = unpadded_loop(model, optimizer, params, x, y, steps)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        assert int(stats.num_examples) == 2 * n
        assert int(stats.num_steps) == len(steps)


@pytest.mark.parametrize(
    "conv_impl,conditional", [("xla", jax.default_backend() != "cpu"), ("im2col", True)]
)
def test_xla_convolutions_on_cpu_avoid_the_padded_step_conditional(conv_impl, conditional):
    """XLA:CPU ran a 6-step client with XLA convolutions inside the padded-step ``lax.cond`` in 597
    ms instead of 83 ms without it (issue 20); such steps use a select. Other models keep the
    cond."""
    model = get_model("cnn_fedavg", (4, 4, 1), 3, conv_impl=conv_impl)
    params = model.init(jax.random.key(0))
    batches = {"x": jnp.zeros((2, 5, 4, 4, 1)), "y": jnp.zeros((2, 5), jnp.int32)}
    train = make_local_trainer(model.per_example_loss, optax.sgd(0.1), unroll=True)
    program = str(jax.make_jaxpr(train)(params, batches, jnp.ones((2, 5), bool), jax.random.key(0)))
    assert (" cond[" in program) == conditional


def test_unroll_does_not_change_result():
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    ((x, y),) = random_client_data(np.random.default_rng(2), [30])
    cohort = pack_cohort(x, y, [np.arange(30)], 4, 1, np.random.default_rng(0))
    batches = jax.tree_util.tree_map(lambda a: a[0], cohort["batches"])
    outs = [
        make_local_trainer(model.per_example_loss, optax.sgd(0.1), unroll=u)(
            params, batches, cohort["mask"][0], jax.random.key(0)
        )[0]
        for u in (1, 3, True)
    ]
    for other in outs[1:]:
        for a, b in zip(jax.tree_util.tree_leaves(outs[0]), jax.tree_util.tree_leaves(other)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_masked_mean_ignores_padding_even_if_nan():
    values = jnp.array([1.0, 3.0, jnp.nan])
    assert float(masked_mean(values, jnp.array([True, True, False]))) == 2.0
    assert float(masked_mean(values, jnp.array([False, False, False]))) == 0.0


def _proximal(mu):
    return lambda w, w0: (
        0.5 * mu * optax.tree_utils.tree_norm(optax.tree_utils.tree_sub(w, w0), squared=True)
    )


@pytest.mark.parametrize("hooked", [False, True], ids=["value_and_grad", "gradient_hook"])
def test_data_loss_is_the_objective_without_its_regulariser(hooked):
    """With a regulariser R (FedProx's mu/2 ||w - w_t||^2), ``loss`` is the mean over steps of data
    term + R and ``data_loss`` the data term alone, each at the step's parameters (a hand-written
    loop of the same SGD steps); the padding step counts in neither. Without a regulariser they are
    equal."""
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    ((x, y),) = random_client_data(np.random.default_rng(3), [13])
    # 3 real + 1 pad
    cohort = pack_cohort(x, y, [np.arange(13)], 5, 1, np.random.default_rng(0), max_steps=4)
    batches = jax.tree_util.tree_map(lambda a: a[0], cohort["batches"])
    mask = cohort["mask"][0]
    mu, lr = 2.0, 0.3

    # what the default path computes
    def data_value_and_grad(per_example_loss, w, batch, batch_mask, key):
        return jax.value_and_grad(
            lambda p: masked_mean(per_example_loss(p, batch, key), batch_mask)
        )(w)

    train = make_local_trainer(
        model.per_example_loss,
        optax.sgd(lr),
        regularizer=_proximal(mu),
        gradient_hook=data_value_and_grad if hooked else None,
    )
    _, stats = train(params, batches, mask, jax.random.key(0))

    w, data_terms, objectives, counts = params, [], [], []
    for s in range(mask.shape[0]):
        m = np.asarray(mask[s])
        if not m.any():
            continue
        xb, yb = np.asarray(batches["x"][s])[m], np.asarray(batches["y"][s])[m]

        def data(p):
            return jnp.mean(model.per_example_loss(p, {"x": xb, "y": yb}))

        def objective(p):
            return data(p) + _proximal(mu)(p, params)

        data_terms.append(float(data(w)))
        objectives.append(float(objective(w)))
        counts.append(m.sum())
        w = jax.tree_util.tree_map(lambda a, g: a - lr * g, w, jax.grad(objective)(w))
    assert len(counts) == 3
    np.testing.assert_allclose(
        float(stats.data_loss), np.average(data_terms, weights=counts), rtol=1e-5
    )
    np.testing.assert_allclose(float(stats.loss), np.average(objectives, weights=counts), rtol=1e-5)
    assert float(stats.loss) > float(stats.data_loss)  # R > 0 after the first step

    _, plain = make_local_trainer(model.per_example_loss, optax.sgd(lr))(
        params, batches, mask, jax.random.key(0)
    )
    assert float(plain.data_loss) == float(plain.loss)
