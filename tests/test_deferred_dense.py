"""Deferred dense kernels in plain-SGD local training (core/deferred_dense.py): the same client as
``make_local_trainer`` with ``optax.sgd``, up to float rounding."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.algorithms.fedprox import FedProx
from fedjax_dp.algorithms.registry import BuildContext
from fedjax_dp.core import deferred_dense
from fedjax_dp.core.deferred_dense import deferrable_kernels, make_deferred_dense_sgd_trainer
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.models import get_model
from fedjax_dp.training.default_config import default_config

LR = 0.05


def _client(steps=6, batch=10, real_steps=None, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, batch, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, 10, size=(steps, batch))
    mask = np.ones((steps, batch), bool)
    # a small client: its last batch partial, the steps after it all padding
    if real_steps is not None:
        mask[real_steps - 1, batch // 2 :] = False
        mask[real_steps:] = False
    return {"x": jnp.asarray(x), "y": jnp.asarray(y)}, jnp.asarray(mask)


def test_cnn_defers_its_large_dense_kernel_only_while_the_history_is_short():
    model = get_model("cnn_fedavg", conv_impl="xla")
    params = model.init(jax.random.key(0))
    batches, _ = _client()
    chosen = deferrable_kernels(model.per_example_loss, params, batches, jax.random.key(1))
    assert chosen == {("Dense_0", "kernel"): 10}  # 3136 x 512; not the 512 x 10 output layer
    long_batches, _ = _client(steps=20)  # 200 rows of history > 512 / 4
    assert deferrable_kernels(model.per_example_loss, params, long_batches, jax.random.key(1)) == {}


def test_a_dense_layer_called_twice_is_not_deferred():
    class Twice(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = nn.Dense(64)
            return nn.Dense(3)(dense(nn.relu(dense(x.reshape(x.shape[0], -1)[:, :64]))))

    module = Twice()
    params = module.init(jax.random.key(0), jnp.ones((1, 28, 28, 1)))
    loss = lambda p, batch, key: optax.softmax_cross_entropy_with_integer_labels(  # noqa: E731
        module.apply(p, batch["x"]), batch["y"] % 3
    )
    batches, _ = _client(steps=1, batch=2)
    assert deferrable_kernels(loss, params, batches, jax.random.key(1)) == {}


@pytest.mark.parametrize("real_steps", [None, 4])
def test_equals_the_plain_sgd_trainer(real_steps):
    model = get_model("cnn_fedavg", conv_impl="xla")
    params = model.init(jax.random.key(0))
    batches, mask = _client(real_steps=real_steps)
    key = jax.random.key(3)
    deferred = deferrable_kernels(model.per_example_loss, params, batches, key)
    assert deferred
    plain = jax.jit(make_local_trainer(model.per_example_loss, optax.sgd(LR), unroll=True))
    fast = jax.jit(
        make_deferred_dense_sgd_trainer(model.per_example_loss, LR, deferred, unroll=True)
    )
    want, want_stats = plain(params, batches, mask, key, 0.7)
    got, got_stats = fast(params, batches, mask, key, 0.7)
    for (path, w), g in zip(
        jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves(got)
    ):
        change = np.asarray(w) - np.asarray(params_leaf(params, path))
        np.testing.assert_allclose(
            np.asarray(g) - np.asarray(params_leaf(params, path)),
            change,
            rtol=1e-4,
            atol=1e-5 * np.abs(change).max(),
            err_msg=str(path),
        )
        assert np.abs(change).max() > 0, path  # every layer trained
    np.testing.assert_allclose(got_stats.loss, want_stats.loss, rtol=1e-5)
    assert int(got_stats.num_examples) == int(want_stats.num_examples)
    assert int(got_stats.num_steps) == int(want_stats.num_steps) == (real_steps or 6)


def params_leaf(params, path):
    leaf = params
    for entry in path:
        leaf = leaf[entry.key]
    return leaf


def test_all_padding_client_is_unchanged_and_bad_rate_is_named():
    model = get_model("cnn_fedavg", conv_impl="xla")
    params = model.init(jax.random.key(0))
    batches, mask = _client()
    deferred = deferrable_kernels(model.per_example_loss, params, batches, jax.random.key(0))
    train = make_deferred_dense_sgd_trainer(model.per_example_loss, LR, deferred, unroll=True)
    trained, stats = jax.jit(train)(params, batches, jnp.zeros_like(mask), jax.random.key(0))
    jax.tree_util.tree_map(np.testing.assert_array_equal, trained, params)
    assert int(stats.num_steps) == 0
    with pytest.raises(ValueError, match="learning rate must be > 0, got 0"):
        make_deferred_dense_sgd_trainer(model.per_example_loss, 0.0, deferred)


def test_fedavg_defers_for_plain_sgd_only_and_uploads_the_same_delta():
    model = get_model("cnn_fedavg", conv_impl="xla")
    params = model.init(jax.random.key(0))
    batches, mask = _client(real_steps=5)
    client = {
        "batches": batches,
        "mask": mask,
        "key": jax.random.key(2),
        "num_examples": jnp.sum(mask),
    }
    fast = FedAvg(model.per_example_loss, optax.sgd(LR), unroll=True, deferred_dense_rate=LR)
    plain = FedAvg(model.per_example_loss, optax.sgd(LR), unroll=True)
    prox = FedProx(
        model.per_example_loss, optax.sgd(LR), unroll=True, deferred_dense_rate=LR, mu=0.1
    )
    assert "deferred" in fast.local_trainer(params, client).__qualname__
    assert "deferred" not in plain.local_trainer(params, client).__qualname__
    # a full-rank proximal gradient
    assert "deferred" not in prox.local_trainer(params, client).__qualname__
    shared = (params, jnp.asarray(3))
    got = jax.jit(fast.client_update)(shared, client, None, jax.random.key(0))
    want = jax.jit(plain.client_update)(shared, client, None, jax.random.key(0))
    for g, w in zip(jax.tree_util.tree_leaves(got.upload), jax.tree_util.tree_leaves(want.upload)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(np.asarray(w)).max())
    assert bool(got.ok)


@pytest.mark.parametrize(
    "client, mode, want",
    [
        ({}, "auto", LR),
        ({"momentum": 0.9}, "auto", None),
        ({"weight_decay": 1e-3}, "auto", None),
        ({"grad_clip_norm": 10.0}, "auto", None),
        ({"optimizer": "adam"}, "auto", None),
        ({}, "off", None),
        ({}, "on", LR),
        ({"momentum": 0.9}, "on", None),
    ],
)
def test_the_config_enables_it_for_plain_sgd_clients(client, mode, want):
    cfg = default_config()
    cfg.client.update(learning_rate=LR, **client)
    cfg.engine.deferred_dense = mode
    # auto: this CPU backend
    assert BuildContext(cfg, model=None, num_clients=1).deferred_dense_rate() == want


@pytest.mark.parametrize("backend, want", [("cpu", True), ("gpu", True), ("tpu", False)])
def test_auto_is_on_for_the_backends_it_was_measured_on(monkeypatch, backend, want):
    monkeypatch.setattr(deferred_dense.jax, "default_backend", lambda: backend)
    assert deferred_dense.on_by_default() is want


def test_deferred_clients_vmap_like_one_at_a_time():
    """The vmapped engines (vmap, chunked, the mesh) trace one client with batched values."""
    model = get_model("cnn_fedavg", conv_impl="im2col")
    params = model.init(jax.random.key(0))
    clients = [_client(steps=3, batch=4, real_steps=r, seed=r) for r in (3, 2)]
    batch = lambda i: {
        "batches": clients[i][0],
        "mask": clients[i][1],
        "key": jax.random.key(i),  # noqa: E731
        "num_examples": jnp.sum(clients[i][1]),
    }
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), batch(0), batch(1))
    fast = FedAvg(model.per_example_loss, optax.sgd(LR), unroll=True, deferred_dense_rate=LR)
    update = lambda c: (
        fast.client_update((params, jnp.asarray(0)), c, None, jax.random.key(0)).upload
    )  # noqa: E731
    together = jax.jit(jax.vmap(update))(stacked)
    for i in range(2):
        alone = jax.jit(update)(batch(i))
        for t, a in zip(jax.tree_util.tree_leaves(together), jax.tree_util.tree_leaves(alone)):
            np.testing.assert_allclose(
                t[i], a, rtol=1e-4, atol=1e-5 * float(np.abs(np.asarray(a)).max())
            )
