"""``hypergrad.source=clients`` (``fedjax_dp.hypergrad.client_source``): the clients' two releases
give the derivative of the cohort's held-out loss after the round (against jax.grad through the
round and central finite differences, float64), their clips hold, and the run accounts them as
releases on the round's cohort (epsilon, calibration, privacy.json)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms.dp_section import calibrated_noise_multiplier
from fedjax_dp.core.local_training import masked_mean
from fedjax_dp.hypergrad.client_source import (
    ClientHyperGradient,
    ClientOptions,
    HeldOut,
    held_out_gradient_sum,
)
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.loop import run_experiment
from test_hypergrad import (
    C,
    D,
    K,
    _config,
    _setting,
    assert_central_differences,
    softmax_loss,
    x64,  # noqa: F401 (a fixture)
)

HELD = 4  # held-out examples of each client (client 1 holds none)
ALL = ("client_lr", "server_lr", "step_weights")


def _held_out(seed=7):
    rs = np.random.RandomState(seed)
    x, y = rs.randn(C * HELD, D), rs.randint(0, K, C * HELD).astype(np.int32)
    client_test = (np.arange(0, HELD), np.arange(0, 0), np.arange(2 * HELD, 3 * HELD))
    return HeldOut(x, y, client_test, batch_size=HELD)


def _round(chain):
    runner, state, cohort, *_ = _setting(chain)
    cohort["client_id"] = np.arange(C, dtype=np.int32)
    key = jax.random.key(3)
    uploads = runner.specialized(state)
    inputs = dict(
        round_index=1,
        client_states=None,
        uploads=uploads,
        noise_key=jax.random.key(4),
        upload_client_states=None,
        step_noise=None,
    )
    return runner, state, cohort, key, inputs


DENOMINATOR = float(C)  # the fixed D of DP-FedAvg's chain; every client is present in FedAvg's


@pytest.mark.parametrize("chain", ["fedavg", "dp_fedavg"])
def test_the_clients_hypergradient_is_the_derivative_of_their_held_out_loss(x64, chain):  # noqa: F811
    runner, state, cohort, key, inputs = _round(chain)
    held = _held_out()
    result = runner(state, cohort, key, **inputs)
    exact = ClientHyperGradient(runner.algorithm, held, ClientOptions(1e9, 1e9, 0.0, ALL))
    grads = exact(runner, state, result, cohort, key, inputs)

    present = np.asarray(cohort["num_examples"]) > 0
    batches, masks = held.batches(np.arange(C), present, seed=0)  # every held example: order only
    f, args = runner.function(state, cohort, key, **inputs)

    @jax.jit
    def loss(settings):  # sum_i L_i(w_{t+1}(theta)) / D, the round's noise fixed
        new_state, _ = f(state.replace(extra=settings), *args)
        per_client = [
            masked_mean(softmax_loss(new_state.params, {"x": bx, "y": by}, None), m)
            for bx, by, m in zip(batches["x"], batches["y"], masks)
        ]
        return sum(per_client) / DENOMINATOR

    through = jax.grad(loss)(state.extra)
    for name in ALL:
        np.testing.assert_allclose(grads[name], through[name], rtol=1e-9, atol=1e-12)
    assert_central_differences(grads, loss, state.extra)


def test_each_clients_held_out_gradient_is_clipped_before_the_sum():
    held = _held_out()
    params = {"w": jnp.ones((D, K)), "b": jnp.zeros(K)}
    batches, masks = held.batches(np.arange(C), np.ones(C, bool), seed=0)
    clip = 1e-3
    total = held_out_gradient_sum(softmax_loss, params, batches, masks, clip, None)
    norm = float(jnp.sqrt(sum(jnp.sum(v**2) for v in jax.tree_util.tree_leaves(total))))
    assert 0 < norm <= 2 * clip * (1 + 1e-5)  # two clients hold data, each clipped to 1e-3
    unclipped = held_out_gradient_sum(softmax_loss, params, batches, masks, 1e9, None)
    big = float(jnp.sqrt(sum(jnp.sum(v**2) for v in jax.tree_util.tree_leaves(unclipped))))
    assert big > 100 * norm


def test_the_releases_are_noised_and_their_noise_is_the_declared_one():
    runner, state, cohort, key, inputs = _round("dp_fedavg")
    result = runner(state, cohort, key, **inputs)
    options = ClientOptions(1e-12, 1e-12, 1.0, ALL)  # clipped to ~0: what moves is the noise
    hyper, draws = ClientHyperGradient(runner.algorithm, _held_out(), options), []
    for seed in range(200):
        noisy = dict(inputs, noise_key=jax.random.key(100 + seed))
        grads = hyper(runner, state, result, cohort, key, noisy)
        draws.append(np.concatenate([np.ravel(grads["client_lr"]), grads["step_weights"]]))
    draws = np.array(draws)
    # release 2 is N(0, (z C')^2) / D per coordinate
    np.testing.assert_allclose(draws.std(axis=0), 1e-12 / C, rtol=0.2)


def test_a_dp_run_accounts_the_hyper_releases_on_the_rounds_cohort(tmp_path):
    """Three Gaussian releases of z = 1 on one cohort: the epsilon of one of z = 3^-1/2."""
    changes = dict(hyper_lr=0.5, adapt="client_lr,server_lr", source="clients")
    runs = {"clients": _config("dp_fedavg", **changes), "plain": _config("dp_fedavg")}
    runs["plain"].dp.noise_multiplier = 3**-0.5
    records = {}
    for name, cfg in runs.items():
        run_experiment(cfg, str(tmp_path / name), progress=False)
        records[name] = json.load(open(tmp_path / name / "privacy.json"))
    clients = records["clients"]
    assert clients["formal"] is True and clients["hypergrad"]["privacy_cost"] == "accounted"
    np.testing.assert_allclose(clients["epsilon"], records["plain"]["epsilon"], rtol=1e-9)
    names = [r["mechanism"] for r in clients["releases"]]
    assert sum("hyper-gradient" in n for n in names) == 2
    rows = [json.loads(line) for line in open(tmp_path / "clients" / "metrics.jsonl")]
    adapted = [r for r in rows if "hypergrad_client_lr" in r]
    assert len(adapted) == 3 and not any("hypergrad_loss" in r for r in rows)


def test_calibration_leaves_room_for_the_hyper_releases():
    base = _config("dp_fedavg")
    base.privacy.target_epsilon = 8.0
    tuned = _config("dp_fedavg", hyper_lr=0.5, adapt="server_lr", source="clients")
    tuned.privacy.target_epsilon = 8.0
    tuned.hypergrad.noise_multiplier = 2.0
    z, z_tuned = (calibrated_noise_multiplier(c, c.data.num_clients) for c in (base, tuned))
    # the round's z and the hyper-release's 2.0 combine to the z the budget allows alone
    np.testing.assert_allclose((z_tuned**-2 + 2.0**-2) ** -0.5, z, rtol=1e-3)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"noise_multiplier": 0.0}, "would be released without noise"),
        ({"lookahead": 2}, "hypergrad.lookahead=2 with source='clients'"),
        ({"setting_clip": 0.0}, "hypergrad.setting_clip must be > 0"),
    ],
)
def test_client_source_refusals_name_the_key(changes, message):
    cfg = _config("dp_fedavg", hyper_lr=0.1, source="clients", **changes)
    with pytest.raises(ValueError, match="hypergrad") as error:
        validate_config(cfg)
    assert message in str(error.value)


def test_client_source_with_local_noise_is_refused():
    cfg = _config("dp_fedavg", hyper_lr=0.1, source="clients")
    cfg.dp.noise_mode = "local"
    with pytest.raises(ValueError, match="dp.noise_mode='local'"):
        validate_config(cfg)
