"""FedAvg: the weighted mean of client updates, NaN containment, and learning on real data."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.models import get_model
from fedjax_dp.training.evaluation import evaluate

from conftest import random_client_data


def _cohort(sizes, seed=0):
    data = random_client_data(np.random.default_rng(seed), sizes)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    offsets = np.cumsum([0, *sizes])
    return (
        x,
        y,
        pack_cohort(
            x,
            y,
            [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))],
            4,
            1,
            np.random.default_rng(seed),
        ),
    )


def test_round_is_example_weighted_mean_of_client_updates():
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    sizes = [3, 12, 7]
    _, _, cohort = _cohort(sizes)
    algo = FederatedRound(FedAvg(model.per_example_loss, optax.sgd(0.1)))
    state, metrics = algo.round(algo.init(params), cohort, jax.random.key(1))
    train = make_local_trainer(model.per_example_loss, optax.sgd(0.1))
    deltas = []
    for c in range(3):
        trained, _ = train(
            params,
            jax.tree_util.tree_map(lambda a: a[c], cohort["batches"]),
            cohort["mask"][c],
            jax.random.key(0),
        )
        deltas.append(jax.tree_util.tree_map(jnp.subtract, trained, params))
    want = jax.tree_util.tree_map(
        lambda p, *d: p + sum(n * x for n, x in zip(sizes, d)) / sum(sizes), params, *deltas
    )
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(state.round) == 1 and int(metrics["dropped_clients"]) == 0


def test_nan_client_is_dropped_and_counted():
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    _, _, cohort = _cohort([5, 5, 5])
    cohort["batches"]["x"] = cohort["batches"]["x"].copy()
    cohort["batches"]["x"][1, 0, 0, 0, 0, 0] = np.nan  # one client's data is poisoned
    algo = FederatedRound(FedAvg(model.per_example_loss, optax.sgd(0.1)))
    state, metrics = algo.round(algo.init(params), cohort, jax.random.key(1))
    assert int(metrics["dropped_clients"]) == 1
    assert all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree_util.tree_leaves(state.params))
    clean = {
        **cohort,
        "batches": jax.tree_util.tree_map(lambda a: a[[0, 2]], cohort["batches"]),
        "mask": cohort["mask"][[0, 2]],
        "num_examples": cohort["num_examples"][[0, 2]],
    }
    want, _ = algo.round(algo.init(params), clean, jax.random.key(1))
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fedavg_learns_embedded_mnist():
    from ml_collections import ConfigDict
    from fedjax_dp.data.builders import build_dataset

    ds = build_dataset(
        ConfigDict(dict(source="mnist_5k", partition="iid", num_clients=20, test_fraction=0.2)),
        seed=0,
    )
    model = get_model("logistic")
    algo = FederatedRound(
        FedAvg(model.per_example_loss, optax.sgd(0.1)), strategy="chunked", chunk_size=5
    )
    state = algo.init(model.init(jax.random.key(0)))
    before = evaluate(model, state.params, ds)["test_accuracy"]
    rng = np.random.default_rng(0)
    for t in range(5):
        ids = rng.choice(20, 5, replace=False)
        cohort = pack_cohort(ds.x, ds.y, [ds.client_train[i] for i in ids], 10, 1, rng)
        state, _ = algo.round(state, cohort, jax.random.key(t))
    after = evaluate(model, state.params, ds)["test_accuracy"]
    assert before < 0.3 and after > 0.75, (before, after)


def test_final_model_is_evaluated_once_and_its_per_client_accuracies_are_written(
    tmp_path, monkeypatch
):
    """The final evaluation's per-client accuracies are what ``client_accuracies.json`` holds: the
    final model's examples pass through the model once (it was twice: the last evaluation, then
    again for the per-client file)."""
    from fedjax_dp import configs
    from fedjax_dp.training import evaluation
    from fedjax_dp.training.loop import run_experiment

    passes = []
    real = evaluation.per_example_stats
    monkeypatch.setattr(
        evaluation, "per_example_stats", lambda *a, **k: passes.append(1) or real(*a, **k)
    )
    cfg = configs.get("fedavg_mnist")
    cfg.update(rounds=2, eval_every=2, eval_initial=False)
    cfg.model.name, cfg.sampling.cohort_size = "logistic", 4
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert len(passes) == 1
    written = json.load(open(tmp_path / "run" / "client_accuracies.json"))
    logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")][-1]
    assert written["round"] == 2 and len(written["accuracy"]) == len(written["client_ids"]) > 0
    np.testing.assert_allclose(np.mean(written["accuracy"]), logged["client_accuracy"], rtol=1e-6)


def test_a_run_compiles_its_round_and_evaluation_programs_once(tmp_path, caplog):
    """Round 2 reuses round 1's programs: the initial server state is committed to its device like
    every later state, so the cohort program, the server step and the evaluation are not compiled a
    second time for the committed inputs (each was: 2 x 2.4 s + 2 x 2 s of a 21 s three-round DP run
    on a 2-core CPU)."""
    import collections
    import re

    from fedjax_dp import configs
    from fedjax_dp.training.loop import run_experiment

    cfg = configs.get("dp_fedavg_mnist")
    cfg.update(rounds=2, eval_every=1)
    cfg.data.num_clients, cfg.sampling.rate = 50, 0.2
    cfg.privacy.target_epsilon, cfg.dp.noise_multiplier = 0.0, 1.0
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        run_experiment(cfg, str(tmp_path / "run"), progress=False)
    compiled = collections.Counter(
        m.group(1)
        for r in caplog.records
        for m in [re.match(r"Compiling jit\((\w+)\)", r.getMessage())]
        if m
    )
    programs = {
        name: compiled[name] for name in ("trace", "server_fn", "_batch_stats", "init_params")
    }
    # the round's programs are the run's own; the evaluation and the initialisation are module-wide
    # jits that an
    # earlier test in this process may have compiled already (then 0)
    assert programs["trace"] == programs["server_fn"] == 1, programs
    assert programs["_batch_stats"] <= 1 and programs["init_params"] <= 1, programs


def test_evaluation_runs_an_im2col_model_with_xla_convolutions_and_the_same_numbers(monkeypatch):
    """Training on a CPU picks im2col convolutions (``core.strategy``); the forward-only evaluation
    must not: im2col's patches made the FedAvg CNN's pass over 10,000 MNIST test images 9x slower
    (7.9 s against 0.87 s on the 2-core VM, ``benchmarks/evaluation_pass.py``), 16 s of every
    evaluation of a seed-003 run. The same function."""
    from fedjax_dp.training import evaluation

    model = get_model("cnn_fedavg", (28, 28, 1), 10, conv_impl="im2col")
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    x, y = rng.random((37, 28, 28, 1), np.float32), rng.integers(0, 10, 37).astype(np.int32)
    impls, real = [], evaluation._batch_stats
    monkeypatch.setattr(
        evaluation, "_batch_stats", lambda m, *a: impls.append(m.module.conv_impl) or real(m, *a)
    )
    losses, correct = evaluation.per_example_stats(model, params, x, y, batch_size=16)
    assert impls == ["xla"] * 3
    batch = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
    np.testing.assert_allclose(losses, model.per_example_loss(params, batch), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(correct, model.per_example_correct(params, batch))
