"""A client that raises is contained: dropped, counted, and the round goes on with the others, in
the per-client loop and when a vmapped cohort program fails at run time; a fault of every client is
the program's and is raised."""

import logging

import jax
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.models import get_model

from conftest import random_client_data

CORRUPT = 999.0


def _refuse_corrupt(x):
    if np.any(np.asarray(x) == CORRUPT):
        raise RuntimeError("corrupt client data")


def _faulty_loss(model):
    """The model's loss, plus a host check that raises at run time on a corrupt example (what a
    broken data pipeline or a failing device call looks like from inside a jitted client)."""

    def loss(params, batch, key=None):
        jax.debug.callback(_refuse_corrupt, batch["x"])
        return model.per_example_loss(params, batch, key)

    return loss


def _cohort(corrupt_positions, num_clients=4):
    rng = np.random.default_rng(0)
    data = random_client_data(rng, [6] * num_clients)
    for k in corrupt_positions:
        data[k][0][0, 0, 0, 0] = CORRUPT
    x = np.concatenate([d[0] for d in data])
    y = np.concatenate([d[1] for d in data])
    indices = [np.arange(6 * k, 6 * k + 6) for k in range(num_clients)]
    return x, y, indices


@pytest.mark.parametrize(
    "strategy, stream",
    [("loop", None), ("vmap", None), ("sequential", None), ("vmap", 3), ("sequential", 2)],
)
def test_a_raising_client_is_dropped_and_the_others_aggregate(strategy, stream, caplog):
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    x, y, indices = _cohort([2])
    cohort = pack_cohort(x, y, indices, 3, 1, np.random.default_rng(1))
    algorithm = FederatedRound(
        FedAvg(_faulty_loss(model), optax.sgd(0.1)), strategy=strategy, stream_size=stream
    )
    with caplog.at_level(logging.WARNING):
        result = algorithm(algorithm.init(params), cohort, jax.random.key(0))
    state, metrics = result.state, result.metrics
    np.testing.assert_array_equal(result.dropped, [False, False, True, False])
    assert int(metrics["dropped_clients"]) == 1
    assert "cohort position 2 raised" in caplog.text
    # the same as FedAvg over the three healthy clients (their keys kept: same cohort positions)
    healthy = FederatedRound(FedAvg(model.per_example_loss, optax.sgd(0.1)), strategy="loop")
    weights = cohort["num_examples"].copy()
    cohort_without = {**cohort, "mask": cohort["mask"].copy(), "num_examples": weights}
    cohort_without["mask"][2] = False
    cohort_without["num_examples"][2] = 0
    want, _ = healthy.round(healthy.init(params), cohort_without, jax.random.key(0))
    for got, expected in zip(
        jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want.params)
    ):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_a_streamed_slice_whose_clients_all_raise_is_dropped_not_raised(caplog):
    """Streaming in slices of 2: clients 2 and 3 (the whole second slice) raise; the round goes on
    with 0 and 1 (as unstreamed), positions logged in the cohort's numbering."""
    model = get_model("logistic", (4, 4, 1), 3)
    x, y, indices = _cohort([2, 3])
    cohort = pack_cohort(x, y, indices, 3, 1, np.random.default_rng(1))
    params = model.init(jax.random.key(0))
    results = []
    for stream in (None, 2):
        caplog.clear()
        algorithm = FederatedRound(
            FedAvg(_faulty_loss(model), optax.sgd(0.1)), strategy="vmap", stream_size=stream
        )
        with caplog.at_level(logging.WARNING):
            results.append(algorithm(algorithm.init(params), cohort, jax.random.key(0)))
        np.testing.assert_array_equal(results[-1].dropped, [False, False, True, True])
    # the streamed run's log: the second slice's clients by their cohort positions, not their slice
    # positions
    assert "cohort position 2 raised" in caplog.text and "cohort position 3 raised" in caplog.text
    assert "cohort position 0 raised" not in caplog.text
    unstreamed, streamed = (jax.tree_util.tree_leaves(r.state.params) for r in results)
    for a, b in zip(unstreamed, streamed):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("stream", [None, 2])
def test_when_every_client_raises_the_error_is_the_programs_and_is_raised(stream):
    model = get_model("logistic", (4, 4, 1), 3)
    x, y, indices = _cohort([0, 1, 2, 3])
    cohort = pack_cohort(x, y, indices, 3, 1, np.random.default_rng(1))
    algorithm = FederatedRound(
        FedAvg(_faulty_loss(model), optax.sgd(0.1)),
        strategy="vmap" if stream else "loop",
        stream_size=stream,
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match="corrupt client data"):
        algorithm.round(algorithm.init(model.init(jax.random.key(0))), cohort, jax.random.key(0))


@pytest.mark.parametrize("local", [False, True])
def test_a_raising_client_under_dp_is_counted_as_dropped(local):
    """The contained client's outputs had ``present`` zeroed, so a DP round
    reported 0 dropped and the loop never named it."""
    from fedjax_dp.core.uploads import chain, fixed_denominator
    from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise

    model = get_model("logistic", (4, 4, 1), 3)
    x, y, indices = _cohort([1])
    cohort = pack_cohort(x, y, indices, 3, 1, np.random.default_rng(1))
    uploads = chain(FlatClip(1.0), GaussianNoise(local=local), fixed_denominator(4))
    algorithm = FederatedRound(
        FedAvg(_faulty_loss(model), optax.sgd(0.1)), uploads, strategy="loop"
    )
    result = algorithm(algorithm.init(model.init(jax.random.key(0))), cohort, jax.random.key(0))
    np.testing.assert_array_equal(result.dropped, [False, True, False, False])
    assert int(result.metrics["dropped_clients"]) == 1


@pytest.mark.parametrize("local", [False, True])
def test_a_raising_client_under_local_noise_sends_noise_not_zeros(local):
    """The contained client's message was exact zeros; under local noise it must
    be what a client with a zero update sends (noise), and it still stays out of the sum."""
    from fedjax_dp.core.round import client_inputs
    from fedjax_dp.core.uploads import chain, fixed_denominator
    from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise

    model = get_model("logistic", (4, 4, 1), 3)
    x, y, indices = _cohort([1])
    cohort = pack_cohort(x, y, indices, 3, 1, np.random.default_rng(1))
    uploads = chain(FlatClip(1.0), GaussianNoise(local=local), fixed_denominator(4))
    algorithm = FederatedRound(
        FedAvg(_faulty_loss(model), optax.sgd(0.1)), uploads, strategy="loop"
    )
    state = algorithm.init(model.init(jax.random.key(0)))
    engine, _ = algorithm._program(uploads)
    shared = (algorithm.algorithm.broadcast(state), state.uploads, uploads.inputs(1))
    summed, per_client = engine(shared, client_inputs(cohort, jax.random.key(0)))
    norms = np.asarray(per_client["update_norm"])
    assert not bool(per_client["kept"][1]) and float(summed["weight"]) == 3.0
    if local:
        assert norms[1] > 1.0  # N(0, 1) on every coordinate of a 51-parameter model: norm about 7
    else:
        assert norms[1] == 0.0
