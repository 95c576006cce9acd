"""Random signs before measuring (``compression.signs='random'``, not in seed 004): Alg. 3's block
matrix keeps each layer's mean shift whole (its rows sum to all-ones), Phi D with a shared +-1
diagonal D does not, at the same cost, traffic and Gram solve (experiments/RESULTS.md, seed 004,
"The block matrix keeps each layer's mean shift whole")."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.compression.signs import layer_signs
from fedjax_dp.compression.upload_transform import CompressedSensing
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

TEMPLATE = {"w": jnp.zeros((8, 6)), "b": jnp.zeros(6)}


def _signed_matrix(cs, index):
    """Layer ``index``'s Phi D in numpy: the block matrix with column j multiplied by the sign of
    entry j."""
    phi = np.asarray(cs.compressor.operators[index].dense(), np.float64)
    return phi * np.asarray(cs.inputs(1)["signs"][index], np.float64)[None, :]


@pytest.mark.parametrize(
    "rates, refresh", [("0.5", "fixed"), ("dynamic", "fixed"), ("0.4", "round")]
)
def test_signed_block_measures_phi_d_and_reconstructs_its_projection(rates, refresh):
    cs = CompressedSensing(
        rates=rates, reconstruct="each", signs="random", refresh=refresh
    ).specialize({"w": jnp.ones((8, 6)), "b": jnp.ones(6)})
    plain = CompressedSensing(rates=rates, reconstruct="each", refresh=refresh).specialize(
        {"w": jnp.ones((8, 6)), "b": jnp.ones(6)}
    )
    rng = np.random.default_rng(0)
    x = {
        "w": jnp.asarray(rng.standard_normal((8, 6)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal(6), jnp.float32),
    }
    inputs = cs.inputs(1)
    measured = cs._compress(x, inputs)
    rebuilt = cs._reconstruct(measured, inputs)
    for index, name in enumerate(sorted(TEMPLATE)):
        flat = np.asarray(x[name], np.float64).ravel()
        phi = _signed_matrix(cs, index)
        if refresh == "round":  # the permutation acts on the signed entries: Phi Pi D
            perm = np.asarray(inputs["permutations"][index])
            phi = np.zeros_like(phi)
            block = np.asarray(cs.compressor.operators[index].dense(), np.float64)
            phi[:, perm] = block
            phi = phi * np.asarray(inputs["signs"][index], np.float64)[None, :]
        b = plain.compressor.operators[index].shape[0]
        np.testing.assert_allclose(
            np.asarray(measured[index])[:b], phi @ flat, rtol=1e-5, atol=1e-5
        )
        projection = phi.T @ np.linalg.solve(phi @ phi.T, phi)
        np.testing.assert_allclose(np.asarray(rebuilt[name]).ravel(), projection @ flat, atol=1e-5)
    assert cs.upload_bytes(4 * 54) == plain.upload_bytes(4 * 54)  # nothing more is sent


def test_the_block_matrix_keeps_a_constant_shift_whole_and_the_signed_one_does_not():
    shift = {"w": jnp.full((8, 6), -0.5), "b": jnp.full(6, -0.5)}
    for signs, kept_whole in (("none", True), ("random", False)):
        cs = CompressedSensing(rates="0.5", reconstruct="each", signs=signs).specialize(TEMPLATE)
        inputs = cs.inputs(1)
        rebuilt = cs._reconstruct(cs._compress(shift, inputs), inputs)
        for name in TEMPLATE:
            close = np.allclose(np.asarray(rebuilt[name]), np.asarray(shift[name]), atol=1e-6)
            assert close == kept_whole, (signs, name)
            # a projection: about r of the shift's norm squared, never more than all of it
            if not kept_whole:
                assert float(jnp.sum(rebuilt[name] ** 2)) < 0.9 * float(jnp.sum(shift[name] ** 2))


def test_signs_are_a_shared_fixed_draw_per_layer():
    a, b = layer_signs((48, 6), 0), layer_signs((48, 6), 0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))  # clients and server derive the same
    assert set(np.unique(np.asarray(a[0])).tolist()) == {-1.0, 1.0}
    assert not np.array_equal(layer_signs((48,), 1)[0], a[0])  # another seed, another draw
    cs = CompressedSensing(rates="0.5", signs="random").specialize(TEMPLATE)
    # every round
    assert all(np.array_equal(x, y) for x, y in zip(cs.inputs(1)["signs"], cs.inputs(7)["signs"]))
    with pytest.raises(ValueError, match="compression signs 'rademacher' unknown"):
        CompressedSensing(rates="0.5", signs="rademacher")


def _config(signs):
    c = default_config()
    c.rounds, c.eval_every = 2, 2
    c.data.num_clients = 12
    c.client.update(epochs=1, batch_size=20)
    c.sampling.cohort_size = 4
    c.compression.update(enabled=True, rates="dynamic", signs=signs)
    return c


def _metrics(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def test_a_run_with_signed_compression_trains_sends_the_same_and_is_validated(tmp_path):
    run_experiment(_config("none"), str(tmp_path / "plain"), progress=False)
    summary = run_experiment(_config("random"), str(tmp_path / "signed"), progress=False)
    assert summary.rounds == 2
    plain, signed = _metrics(tmp_path / "plain"), _metrics(tmp_path / "signed")
    assert plain[1]["train_loss"] == signed[1]["train_loss"]  # round 1 trains from the same w_0
    # round 2 starts from a differently rebuilt w_1
    assert plain[2]["train_loss"] != signed[2]["train_loss"]
    assert np.isfinite(signed[-1]["train_loss"])
    # the same rates from w_0: the same traffic
    assert plain[1]["uplink_bytes"] == signed[1]["uplink_bytes"]
    with pytest.raises(ValueError, match="compression.signs 'rademacher' unknown"):
        validate_config(_config("rademacher"))
