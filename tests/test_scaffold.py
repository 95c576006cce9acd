"""SCAFFOLD (Karimireddy et al. 2020, Alg. 1 option II): its update against a hand-written
reference, drift correction on a heterogeneous problem, per-client control variates through the
loop's checkpoints, and bad input."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.algorithms.scaffold import Scaffold
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.training.checkpointing import Checkpointer
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

from conftest import sigint_at_round
from test_checkpoint_resume import _files


def _quadratic_loss(params, batch, key=None):
    """Client i's examples (a, b): f(w) = mean a (w - b)^2 / 2, minimised at a-weighted mean of
    b."""
    a, b = batch["x"][:, 0], batch["x"][:, 1]
    return 0.5 * a * jnp.sum(jnp.square(params["w"][None, :] - b[:, None]), axis=1)


def _heterogeneous_clients(num_clients=4, per_client=8, seed=0):
    rng = np.random.default_rng(seed)
    a = np.repeat(rng.uniform(0.2, 3.0, num_clients), per_client)  # curvature differs by client
    b = np.repeat(rng.normal(0, 3.0, num_clients), per_client) + rng.normal(
        0, 0.1, num_clients * per_client
    )
    x = np.stack([a, b], axis=1).astype(np.float32)
    indices = [np.arange(k * per_client, (k + 1) * per_client) for k in range(num_clients)]
    return x, np.zeros(len(x), np.int32), indices


def _run_rounds(algorithm, x, y, indices, rounds, batch_size=4, epochs=3, store=None, uploads=()):
    params = {"w": jnp.zeros(2)}
    runner = FederatedRound(algorithm, uploads)
    state = runner.init(params)
    for t in range(rounds):
        cohort = pack_cohort(x, y, indices, batch_size, epochs, np.random.default_rng(t))
        states = store.gather(range(len(indices))) if store is not None else None
        result = runner(state, cohort, jax.random.key(t), client_states=states)
        state = result.state
        if store is not None:
            store.scatter(range(len(indices)), result.client_states, ~result.dropped)
    return state


def _reference(x, indices, rounds, lr, batch_size=4, epochs=3):
    """Alg. 1 option II in plain numpy, full participation, server rate 1, same batches as
    pack_cohort."""
    w, c = np.zeros(2), np.zeros(2)
    ci = [np.zeros(2) for _ in indices]
    for t in range(rounds):
        cohort = pack_cohort(
            x, np.zeros(len(x), np.int32), indices, batch_size, epochs, np.random.default_rng(t)
        )
        deltas, control_deltas = [], []
        for k in range(len(indices)):
            y = w.copy()
            steps = 0
            for batch, mask in zip(cohort["batches"]["x"][k], cohort["mask"][k]):
                if not mask.any():
                    continue
                a, b = batch[mask, 0], batch[mask, 1]
                grad = np.mean(a[:, None] * (y[None, :] - b[:, None]), axis=0)
                y = y - lr * (grad - ci[k] + c)
                steps += 1
            new_ci = ci[k] - c + (w - y) / (steps * lr)
            deltas.append(y - w)
            control_deltas.append(new_ci - ci[k])
            ci[k] = new_ci
        w = w + np.mean(deltas, axis=0)
        c = c + np.sum(control_deltas, axis=0) / len(indices)
    return w, c, ci


def test_scaffold_matches_a_hand_written_reference_of_algorithm_1():
    x, y, indices = _heterogeneous_clients()
    lr = 0.1
    scaffold = Scaffold(
        _quadratic_loss, optax.sgd(lr), local_learning_rate=lr, num_clients=len(indices)
    )
    store = ClientStateStore(scaffold.client_state_init({"w": jnp.zeros(2)}))
    state = _run_rounds(scaffold, x, y, indices, rounds=3, store=store)
    w, c, ci = _reference(x, indices, 3, lr)
    np.testing.assert_allclose(state.params["w"], w, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(state.extra["w"], c, rtol=2e-5, atol=1e-6)
    for k in range(len(indices)):
        np.testing.assert_allclose(store.get(k)["w"], ci[k], rtol=2e-5, atol=1e-5)


def test_scaffold_in_float64_matches_the_reference_to_float64_precision():
    """Under float64 the control step c_i+ = c_i - c + (x - y) / (K eta_l) is computed in the
    parameters'
    dtype: K eta_l in float32 (eta_l = 0.1 rounds to 0.10000000149) put it 6e-7 off a float64
    transcription."""
    with jax.enable_x64(True):
        x, y, indices = _heterogeneous_clients()
        x = x.astype(np.float64)
        lr = 0.1
        scaffold = Scaffold(
            _quadratic_loss, optax.sgd(lr), local_learning_rate=lr, num_clients=len(indices)
        )
        params = {"w": jnp.zeros(2, jnp.float64)}
        store = ClientStateStore(scaffold.client_state_init(params))
        runner = FederatedRound(scaffold, ())
        state = runner.init(params)
        for t in range(3):
            cohort = pack_cohort(x, y, indices, 4, 3, np.random.default_rng(t))
            result = runner(
                state, cohort, jax.random.key(t), client_states=store.gather(range(len(indices)))
            )
            state = result.state
            store.scatter(range(len(indices)), result.client_states, ~result.dropped)
        w, c, ci = _reference(x, indices, 3, lr)
        assert state.params["w"].dtype == jnp.float64
        np.testing.assert_allclose(state.params["w"], w, rtol=1e-12)
        np.testing.assert_allclose(state.extra["w"], c, rtol=1e-11)
        for k in range(len(indices)):
            np.testing.assert_allclose(store.get(k)["w"], ci[k], rtol=1e-11)


def test_first_round_with_zero_controls_is_fedavg_on_equal_clients():
    x, y, indices = _heterogeneous_clients()
    scaffold = Scaffold(_quadratic_loss, optax.sgd(0.1), local_learning_rate=0.1, num_clients=4)
    store = ClientStateStore(scaffold.client_state_init({"w": jnp.zeros(2)}))
    one = _run_rounds(scaffold, x, y, indices, rounds=1, store=store)
    fedavg = _run_rounds(FedAvg(_quadratic_loss, optax.sgd(0.1)), x, y, indices, rounds=1)
    np.testing.assert_allclose(one.params["w"], fedavg.params["w"], rtol=1e-6)


def test_scaffold_removes_client_drift_that_biases_fedavg():
    """Many local steps on clients of different curvature: FedAvg settles away from the optimum of
    the global objective; SCAFFOLD's corrected steps converge to it."""
    x, y, indices = _heterogeneous_clients()
    a, b = x[:, 0], x[:, 1]
    optimum = np.sum(a * b) / np.sum(a)
    lr, rounds = 0.2, 60
    fedavg = _run_rounds(FedAvg(_quadratic_loss, optax.sgd(lr)), x, y, indices, rounds, epochs=10)
    scaffold = Scaffold(_quadratic_loss, optax.sgd(lr), local_learning_rate=lr, num_clients=4)
    store = ClientStateStore(scaffold.client_state_init({"w": jnp.zeros(2)}))
    corrected = _run_rounds(scaffold, x, y, indices, rounds, epochs=10, store=store)
    fedavg_error = float(np.max(np.abs(np.asarray(fedavg.params["w"]) - optimum)))
    scaffold_error = float(np.max(np.abs(np.asarray(corrected.params["w"]) - optimum)))
    assert fedavg_error > 0.1 and scaffold_error < 0.01 * fedavg_error


def test_client_state_store_gathers_pads_and_keeps_dropped_clients_state():
    store = ClientStateStore({"w": np.zeros(2)})
    store.scatter([7, 3], {"w": np.array([[1.0, 1.0], [2.0, 2.0]])}, [True, False])
    stacked = store.gather([3, 7], slots=3)
    # 3 dropped: still the template
    np.testing.assert_array_equal(stacked["w"], [[0, 0], [1, 1], [0, 0]])
    ids, values = store.export()
    assert ids == [7]
    other = ClientStateStore({"w": np.zeros(2)})
    other.load(ids, values)
    np.testing.assert_array_equal(other.get(7)["w"], [1, 1])
    with pytest.raises(ValueError, match="3 clients do not fit in 2 slots"):
        store.gather([1, 2, 3], slots=2)


@pytest.mark.parametrize(
    "bad", [{"w": np.zeros((1, 3))}, {"w": np.zeros((1, 2), np.int32)}, {"v": np.zeros((1, 2))}]
)
def test_client_state_store_refuses_a_state_unlike_its_template(bad):
    """A state of another shape, dtype or structure (a checkpoint of another model) is never
    stored."""
    store = ClientStateStore({"w": np.zeros(2, np.float32)})
    with pytest.raises(AssertionError):
        store.scatter([5], bad, [True])
    assert len(store) == 0


def _config():
    c = default_config()
    c.rounds, c.eval_every, c.checkpoint_every = 6, 2, 2
    c.algorithm = "scaffold"
    c.data.num_clients = 20
    c.client.update(epochs=1, batch_size=20, learning_rate=0.1)
    c.sampling.cohort_size = 4
    return c


def test_scaffold_runs_in_the_loop_and_resumes_with_its_client_controls(tmp_path, monkeypatch):
    run_experiment(_config(), str(tmp_path / "a"), progress=False)
    want = _files(tmp_path / "a")
    with monkeypatch.context() as m:
        sigint_at_round(m, 3)
        stopped = run_experiment(_config(), str(tmp_path / "b"), progress=False)
    assert stopped.interrupted
    checkpoints = Checkpointer(str(tmp_path / "b" / "checkpoints"))
    saved = checkpoints.loop_state(checkpoints.rounds()[-1])
    assert len(saved["client_state_ids"]) > 4  # controls of every past participant
    run_experiment(_config(), str(tmp_path / "b"), progress=False, resume=True)
    assert _files(tmp_path / "b") == want  # identical only if the c_i came back from the checkpoint


def test_scaffold_traffic_counts_the_control_variate_both_ways(tmp_path):
    """Seed 004 (Sec. 7.2.5, Fig. 7): SCAFFOLD sends the model and the control variate down and the
    two deltas up, twice an uncompressed FedAvg's traffic each way. Bug: the download counted the
    model only."""
    c = _config()
    c.rounds, c.checkpoint_every = 2, 0
    run_experiment(c, str(tmp_path / "scaffold"), progress=False)
    c.algorithm = "fedavg"
    run_experiment(c, str(tmp_path / "fedavg"), progress=False)

    def rows(name):
        return [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")][1:]

    for scaffold, fedavg in zip(rows("scaffold"), rows("fedavg")):
        assert scaffold["uplink_bytes"] == 2 * fedavg["uplink_bytes"] > 0
        assert scaffold["downlink_bytes"] == 2 * fedavg["downlink_bytes"] > 0
        assert scaffold["traffic_gb_total"] == pytest.approx(2 * fedavg["traffic_gb_total"])


def test_scaffold_bad_input():
    with pytest.raises(ValueError, match="eta_l must be > 0, got 0"):
        Scaffold(_quadratic_loss, optax.sgd(0.1), local_learning_rate=0.0, num_clients=4)
    scaffold = FederatedRound(
        Scaffold(_quadratic_loss, optax.sgd(0.1), local_learning_rate=0.1, num_clients=4)
    )
    x, y, indices = _heterogeneous_clients()
    cohort = pack_cohort(x, y, indices, 4, 1, np.random.default_rng(0))
    with pytest.raises(
        ValueError, match="keeps per-client state: pass the cohort's stacked states"
    ):
        scaffold(scaffold.init({"w": jnp.zeros(2)}), cohort, jax.random.key(0))
    c = _config()
    c.client.momentum = 0.9
    with pytest.raises(ValueError, match="plain SGD clients"):
        run_experiment(c, "/tmp/never-written", progress=False)
