"""Measurement matrices refreshed every round (``compression.refresh``) and error feedback
(``compression.error_feedback``; neither in seed 004, EF-SGD of Karimireddy et al. 2019): with Alg.
3's fixed matrix the model only moves in one subspace and a residual is never measured; permuted per
round, both change."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.compression.upload_transform import CompressedSensing
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.core.uploads import ClientContext, UniformWeights, chain
from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip, MedianClip
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

from conftest import sigint_at_round, two_logistic_clients

TEMPLATE = {"w": jnp.zeros((6, 5)), "b": jnp.zeros(5)}


def _client(cs, upload, residual, keep=True, round_index=1):
    ctx = ClientContext(
        cs.init(TEMPLATE),
        cs.inputs(round_index),
        jnp.float32(jnp.inf),
        jax.random.key(0),
        jnp.bool_(True),
        jnp.bool_(keep),
        0,
        residual,
    )
    return cs.client(upload, ctx)


def _matrix(cs, name, round_index):
    """Layer ``name``'s measurement matrix in round ``round_index`` in numpy: the operator's dense
    matrix with its columns permuted as ``refresh='round'`` permutes the entries (x[perm] is
    measured)."""
    index = sorted(TEMPLATE).index(name)
    phi = np.asarray(cs.compressor.operators[index].dense(), np.float64)
    if cs.refresh == "fixed":
        return phi
    perm = np.asarray(cs.inputs(round_index)["permutations"][index])
    permuted = np.zeros_like(phi)
    permuted[:, perm] = phi  # (Phi Pi) x = Phi x[perm]
    return permuted


def _projection(cs, name, round_index=1):
    """Phi^T (Phi Phi^T)^-1 Phi of layer ``name`` in round ``round_index``."""
    phi = _matrix(cs, name, round_index)
    return phi.T @ np.linalg.solve(phi @ phi.T, phi)


def _random_upload(seed):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.standard_normal((6, 5)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal(5), jnp.float32),
    }


@pytest.mark.parametrize("kind", ["block", "gaussian"])
def test_a_permuted_operator_is_phi_pi_and_its_reconstruction_the_projection(kind):
    cs = CompressedSensing(
        rates="0.4", operator=kind, reconstruct="each", refresh="round"
    ).specialize(TEMPLATE)
    fixed = CompressedSensing(rates="0.4", operator=kind, reconstruct="each").specialize(TEMPLATE)
    x = _random_upload(0)
    for round_index in (1, 2):
        measured = cs._compress(x, cs.inputs(round_index))
        rebuilt = cs._reconstruct(measured, cs.inputs(round_index))
        for name, y in zip(sorted(TEMPLATE), measured):
            flat = np.asarray(x[name], np.float64).ravel()
            np.testing.assert_allclose(
                y, _matrix(cs, name, round_index) @ flat, rtol=1e-4, atol=1e-4
            )
            np.testing.assert_allclose(
                np.asarray(rebuilt[name]).ravel(),
                _projection(cs, name, round_index) @ flat,
                atol=1e-4,
            )
    a, b = (cs.inputs(t)["permutations"][1] for t in (1, 2))
    # a new one each round
    assert sorted(np.asarray(a).tolist()) == list(range(30)) and not np.array_equal(a, b)
    assert cs.upload_bytes(4 * 35) == fixed.upload_bytes(4 * 35)  # nothing more is sent


def test_a_fixed_matrix_never_measures_what_it_missed_and_a_refreshed_one_does():
    """Alg. 3 as written measures a layer with the same matrix every round, so min-norm
    reconstruction keeps the model in one row space, and a residual (I - P) x is invisible to every
    later round; permuted per round, the next matrix sees a good part of it."""
    x = _random_upload(7)
    for refresh, seen in (("fixed", False), ("round", True)):
        cs = CompressedSensing(rates="0.4", reconstruct="each", refresh=refresh).specialize(
            TEMPLATE
        )
        for name in TEMPLATE:
            flat = np.asarray(x[name], np.float64).ravel()
            missed = flat - _projection(cs, name, 1) @ flat
            visible = np.linalg.norm(_projection(cs, name, 2) @ missed) / np.linalg.norm(missed)
            assert (visible > 0.2) == seen, (refresh, name, visible)
    with pytest.raises(ValueError, match="needs compression.refresh='round'"):
        CompressedSensing(rates="0.4", error_feedback=True)


def test_the_residual_is_what_the_measurements_missed_and_nothing_is_lost_over_rounds():
    cs = CompressedSensing(
        rates="0.4", reconstruct="each", error_feedback=True, refresh="round"
    ).specialize(TEMPLATE)
    x1, x2 = _random_upload(1), _random_upload(2)
    first = _client(cs, x1, cs.client_state_init(TEMPLATE))
    for name in TEMPLATE:  # round 1: sends P x1, keeps (I - P) x1
        p = _projection(cs, name)
        flat = np.asarray(x1[name], np.float64).ravel()
        np.testing.assert_allclose(np.asarray(first.upload[name]).ravel(), p @ flat, atol=1e-5)
        np.testing.assert_allclose(
            np.asarray(first.client_state[name]).ravel(), flat - p @ flat, atol=1e-5
        )
    second = _client(cs, x2, first.client_state, round_index=2)
    # round 2 measures x2 + e1; what was sent plus what is kept is all of x1 + x2
    for name in TEMPLATE:
        p = _projection(cs, name, 2)
        carried = (
            np.asarray(x2[name], np.float64).ravel() + np.asarray(first.client_state[name]).ravel()
        )
        np.testing.assert_allclose(np.asarray(second.upload[name]).ravel(), p @ carried, atol=1e-5)
        total = first.upload[name] + second.upload[name] + second.client_state[name]
        np.testing.assert_allclose(total, x1[name] + x2[name], atol=1e-5)
    assert float(jnp.abs(second.client_state["w"]).max()) > 0.1  # rate 0.4: a real residual
    plain = CompressedSensing(rates="0.4", reconstruct="each", refresh="round").specialize(TEMPLATE)
    without = _client(plain, x1, None)
    assert without.client_state is None
    # the first round with a zero residual sends what the plain transform sends
    for name in TEMPLATE:
        np.testing.assert_array_equal(first.upload[name], without.upload[name])


def test_a_client_whose_upload_is_not_kept_keeps_its_old_residual_and_rate_one_leaves_none():
    cs = CompressedSensing(
        rates="0.4", reconstruct="aggregate", error_feedback=True, refresh="round"
    ).specialize(TEMPLATE)
    old = _random_upload(3)
    dropped = _client(cs, _random_upload(4), old, keep=False)
    for name in TEMPLATE:
        np.testing.assert_array_equal(dropped.client_state[name], old[name])
    # aggregate placement: sends measurements, keeps its own residual
    kept = _client(cs, _random_upload(4), old)
    assert [y.shape for y in kept.upload] != [x.shape for x in jax.tree_util.tree_leaves(TEMPLATE)]
    assert float(jnp.abs(kept.client_state["w"] - old["w"]).max()) > 0.1
    full = CompressedSensing(
        rates="1.0", reconstruct="each", error_feedback=True, refresh="round"
    ).specialize(TEMPLATE)
    exact = _client(full, _random_upload(5), full.client_state_init(TEMPLATE))
    assert (
        max(float(jnp.abs(e).max()) for e in jax.tree_util.tree_leaves(exact.client_state)) < 1e-5
    )
    # x carries e: the incoming bound no longer holds
    assert cs.bound_after(jnp.float32(1.0), None, None) == jnp.inf


def test_the_round_needs_and_returns_the_residuals_and_rate_one_equals_plain_compression():
    params, cohort_of, fedavg = two_logistic_clients()
    cohort = cohort_of(0)
    with_ef = FederatedRound(
        fedavg, [CompressedSensing(rates="0.5", error_feedback=True, refresh="round")]
    )
    state = with_ef.init(params)
    with pytest.raises(ValueError, match="upload_client_states"):
        with_ef(state, cohort, jax.random.key(1))
    store = ClientStateStore(with_ef.uploads.client_state_init(fedavg.upload_template(params)))
    result = with_ef(state, cohort, jax.random.key(1), upload_client_states=store.gather([0, 1]))
    kernel = result.upload_client_states[0]["Dense_0"]["kernel"]
    assert kernel.shape == (2,) + params["Dense_0"]["kernel"].shape
    assert float(jnp.abs(kernel).max()) > 0  # rate 0.5 leaves a residual
    store.scatter([0, 1], result.upload_client_states, np.array([True, True]))
    assert len(store) == 2
    exact = FederatedRound(
        fedavg, [CompressedSensing(rates="1.0", error_feedback=True, refresh="round")]
    )
    plain = FederatedRound(fedavg, [CompressedSensing(rates="1.0", refresh="round")])
    zero = ClientStateStore(exact.uploads.client_state_init(fedavg.upload_template(params))).gather(
        [0, 1]
    )
    a = exact(exact.init(params), cohort, jax.random.key(1), upload_client_states=zero).state.params
    b = plain(plain.init(params), cohort, jax.random.key(1)).state.params
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)


def test_a_fixed_block_matrix_keeps_the_model_in_its_row_space_and_a_refreshed_one_does_not():
    """The property behind CUAG-PFL's compression-only decline (experiments/RESULTS.md): at r = 0.5
    the block matrix sums pairs of neighbouring weights, and over any number of rounds each pair
    moves together."""
    params, cohort_of, fedavg = two_logistic_clients(learning_rate=0.5)
    spreads = {}
    for refresh in ("fixed", "round"):
        runner = FederatedRound(fedavg, [CompressedSensing(rates="0.5", refresh=refresh)])
        state = runner.init(params)
        for t in (1, 2, 3):
            state = runner(state, cohort_of(t), jax.random.key(t), t).state
        moved = np.asarray(state.params["Dense_0"]["kernel"] - params["Dense_0"]["kernel"]).ravel()
        pairs = moved.reshape(-1, 2)
        spreads[refresh] = (np.abs(pairs[:, 0] - pairs[:, 1]).max(), np.abs(moved).max())
    assert spreads["fixed"][0] < 1e-6 < 0.05 < spreads["fixed"][1]  # every pair moved together
    assert spreads["round"][0] > 0.1 * spreads["round"][1]


def test_a_transform_with_client_state_after_a_server_side_clip_is_refused():
    with pytest.raises(ValueError, match="keeps per-client state"):
        chain(
            MedianClip(),
            CompressedSensing(rates="0.5", error_feedback=True, refresh="round"),
            UniformWeights(4.0),
        )


def _config(**compression):
    c = default_config()
    c.rounds, c.eval_every, c.checkpoint_every = 4, 2, 2
    c.data.num_clients = 12
    c.client.update(epochs=1, batch_size=20)
    c.sampling.cohort_size = 4
    c.compression.update(**{"enabled": True, "rates": "0.3", "refresh": "round", **compression})
    return c


def _metrics(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def test_loop_error_feedback_changes_training_resumes_bit_exactly_and_is_validated(
    tmp_path, monkeypatch
):
    run_experiment(_config(), str(tmp_path / "plain"), progress=False)
    straight = run_experiment(_config(error_feedback=True), str(tmp_path / "ef"), progress=False)
    assert straight.rounds == 4
    plain, ef = _metrics(tmp_path / "plain"), _metrics(tmp_path / "ef")
    assert plain[1]["train_loss"] == ef[1]["train_loss"]  # round 1: every residual is still zero
    assert plain[-1]["train_loss"] != ef[-1]["train_loss"]  # later rounds carry the residuals
    assert plain[-1]["uplink_bytes"] == ef[-1]["uplink_bytes"]  # the residual is never sent

    # SIGINT in round 3: checkpoint at 3 (residuals of 3 rounds' clients), stop
    with monkeypatch.context() as m:
        sigint_at_round(m, 3)
        assert run_experiment(
            _config(error_feedback=True), str(tmp_path / "resumed"), progress=False
        ).interrupted
    run_experiment(
        _config(error_feedback=True), str(tmp_path / "resumed"), progress=False, resume=True
    )
    # residuals restored from the checkpoint, bit-exactly
    assert _metrics(tmp_path / "resumed") == ef

    bad = _config(error_feedback=True)
    bad.compression.enabled = False
    with pytest.raises(
        ValueError, match="compression.error_feedback=True .* needs compression.enabled=True"
    ):
        run_experiment(bad, str(tmp_path / "bad"), progress=False)
    bad = _config(error_feedback=True, refresh="fixed")
    with pytest.raises(ValueError, match="needs compression.refresh='round'"):
        run_experiment(bad, str(tmp_path / "bad"), progress=False)
    bad = _config(refresh="daily")
    with pytest.raises(ValueError, match="compression.refresh 'daily' unknown"):
        run_experiment(bad, str(tmp_path / "bad"), progress=False)


def test_error_feedback_under_dp_spends_the_same_epsilon():
    """The clip and noise act on the measurements of x = Delta + e as they would on those of Delta:
    the releases, and so the accounting, are the same with and without the residual."""

    def private(error_feedback):
        cs = CompressedSensing(
            rates="0.5", reconstruct="aggregate", error_feedback=error_feedback, refresh="round"
        )
        return chain(cs, FlatClip(1.0), GaussianNoise(((1, 0.8),), local=True), UniformWeights())

    assert private(True).releases(3) == private(False).releases(3)
    assert private(True).keeps_client_state and not private(False).keeps_client_state
