"""FedMeta's server meta step, FedProx's proximal term, FedShare's shared data, and their runs."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.algorithms.fedmeta import FedMeta, meta_batches
from fedjax_dp.algorithms.fedprox import FedProx, proximal_term
from fedjax_dp.data.shared_set import share_with_clients
from fedjax_dp.algorithms.uga import UGA
from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.data.packing import pack_cohort, pack_uga_cohort
from fedjax_dp.data.server_sets import ServerSet
from fedjax_dp.models import get_model
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

from conftest import random_client_data


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def _data(sizes, seed=0):
    data = random_client_data(np.random.default_rng(seed), sizes)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    offsets = np.cumsum([0, *sizes])
    return x, y, [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))]


def test_fedmeta_meta_step_is_exactly_one_sgd_step_on_d_meta():
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    x, y, idx = _data([6, 9])
    cohort = pack_cohort(x, y, idx, 4, 1, np.random.default_rng(0))
    meta_x, meta_y = random_client_data(np.random.default_rng(5), [13])[0]
    base = FedAvg(model.per_example_loss, optax.sgd(0.1))
    eta = 0.05
    meta = FederatedRound(
        FedMeta(
            base, model.per_example_loss, meta_x, meta_y, meta_learning_rate=eta, meta_batch_size=4
        )
    )  # 4 batches
    base = FederatedRound(base)
    state, metrics = meta.round(meta.init(params), cohort, jax.random.key(1))
    after_base, _ = base.round(base.init(params), cohort, jax.random.key(1))
    d_meta = {"x": jnp.asarray(meta_x), "y": jnp.asarray(meta_y)}
    loss = lambda p: jnp.mean(model.per_example_loss(p, d_meta))  # noqa: E731
    want = jax.tree_util.tree_map(
        lambda w, g: w - eta * g, after_base.params, jax.grad(loss)(after_base.params)
    )
    np.testing.assert_allclose(_flat(state.params), _flat(want), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        float(metrics["meta_loss"]), float(loss(after_base.params)), rtol=1e-5
    )
    assert int(state.round) == 1 and not bool(metrics["meta_step_skipped"])


def test_fedmeta_composes_with_uga_and_decays_its_rate():
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    x, y, idx = _data([6, 9])
    cohort = pack_uga_cohort(x, y, idx, 4, 2, np.random.default_rng(0))
    meta_x, meta_y = random_client_data(np.random.default_rng(5), [7])[0]
    base = UGA(model.per_example_loss, optax.sgd(0.1), server_optimizer=optax.sgd(0.5))
    meta = FederatedRound(
        FedMeta(
            base,
            model.per_example_loss,
            meta_x,
            meta_y,
            meta_learning_rate=0.05,
            meta_steps=2,
            meta_lr_decay=0.5,
        )
    )
    base = FederatedRound(base)
    assert meta.algorithm.requirements.evaluation_pass
    state = meta.init(params)
    state, _ = meta.round(state, cohort, jax.random.key(1))
    # round 2 by hand: base, then 2 steps at 0.025
    base_state, _ = base.round(state, cohort, jax.random.key(2))
    state, _ = meta.round(state, cohort, jax.random.key(2))
    d_meta = {"x": jnp.asarray(meta_x), "y": jnp.asarray(meta_y)}
    grad = jax.grad(lambda p: jnp.mean(model.per_example_loss(p, d_meta)))
    p = base_state.params
    for _ in range(2):
        p = jax.tree_util.tree_map(lambda w, g: w - 0.025 * g, p, grad(p))
    np.testing.assert_allclose(_flat(state.params), _flat(p), rtol=1e-5, atol=1e-7)


def test_fedmeta_bad_input():
    model = get_model("logistic", (4, 4, 1), 3)
    base = FedAvg(model.per_example_loss, optax.sgd(0.1))
    with pytest.raises(ValueError, match="D_meta is empty"):
        FedMeta(
            base,
            model.per_example_loss,
            np.zeros((0, 4, 4, 1)),
            np.zeros(0),
            meta_learning_rate=0.1,
        )
    meta_x, meta_y = random_client_data(np.random.default_rng(5), [3])[0]
    for lr in (0.0, -1.0):
        with pytest.raises(ValueError, match="eta_meta must be > 0"):
            FedMeta(base, model.per_example_loss, meta_x, meta_y, meta_learning_rate=lr)
    with pytest.raises(ValueError, match="meta_steps"):
        FedMeta(base, model.per_example_loss, meta_x, meta_y, meta_learning_rate=0.1, meta_steps=0)
    batches, mask = meta_batches(meta_x, meta_y, 2)
    assert mask.tolist() == [[True, True], [True, False]] and batches["x"].shape[:2] == (2, 2)


def test_fedprox_with_mu_zero_is_fedavg_and_mu_pulls_towards_the_global_model():
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    x, y, idx = _data([6, 9, 4])
    cohort = pack_cohort(x, y, idx, 4, 3, np.random.default_rng(0))
    run = lambda algo: (
        FederatedRound(algo)
        .round(FederatedRound(algo).init(params), cohort, jax.random.key(1))[0]
        .params
    )  # noqa: E731
    fedavg = _flat(run(FedAvg(model.per_example_loss, optax.sgd(0.3))))
    np.testing.assert_array_equal(
        _flat(run(FedProx(model.per_example_loss, optax.sgd(0.3), mu=0.0))), fedavg
    )
    prox = _flat(run(FedProx(model.per_example_loss, optax.sgd(0.3), mu=1.0)))
    assert np.linalg.norm(prox - _flat(params)) < np.linalg.norm(fedavg - _flat(params))
    reg = proximal_term(0.5)
    shifted = jax.tree_util.tree_map(lambda w: w + 1.0, params)
    np.testing.assert_allclose(float(reg(shifted, params)), 0.25 * _flat(params).size, rtol=1e-6)
    grad = jax.grad(reg)(params, params)  # no NaN where w = w_t (a norm's sqrt would give one)
    assert np.all(_flat(grad) == 0)
    with pytest.raises(ValueError, match="mu must be >= 0"):
        FedProx(model.per_example_loss, optax.sgd(0.3), mu=-1.0)


def test_fedshare_mixes_the_shared_set_into_every_clients_training_data():
    x, y, idx = _data([5, 7])
    ds = FederatedDataset(x, y, tuple(idx), (np.zeros(0, np.int64),) * 2, np.arange(3), 3)
    shared = ServerSet(*random_client_data(np.random.default_rng(9), [4])[0])
    out = share_with_clients(ds, shared)
    assert out.train_sizes().tolist() == [9, 11] and len(out.y) == len(y) + 4
    for k in range(2):
        np.testing.assert_array_equal(out.x[out.client_train[k][-4:]], shared.x)
        np.testing.assert_array_equal(out.client_train[k][: len(idx[k])], idx[k])
    np.testing.assert_array_equal(out.central_test, ds.central_test)
    with pytest.raises(ValueError, match="shared set is empty"):
        share_with_clients(ds, ServerSet(x[:0], y[:0]))


def _small_config(algorithm, **changes):
    c = default_config()
    c.rounds, c.eval_every, c.algorithm = 3, 3, algorithm
    c.data.num_clients = 20
    c.client.update(epochs=2, batch_size=20, learning_rate=0.05, lr_decay=0.99)
    c.sampling.cohort_size = 4
    c.server_data.fraction = 0.02
    for key, value in changes.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


@pytest.mark.parametrize(
    "algorithm,changes",
    [
        (
            "uga",
            {"fedmeta.enabled": True, "fedmeta.learning_rate": 0.05, "server.learning_rate": 2.0},
        ),
        ("fedshare", {}),
        ("fedprox", {}),
        ("uga", {"uga.remat": "sqrt", "uga.first_order": True}),
        ("dp_uga", {"dp.noise_multiplier": 0.5, "fedmeta.enabled": True}),
    ],
)
def test_every_seed_002_method_runs_through_the_loop_and_records_epsilon(
    tmp_path, algorithm, changes
):
    summary = run_experiment(_small_config(algorithm, **changes), str(tmp_path), progress=False)
    assert summary.rounds == 3 and 0 <= summary.best_accuracy <= 1
    privacy = json.load(open(os.path.join(tmp_path, "privacy.json")))
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
    assert all(math.isfinite(r["train_loss"]) for r in rows if "train_loss" in r)
    # D_meta drawn IID from the clients' own data: no formal guarantee (issue 16)
    if algorithm == "dp_uga":
        assert 0 < privacy["epsilon"] < math.inf and privacy["formal"] is False
        assert any("D_meta" in note for note in privacy["notes"])
        assert any(
            "drawn IID from the training clients' own examples" in note for note in privacy["notes"]
        )
        assert all("meta_loss" in r for r in rows if "train_loss" in r)
    else:  # strict JSON: an unbounded epsilon is null, flagged
        assert privacy["epsilon"] is None and privacy["epsilon_unbounded"] is True


def test_uga_and_fedmeta_config_errors_are_collected():
    c = _small_config(
        "uga",
        **{
            "client.epochs": 0,
            "fedmeta.enabled": True,
            "fedmeta.learning_rate": -0.1,
            "server_data.fraction": 0.0,
            "uga.remat": "never",
            "uga.gradient_reduction": "sum",
        },
    )
    with pytest.raises(ValueError) as err:
        run_experiment(c, "/tmp/never-written", progress=False)
    text = str(err.value)
    assert (
        "client.epochs E must be >= 1, got 0" in text and "eta_meta must be > 0, got -0.1" in text
    )
    assert "server_data.fraction" in text and "uga.remat must be" in text
    assert "uga.gradient_reduction must be one of ('mean', 'sum_of_batch_means'), got 'sum'" in text


def test_a_regularised_objective_reports_its_data_term_beside_it(tmp_path):
    """FedProx's and SCAFFOLD's local objectives add a regulariser to the data loss (mu/2 ||w -
    w_t||^2, the correction <w - w_t, c - c_i>); each round reports the objective as ``train_loss``
    and the data term as ``train_data_loss``. FedAvg, with no regulariser, reports ``train_loss``
    only."""

    def rows(algorithm, **changes):
        run_experiment(
            _small_config(algorithm, **changes), str(tmp_path / algorithm), progress=False
        )
        return [
            json.loads(line)
            for line in open(tmp_path / algorithm / "metrics.jsonl")
            if "train_loss" in line
        ]

    fedavg, fedprox, scaffold = (
        rows("fedavg"),
        rows("fedprox", **{"fedprox.mu": 5.0}),
        rows("scaffold"),
    )
    assert len(fedavg) == len(fedprox) == len(scaffold) == 3
    assert not any("train_data_loss" in r for r in fedavg)
    for r in fedprox:  # the proximal term is >= 0 and > 0 once a step has moved w away from w_t
        assert 0 < r["train_data_loss"] < r["train_loss"]
    assert all(math.isfinite(r["train_data_loss"]) for r in scaffold)
