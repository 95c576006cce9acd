"""Hyper-gradients through the round (``fedjax_dp.hypergrad``): the derivative against central
finite differences and an independent numpy transcription, the adapted run against today's run,
the config's refusals, and a short adapted run."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.core.uploads import fixed_denominator
from fedjax_dp.hypergrad import (
    HyperOptions,
    Hypertuned,
    hypergradient,
    initial_settings,
    server_step_hypergradient,
)
from fedjax_dp.hypergrad.online import step
from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.training.callbacks import Callback
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

C, S, B, D, K = 3, 4, 5, 6, 3  # clients, local steps, batch, features, classes
FD_STEP = 1e-5
# central differences in float64: truncation O(h^2 f''') ~ 1e-10 and rounding ~ 1e-16 / h ~ 1e-11
# relative to derivatives of order 1e-2; measured agreement 1e-9 to 1e-7 relative
RTOL, ATOL = 1e-6, 1e-10


def softmax_loss(params, batch, key):
    logits = batch["x"] @ params["w"] + params["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])


def _cohort(rs, steps=S):
    mask = np.ones((C, steps, B), bool)
    mask[2, steps - 1 :] = False  # a client with fewer steps: padding in the scan
    return {
        "batches": {
            "x": rs.randn(C, steps, B, D),
            "y": rs.randint(0, K, (C, steps, B)).astype(np.int32),
        },
        "mask": mask,
        "num_examples": mask.sum(axis=(1, 2)).astype(np.int32),
    }


CHAINS = {
    "fedavg": (),
    "dp_fedavg": (FlatClip(0.5), GaussianNoise(((1, 1.0),)), fixed_denominator(C)),
}


@pytest.fixture
def x64():
    """float64 for this test only (the setting restored after it)."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


def _setting(chain, seed=0):
    """A Hypertuned FedAvg round on a softmax-regression model in float64, settings away from 0."""
    rs = np.random.RandomState(seed)
    base = FedAvg(softmax_loss, optax.sgd(0.3), server_optimizer=optax.sgd(1.0))
    runner = FederatedRound(Hypertuned(base, S), CHAINS[chain])
    params = {"w": jnp.asarray(rs.randn(D, K) * 0.1), "b": jnp.zeros(K)}
    state = runner.init(params)
    settings = {
        "client_lr": jnp.asarray(0.1),
        "server_lr": jnp.asarray(-0.2),
        "step_weights": jnp.asarray(rs.randn(S) * 0.1),
    }
    state = state.replace(extra=settings)
    held = {"x": rs.randn(20, D), "y": rs.randint(0, K, 20).astype(np.int32)}
    return runner, state, _cohort(rs), held, np.ones(20, bool)


def _unit_directions(settings):
    """(name, index, direction) for every scalar of the settings."""
    for name, value in settings.items():
        for index in np.ndindex(np.shape(value)):
            direction = jax.tree_util.tree_map(jnp.zeros_like, settings)
            direction[name] = direction[name].at[index].set(1.0)
            yield name, index, direction


def assert_central_differences(grads, loss, settings):
    """Each setting's entry of ``grads`` against a central difference of ``loss`` at
    ``settings``."""
    for name, index, e in _unit_directions(settings):
        plus = jax.tree_util.tree_map(lambda a, b: a + FD_STEP * b, settings, e)
        minus = jax.tree_util.tree_map(lambda a, b: a - FD_STEP * b, settings, e)
        difference = (loss(plus) - loss(minus)) / (2 * FD_STEP)
        np.testing.assert_allclose(
            grads[name][index], difference, rtol=RTOL, atol=ATOL, err_msg=f"{name}{index}"
        )


@pytest.mark.parametrize(
    "chain,lookahead",
    [
        ("fedavg", 1),
        ("dp_fedavg", 1),
        ("fedavg", 2),
        pytest.param("dp_fedavg", 2, marks=pytest.mark.slow),  # about 15 s on 2 CPU cores
    ],
)
def test_the_hypergradient_is_a_central_difference_of_the_held_out_loss(x64, chain, lookahead):
    runner, state, cohort, held, mask = _setting(chain)
    key = jax.random.key(3)
    rounds = []
    s = state
    for t in range(lookahead):  # round t+1's own cohort and keys, its noise fixed
        f, args = runner.function(s, cohort, jax.random.fold_in(key, t), round_index=t + 1)
        rounds.append(args)
        s, _ = f(s, *args)
    loss_key = jax.random.key(9)

    @jax.jit
    def value_and_grads(state):
        return hypergradient(f, softmax_loss, state, rounds, held, mask, loss_key)

    value, grads = value_and_grads(state)

    @jax.jit
    def loss(settings):
        return hypergradient(
            f, softmax_loss, state.replace(extra=settings), rounds, held, mask, loss_key
        )[0]

    assert value.dtype == jnp.float64
    assert_central_differences(grads, loss, state.extra)
    if lookahead == 2:  # rematerialised rounds: the same derivative
        _, again = hypergradient(f, softmax_loss, state, rounds, held, mask, loss_key, remat=True)
        for name in grads:
            np.testing.assert_allclose(again[name], grads[name], rtol=1e-12)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_the_server_lr_from_the_released_mean_alone_equals_the_derivative_through_the_round(
    x64, chain
):
    runner, state, cohort, held, mask = _setting(chain)
    key, loss_key = jax.random.key(3), jax.random.key(9)
    result = runner(state, cohort, key, round_index=1, uploads=runner.specialized(state))
    f, args = runner.function(state, cohort, key, round_index=1)
    _, through = hypergradient(f, softmax_loss, state, [args], held, mask, loss_key)
    _, released = server_step_hypergradient(
        runner.algorithm, softmax_loss, state, result.released, held, mask, loss_key
    )
    np.testing.assert_allclose(released["server_lr"], through["server_lr"], rtol=1e-6)
    assert float(released["client_lr"]) == 0.0


def test_the_round_as_a_function_is_the_round():
    """``FederatedRound.function`` computes what the round computes (same noise, same update)."""
    runner, state, cohort, *_ = _setting("dp_fedavg")
    key = jax.random.key(5)
    result = runner(state, cohort, key, round_index=1)
    f, args = runner.function(state, cohort, key, round_index=1)
    new_state, _ = jax.jit(f)(state, *args)
    for a, b in zip(jax.tree_util.tree_leaves(result.state), jax.tree_util.tree_leaves(new_state)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_zero_log_multipliers_give_the_base_round_bitwise():
    rs = np.random.RandomState(1)
    base = FedAvg(softmax_loss, optax.sgd(0.3), server_optimizer=optax.sgd(0.7))
    params = {"w": jnp.asarray(rs.randn(D, K) * 0.1, jnp.float32), "b": jnp.zeros(K)}
    cohort = _cohort(rs)
    cohort["batches"]["x"] = cohort["batches"]["x"].astype(np.float32)
    key = jax.random.key(0)
    plain = FederatedRound(base, CHAINS["dp_fedavg"])
    tuned = FederatedRound(Hypertuned(base, S), CHAINS["dp_fedavg"])
    a = plain(plain.init(params), cohort, key).state.params
    b = tuned(tuned.init(params), cohort, key).state.params
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert np.array_equal(np.asarray(x), np.asarray(y))


# ---------------------------------------------------------------- an independent transcription
def _numpy_fedavg_hypergradient(w0, xs, ys, masks, eta_c, eta_s, log_w, theta, held_x, held_y):
    """One FedAvg round of least squares, (1/2) mean (x.w - y)^2, with local SGD at rate
    eta_c exp(theta_c + theta_w[i]) and the server step w0 + eta_s exp(theta_s) mean_k n_k Delta_k
    / sum n_k, differentiated by hand in forward mode: returns (held-out loss, d loss / d theta_c,
    d / d theta_s, d / d theta_w[i]...)."""
    num_settings = 2 + len(log_w)  # tangents: client_lr, server_lr, step weights
    deltas, tangents, counts = [], [], []
    for x, y, m in zip(xs, ys, masks):
        w = w0.copy()
        dw = np.zeros((num_settings,) + w.shape)
        for i in range(len(x)):
            if not m[i].any():
                continue
            xi, yi = x[i][m[i]], y[i][m[i]]
            n = len(yi)
            grad = xi.T @ (xi @ w - yi) / n
            hessian = xi.T @ xi / n
            rate = eta_c * np.exp(theta[0] + log_w[i])
            d_rate = np.zeros(num_settings)
            d_rate[0] = rate
            d_rate[2 + i] = rate
            dw = dw - rate * dw @ hessian.T - d_rate[:, None] * grad[None, :]
            w = w - rate * grad
        deltas.append(w - w0)
        tangents.append(dw)
        counts.append(m.sum())
    counts = np.asarray(counts, float)
    mean = sum(c * d for c, d in zip(counts, deltas)) / counts.sum()
    d_mean = sum(c * t for c, t in zip(counts, tangents)) / counts.sum()
    server = eta_s * np.exp(theta[1])
    w1 = w0 + server * mean
    d_w1 = server * d_mean
    d_w1[1] += server * mean
    residual = held_x @ w1 - held_y
    loss = 0.5 * np.mean(residual**2)
    return loss, d_w1 @ (held_x.T @ residual / len(held_y))


def squared_loss(params, batch, key):
    return 0.5 * (batch["x"] @ params["w"] - batch["y"]) ** 2


def test_the_hypergradient_equals_a_numpy_transcription_of_fedavg(x64):
    rs = np.random.RandomState(4)
    steps = 3
    cohort = _cohort(rs, steps)
    cohort["batches"]["y"] = rs.randn(C, steps, B)
    eta_c, eta_s = 0.1, 0.8
    base = FedAvg(squared_loss, optax.sgd(eta_c), server_optimizer=optax.sgd(eta_s))
    runner = FederatedRound(Hypertuned(base, steps))
    w0 = rs.randn(D) * 0.1
    theta = np.array([0.2, -0.3])
    log_w = rs.randn(steps) * 0.2
    state = runner.init({"w": jnp.asarray(w0)})
    state = state.replace(
        extra={
            "client_lr": jnp.float64(theta[0]),
            "server_lr": jnp.float64(theta[1]),
            "step_weights": jnp.asarray(log_w),
        }
    )
    held_x, held_y = rs.randn(15, D), rs.randn(15)
    f, args = runner.function(state, cohort, jax.random.key(0), round_index=1)
    value, grads = hypergradient(
        f,
        squared_loss,
        state,
        [args],
        {"x": held_x, "y": held_y},
        np.ones(15, bool),
        jax.random.key(1),
    )
    expected_loss, expected = _numpy_fedavg_hypergradient(
        w0,
        cohort["batches"]["x"],
        cohort["batches"]["y"],
        cohort["mask"],
        eta_c,
        eta_s,
        log_w,
        theta,
        held_x,
        held_y,
    )
    np.testing.assert_allclose(value, expected_loss, rtol=1e-12)
    ours = np.concatenate([[grads["client_lr"], grads["server_lr"]], grads["step_weights"]])
    np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-14)


def test_initial_settings_are_the_configured_values():
    settings = initial_settings(4)
    assert all(float(jnp.max(jnp.abs(v))) == 0.0 for v in settings.values())
    assert settings["step_weights"].shape == (4,)


def test_the_normalized_step_moves_the_adapted_log_multipliers_by_hyper_lr():
    settings = initial_settings(3)
    grads = {name: jnp.full_like(v, 1e-4) for name, v in settings.items()}
    grads["client_lr"], grads["server_lr"] = jnp.float32(3e-4), jnp.float32(-4e-4)
    options = HyperOptions(("client_lr", "server_lr"), 0.1, step_rule="normalized")
    moved = step(settings, grads, options)
    assert float(moved["client_lr"]) == pytest.approx(-0.06)
    assert float(moved["server_lr"]) == pytest.approx(0.08)
    assert float(jnp.max(jnp.abs(moved["step_weights"]))) == 0.0
    plain = step(settings, grads, HyperOptions(("client_lr", "server_lr"), 0.1))
    assert float(plain["client_lr"]) == pytest.approx(-3e-5)


# ---------------------------------------------------------------- config and runs
def _config(algorithm="fedavg", **hypergrad):
    """The tiny run of the fast loop tests: logistic model, 20 clients, 4 per round."""
    c = default_config()
    c.rounds, c.eval_every, c.algorithm, c.seed = 3, 3, algorithm, 0
    c.model.name = "logistic"
    c.data.num_clients = 20
    c.client.update(epochs=1, batch_size=20, learning_rate=0.05)
    c.sampling.cohort_size = 4
    c.server_data.fraction = 0.02
    if algorithm == "dp_fedavg":
        c.dp.update(noise_multiplier=1.0, clip_norm=0.5)
    c.hypergrad.update(**hypergrad)
    return c


@pytest.mark.parametrize(
    "algorithm,changes,message",
    [
        ("scaffold", {"hyper_lr": 0.1}, "algorithm 'scaffold' cannot adapt its settings"),
        ("fedavg", {"hyper_lr": -0.1}, "hypergrad.hyper_lr must be >= 0, got -0.1"),
        ("fedavg", {"hyper_lr": 0.1, "adapt": "client_lr,momentum"}, "hypergrad.adapt="),
        ("fedavg", {"hyper_lr": 0.1, "source": "both"}, "hypergrad.source='both' unknown"),
        ("fedavg", {"hyper_lr": 0.1, "lookahead": 0}, "hypergrad.lookahead must be an integer"),
        ("fedavg", {"hyper_lr": 0.1, "batch_size": 0}, "hypergrad.batch_size must be >= 1"),
        ("fedavg", {"hyper_lr": 0.1, "step_rule": "adam"}, "hypergrad.step_rule='adam' unknown"),
        ("fedavg", {"hyper_lr": 0.1, "backtrack": -1.0}, "hypergrad.backtrack must be >= 0"),
        (
            "fedavg",
            {"hyper_lr": 0.1, "backtrack": 0.1, "source": "clients"},
            "the clients' held-out loss is not released",
        ),
        (
            "dp_fedavg",
            {"hyper_lr": 0.1, "adapt": "client_lr"},
            "a DP run may adapt only server_lr with lookahead 1",
        ),
        (
            "dp_fedavg",
            {"hyper_lr": 0.1, "adapt": "server_lr", "lookahead": 2},
            "a DP run may adapt only server_lr with lookahead 1",
        ),
    ],
)
def test_config_errors_name_the_key_and_value(algorithm, changes, message):
    with pytest.raises(ValueError, match="hypergrad") as error:
        validate_config(_config(algorithm, **changes))
    assert message in str(error.value)


class _FinalParams(Callback):
    def on_train_end(self, run):
        self.params = jax.device_get(run.state.params)


def test_hyper_lr_zero_is_todays_run_bitwise(tmp_path):
    runs = []
    for i, changes in enumerate([{}, {"hyper_lr": 0.0, "adapt": "step_weights", "lookahead": 3}]):
        grab = _FinalParams()
        run_experiment(
            _config(**changes), str(tmp_path / str(i)), progress=False, callbacks=(grab,)
        )
        rows = [json.loads(line) for line in open(tmp_path / str(i) / "metrics.jsonl")]
        assert not any(k.startswith("hypergrad") for r in rows for k in r)
        runs.append(grab.params)
    for a, b in zip(jax.tree_util.tree_leaves(runs[0]), jax.tree_util.tree_leaves(runs[1])):
        assert np.array_equal(a, b)


def test_a_server_source_run_adapts_its_settings_and_labels_the_source(tmp_path):
    cfg = _config(hyper_lr=0.5, adapt="client_lr,server_lr,step_weights")
    run_experiment(cfg, str(tmp_path), progress=False)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    rows = [r for r in rows if "hypergrad_client_lr" in r]
    assert len(rows) == 3
    client = [r["hypergrad_client_lr"] for r in rows]
    server = [r["hypergrad_server_lr"] for r in rows]
    assert len(set(client)) == 3 and len(set(server)) == 3 and client[0] != 0.05
    assert all(len(r["hypergrad_step_weights"]) >= 1 for r in rows)
    assert all(np.isfinite(r["hypergrad_loss"]) for r in rows)
    privacy = json.load(open(os.path.join(tmp_path, "privacy.json")))
    assert privacy["hypergrad"]["source"] == "server"
    assert privacy["hypergrad"]["privacy_cost"] == "none"
    assert any("hypergrad" in note for note in privacy["notes"])
    assert (tmp_path / "results.png").exists()


def test_the_results_plot_gains_a_panel_for_the_adapted_settings(tmp_path):
    from fedjax_dp.training import plots

    rows = [{"round": t, "train_loss": 1.0, "hypergrad_client_lr": 0.1 * t} for t in (1, 2)]
    plots.plot_run(rows, str(tmp_path / "a.png"), "adapted")
    plots.plot_run(
        [{k: v for k, v in r.items() if "hyper" not in k} for r in rows],
        str(tmp_path / "b.png"),
        "fixed",
    )
    from PIL import Image

    wide, narrow = Image.open(tmp_path / "a.png").size[0], Image.open(tmp_path / "b.png").size[0]
    assert wide > narrow


@pytest.mark.slow
def test_a_dp_run_adapting_the_server_lr_spends_the_same_epsilon(tmp_path):
    """Post-processing of the release: the epsilon of the run without hyper-gradients."""
    records = []
    for i, changes in enumerate([{}, {"hyper_lr": 0.5, "adapt": "server_lr"}]):
        run_experiment(_config("dp_fedavg", **changes), str(tmp_path / str(i)), progress=False)
        records.append(json.load(open(tmp_path / str(i) / "privacy.json")))
    assert records[0]["epsilon"] == records[1]["epsilon"] > 0
    assert records[1]["hypergrad"]["adapt"] == ["server_lr"]
    assert "post-processing" in records[1]["hypergrad"]["why"]
    rows = [json.loads(line) for line in open(tmp_path / "1" / "metrics.jsonl")]
    assert len({r["hypergrad_server_lr"] for r in rows if "hypergrad_server_lr" in r}) == 3


def test_a_hypergrad_key_set_while_it_is_off_is_refused():
    cfg = _config(adapt="client_lr")
    with pytest.raises(ValueError, match="hypergrad.adapt='client_lr' is not read while"):
        validate_config(cfg, overridden=("hypergrad.adapt",))


class _ParamsEachRound(Callback):
    def __init__(self):
        self.params = {}

    def on_train_begin(self, run):
        self.params[0] = jax.device_get(run.state.params)

    def after_round(self, run, t, row):
        self.params[t] = jax.device_get(run.state.params)


def _same(a, b) -> bool:
    return all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def test_backtracking_undoes_a_round_whose_held_out_loss_jumps(tmp_path):
    """A server rate 100x too large: the first rounds are undone (the model kept, the rates
    halved) until a round no longer raises the held-out loss."""
    cfg = _config(hyper_lr=0.1, adapt="client_lr,server_lr", step_rule="normalized", backtrack=0.1)
    cfg.rounds, cfg.server.learning_rate = 8, 100.0
    grab = _ParamsEachRound()
    run_experiment(cfg, str(tmp_path), progress=False, callbacks=(grab,))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    rates = {r["round"]: r["hypergrad_server_lr"] for r in rows if "hypergrad_server_lr" in r}
    undone = [r["round"] for r in rows if r.get("hypergrad_undone")]
    assert undone[0] == 1 and len(undone) < len(rates)
    for t in rates:
        if t in undone:  # the model is the one before the round; the server rate halves
            assert _same(grab.params[t], grab.params[t - 1])
            assert rates[t] == pytest.approx(rates.get(t - 1, 100.0) / 2, rel=1e-5)
        else:  # a kept round moves the model
            assert not _same(grab.params[t], grab.params[t - 1])
