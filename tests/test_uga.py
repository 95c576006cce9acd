"""UGA (seed 002 §3.1): the client meta-gradient through unrolled local training."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import jax.flatten_util

from fedjax_dp.core.round import FederatedRound
from fedjax_dp.algorithms.uga import UGA, make_uga_gradient
from fedjax_dp.core.local_training import make_data_value_and_grad, make_local_trainer
from fedjax_dp.data.packing import pack_uga_cohort
from fedjax_dp.models import get_model

from conftest import random_client_data

enable_x64 = lambda: jax.enable_x64(True)


def _tiny_loss(params, batch, key=None):
    hidden = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return optax.softmax_cross_entropy_with_integer_labels(hidden @ params["w2"], batch["y"])


def _tiny_problem(n=21, batch_size=8, epochs=3, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, 3)).astype(dtype), rng.integers(0, 2, n).astype(np.int32)
    params = {
        "w1": jnp.asarray(rng.normal(size=(3, 4)), dtype),
        "b1": jnp.asarray(rng.normal(size=4) * 0.1, dtype),
        "w2": jnp.asarray(rng.normal(size=(4, 2)), dtype),
    }
    packed = pack_uga_cohort(x, y, [np.arange(n)], batch_size, epochs, rng)
    client = jax.tree_util.tree_map(lambda a: jnp.asarray(a[0]), packed)
    client["key"] = jax.random.key(3)
    client["eval_key"] = jax.random.key(4)
    return params, client


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


@pytest.mark.slow
def test_uga_gradient_matches_central_finite_differences_in_float64():
    with enable_x64():
        params, client = _tiny_problem()
        grad_fn = make_uga_gradient(_tiny_loss, optax.sgd(0.5))
        grad, stats, ok = grad_fn(params, client)
        # E - 1 = 2 epochs of ceil(21 / 8) = 3 batches
        assert bool(ok) and int(stats.num_steps) == 6
        loss = lambda p: grad_fn(p, client)[1].loss  # noqa: E731
        flat, unflatten = jax.flatten_util.ravel_pytree(params)
        eps = 1e-6
        numeric = np.array(
            [
                (loss(unflatten(flat.at[i].add(eps))) - loss(unflatten(flat.at[i].add(-eps))))
                / (2 * eps)
                for i in range(flat.size)
            ]
        )
        np.testing.assert_allclose(_flat(grad), numeric, rtol=1e-6, atol=1e-9)


def test_uga_gradient_equals_an_explicitly_unrolled_python_reference():
    with enable_x64():
        params, client = _tiny_problem(epochs=3)
        lr = 0.3

        def reference_loss(w):
            mask = client["mask"]
            for s in range(mask.shape[0]):  # plain Python SGD over the keep-trace batches
                batch = jax.tree_util.tree_map(lambda a: a[s], client["batches"])
                m = mask[s]
                g = jax.grad(lambda v: jnp.sum(jnp.where(m, _tiny_loss(v, batch), 0)) / jnp.sum(m))(
                    w
                )
                w = jax.tree_util.tree_map(lambda a, b: a - lr * b, w, g)
            em = client["eval_mask"]
            eb = client["eval_batches"]
            total = sum(
                jnp.sum(
                    jnp.where(em[s], _tiny_loss(w, jax.tree_util.tree_map(lambda a: a[s], eb)), 0)
                )
                for s in range(em.shape[0])
            )
            return total / jnp.sum(em)

        grad, stats, _ = make_uga_gradient(_tiny_loss, optax.sgd(lr))(params, client)
        np.testing.assert_allclose(float(stats.loss), float(reference_loss(params)), rtol=1e-12)
        np.testing.assert_allclose(
            _flat(grad), _flat(jax.grad(reference_loss)(params)), rtol=1e-10, atol=1e-12
        )


def test_one_local_epoch_is_fedsgd_on_the_whole_local_data():
    with enable_x64():
        params, client = _tiny_problem(epochs=1)
        # E - 1 = 0 keep-trace epochs: one all-padding step
        assert not bool(jnp.any(client["mask"]))
        grad, _, _ = make_uga_gradient(_tiny_loss, optax.sgd(0.5))(params, client)
        x = client["eval_batches"]["x"][client["eval_mask"]]
        y = client["eval_batches"]["y"][client["eval_mask"]]
        fedsgd = jax.grad(lambda p: jnp.mean(_tiny_loss(p, {"x": x, "y": y})))(params)
        np.testing.assert_allclose(_flat(grad), _flat(fedsgd), rtol=1e-12)


def test_whole_data_loss_and_gradient_accumulated_batch_by_batch_equal_the_direct_ones():
    """make_data_value_and_grad (a forward scan summing per-batch gradients, padding masked) is the
    mean loss over the real examples and its gradient."""
    with enable_x64():
        params, client = _tiny_problem(n=21, batch_size=8)
        loss, grad = make_data_value_and_grad(_tiny_loss)(
            params, client["eval_batches"], client["eval_mask"], jax.random.key(0)
        )
        x = client["eval_batches"]["x"][client["eval_mask"]]
        y = client["eval_batches"]["y"][client["eval_mask"]]
        assert x.shape[0] == 21 and client["eval_mask"].size == 24  # one batch padded
        direct_loss, direct_grad = jax.value_and_grad(
            lambda p: jnp.mean(_tiny_loss(p, {"x": x, "y": y}))
        )(params)
        np.testing.assert_allclose(float(loss), float(direct_loss), rtol=1e-12)
        np.testing.assert_allclose(_flat(grad), _flat(direct_grad), rtol=1e-12)


def test_sum_of_batch_means_reduction_sums_each_batch_mean_gradient():
    """``sum_of_batch_means`` (the accumulated-``backward()`` reading of UGA's evaluation) is the
    sum of the three batches' mean-loss gradients (8, 8 and a padded 5 examples); the loss stays the
    mean."""
    with enable_x64():
        params, client = _tiny_problem(n=21, batch_size=8, epochs=1)
        batches, mask = client["eval_batches"], client["eval_mask"]
        loss, grad = make_data_value_and_grad(_tiny_loss, "sum_of_batch_means")(
            params, batches, mask, jax.random.key(0)
        )
        mean_loss, _ = make_data_value_and_grad(_tiny_loss)(
            params, batches, mask, jax.random.key(0)
        )
        want = 0.0
        for b in range(mask.shape[0]):
            real = {k: v[b][mask[b]] for k, v in batches.items()}
            want = want + _flat(jax.grad(lambda p: jnp.mean(_tiny_loss(p, real)))(params))
        assert [int(m.sum()) for m in mask] == [8, 8, 5]
        np.testing.assert_allclose(_flat(grad), want, rtol=1e-12)
        np.testing.assert_allclose(float(loss), float(mean_loss), rtol=1e-12)
        uga_grad, _, _ = make_uga_gradient(
            _tiny_loss, optax.sgd(0.1), reduction="sum_of_batch_means"
        )(params, client)
        np.testing.assert_allclose(_flat(uga_grad), want, rtol=1e-12)  # E = 1: no trajectory
        with pytest.raises(ValueError, match="'sum'"):
            make_data_value_and_grad(_tiny_loss, "sum")


def test_two_epochs_one_batch_is_the_papers_second_order_formula():
    """E = 2 with one batch B = D_k: g = (I - eta H(w_t)) grad L(w_t - eta grad L(w_t)) (Eqs.
    15-19)."""
    with enable_x64():
        params, client = _tiny_problem(n=8, batch_size=8, epochs=2)
        lr = 0.4
        grad, _, _ = make_uga_gradient(_tiny_loss, optax.sgd(lr))(params, client)
        x, y = client["eval_batches"]["x"][0], client["eval_batches"]["y"][0]
        loss = lambda p: jnp.mean(_tiny_loss(p, {"x": x, "y": y}))  # noqa: E731
        w1 = jax.tree_util.tree_map(lambda a, b: a - lr * b, params, jax.grad(loss)(params))
        v = jax.grad(loss)(w1)
        hvp = jax.jvp(jax.grad(loss), (params,), (v,))[1]
        want = jax.tree_util.tree_map(lambda a, b: a - lr * b, v, hvp)
        np.testing.assert_allclose(_flat(grad), _flat(want), rtol=1e-10)


# 9 steps: segments 1, 2 (padded), 4 (padded), 3
@pytest.mark.parametrize("remat", [True, 2, 4, "sqrt"])
def test_rematerialised_and_plain_uga_give_the_same_gradient(remat):
    with enable_x64():
        params, client = _tiny_problem(epochs=4)
        opt = optax.sgd(0.2, momentum=0.9)
        plain_grad, plain_stats, _ = make_uga_gradient(_tiny_loss, opt)(params, client)
        grad, stats, _ = make_uga_gradient(_tiny_loss, opt, remat=remat)(params, client)
        np.testing.assert_allclose(_flat(grad), _flat(plain_grad), rtol=1e-12)
        assert int(stats.num_steps) == int(plain_stats.num_steps) == 9
        np.testing.assert_allclose(float(stats.loss), float(plain_stats.loss), rtol=1e-12)


def test_bad_remat_option_is_named():
    with pytest.raises(ValueError, match="remat must be"):
        make_uga_gradient(_tiny_loss, optax.sgd(0.1), remat="often")


def test_first_order_uga_is_the_gradient_at_the_final_weights():
    with enable_x64():
        params, client = _tiny_problem(epochs=3)
        lr = 0.3
        grad, _, _ = make_uga_gradient(_tiny_loss, optax.sgd(lr), first_order=True)(params, client)
        trained, _ = make_local_trainer(_tiny_loss, optax.sgd(lr))(
            params, client["batches"], client["mask"], client["key"]
        )
        em = client["eval_mask"]
        x, y = client["eval_batches"]["x"][em], client["eval_batches"]["y"][em]
        want = jax.grad(lambda p: jnp.mean(_tiny_loss(p, {"x": x, "y": y})))(trained)
        np.testing.assert_allclose(_flat(grad), _flat(want), rtol=1e-10)
        exact = make_uga_gradient(_tiny_loss, optax.sgd(lr))(params, client)[0]
        # the Hessian terms are really dropped
        assert np.max(np.abs(_flat(exact) - _flat(grad))) > 1e-4


def _uga_cohort(sizes, epochs=2, seed=0):
    data = random_client_data(np.random.default_rng(seed), sizes)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    offsets = np.cumsum([0, *sizes])
    return pack_uga_cohort(
        x,
        y,
        [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))],
        4,
        epochs,
        np.random.default_rng(seed),
    )


def test_uga_server_step_is_the_example_weighted_mean_gradient_and_strategies_agree():
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    sizes = [5, 11, 3, 8]
    cohort = _uga_cohort(sizes)
    eta_g = 0.7
    results = {}
    for strategy, chunk in (("vmap", None), ("chunked", 3), ("sequential", None), ("loop", None)):
        algo = FederatedRound(
            UGA(model.per_example_loss, optax.sgd(0.1), server_optimizer=optax.sgd(eta_g)),
            strategy=strategy,
            chunk_size=chunk,
        )
        state, metrics = algo.round(algo.init(params), cohort, jax.random.key(1))
        results[strategy] = _flat(state.params)
    grad_fn = make_uga_gradient(model.per_example_loss, optax.sgd(0.1))
    from fedjax_dp.core.round import client_inputs

    inputs = client_inputs(cohort, jax.random.key(1))
    grads = [
        grad_fn(params, jax.tree_util.tree_map(lambda a: a[k], inputs))[0]
        for k in range(len(sizes))
    ]
    mean = sum(n * _flat(g) for n, g in zip(sizes, grads)) / sum(sizes)
    want = _flat(params) - eta_g * mean
    for strategy, got in results.items():
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=strategy)


def test_uga_bad_input():
    with pytest.raises(ValueError, match="E >= 1"):
        pack_uga_cohort(
            np.zeros((4, 2)), np.zeros(4), [np.arange(4)], 2, 0, np.random.default_rng(0)
        )
    params, client = _tiny_problem(dtype=np.float32)
    del client["eval_batches"]
    with pytest.raises(ValueError, match="eval_batches"):
        make_uga_gradient(_tiny_loss, optax.sgd(0.1))(params, client)
    params, client = _tiny_problem(dtype=np.float32)
    not_per_example = lambda p, b, k=None: jnp.stack([_tiny_loss(p, b)] * 2, axis=-1)  # noqa: E731
    with pytest.raises(ValueError, match="one scalar loss per example"):
        make_uga_gradient(not_per_example, optax.sgd(0.1))(params, client)


def test_dp_uga_without_noise_or_clipping_is_uga_and_clips_the_meta_gradient():
    from fedjax_dp.core.uploads import fixed_denominator
    from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise

    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    sizes = [5, 11, 3]
    cohort = _uga_cohort(sizes)
    algorithm = UGA(model.per_example_loss, optax.sgd(0.1), server_optimizer=optax.sgd(0.5))
    uga = FederatedRound(algorithm)

    def dp(clip_norm):  # DP-UGA: UGA + DP-FedAvg's chain (algorithms.dp_uga)
        return FederatedRound(
            algorithm, [FlatClip(clip_norm), GaussianNoise(((1, 0.0),)), fixed_denominator(3)]
        )

    # DP averages uniformly over D = 3 clients; UGA weights by n_k: equal weights make them
    # comparable
    equal = {**cohort, "num_examples": np.full(3, 7, np.int32)}
    want = _flat(uga.round(uga.init(params), equal, jax.random.key(1))[0].params)
    algo = dp(1e6)
    got = _flat(algo.round(algo.init(params), equal, jax.random.key(1))[0].params)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    algo = dp(1e-3)
    state, metrics = algo.round(algo.init(params), equal, jax.random.key(1))
    assert float(metrics["clipped_fraction"]) == 1.0
    assert np.linalg.norm(_flat(state.params) - _flat(params)) <= 0.5 * 1e-3 + 1e-7
