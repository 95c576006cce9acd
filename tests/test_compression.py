"""Compressed sensing (seed 004, Alg. 2-3, Eqs. 13-14): rates, operators, reconstruction,
traffic."""

import json
import logging
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.scipy.fft import idct

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.compression.upload_transform import CompressedSensing
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.compression import traffic
from fedjax_dp.compression.coherence import basis, coherence
from fedjax_dp.compression.operators import BlockSum, RandomMatrix, make_operator
from fedjax_dp.compression.pytree import LayerwiseCompressor
from fedjax_dp.compression.rates import dynamic_rate, dynamic_rates, fixed_rates
from fedjax_dp.compression.reconstruction import ista_dct, min_norm
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.models import get_model
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

from conftest import random_client_data, two_logistic_clients


def test_alg2_rates_cover_every_branch():
    # weight < r_min: round(r_max - round(weight, 2), 1)
    assert dynamic_rate(0.03) == 0.5  # round(0.5 - 0.03, 1) = round(0.47, 1)
    assert dynamic_rate(0.17) == 0.3  # round(0.33, 1)
    # round(0.85, 1): half-even as Python rounds
    assert dynamic_rate(0.05, r_min=0.2, r_max=0.9) == 0.8
    # r_min <= weight and round(weight, 1) < r_max: round(weight, 1)
    assert dynamic_rate(0.33) == 0.3 and dynamic_rate(0.44) == 0.4
    # round(weight, 1) >= r_max: r_max
    assert dynamic_rate(0.46) == 0.5 and dynamic_rate(0.9) == 0.5
    tree = {"a": np.full(4, 3.0), "b": np.full(1, 4.0), "c": np.zeros(3) + 0.1}  # norms 6, 4, 0.17
    total = math.sqrt(36 + 16 + 0.03)
    want = {k: dynamic_rate(n / total) for k, n in (("a", 6.0), ("b", 4.0), ("c", math.sqrt(0.03)))}
    assert dynamic_rates(tree) == want == {"a": 0.5, "b": 0.5, "c": 0.5}
    assert fixed_rates(tree, 0.3) == {"a": 0.3, "b": 0.3, "c": 0.3}


def test_rate_bad_input():
    for r in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="must lie in"):
            fixed_rates({"a": np.ones(3)}, r)
    with pytest.raises(ValueError, match="exceeds r_max"):
        dynamic_rate(0.3, r_min=0.6, r_max=0.5)
    with pytest.raises(ValueError, match="all zero"):
        dynamic_rates({"a": np.zeros(3)})
    with pytest.raises(ValueError, match="empty layer"):
        BlockSum(0, 0.5)


def _paper_matrix(size, rate):
    """Alg. 3 from its row rules: b = floor(r I), z = floor(1 / r), count = I - z b rows of z + 1
    ones, the rest z ones, contiguous, in order."""
    b, z = math.floor(rate * size + 1e-9), math.floor(1 / rate + 1e-9)
    count = size - z * b
    m, start = np.zeros((b, size)), 0
    for i in range(b):
        length = z + 1 if i < count else z
        m[i, start : start + length] = 1
        start += length
    assert start == size
    return m


@pytest.mark.parametrize(
    "size,rate",
    [
        (10, 0.3),
        (100, 0.17),
        (512, 0.1),
        (1000, 0.5),
        (33, 0.25),
        (97, 0.9),
        (12, 1.0),
        (50, 0.33),
        (101, 0.45),
        (7, 0.3),
    ],
)
def test_block_operator_is_the_papers_matrix(size, rate):
    op = BlockSum(size, rate)
    want = _paper_matrix(size, rate)
    np.testing.assert_array_equal(op.dense(), want)
    x = np.random.default_rng(size).standard_normal(size).astype(np.float32)
    np.testing.assert_allclose(op.measure(jnp.asarray(x)), want @ x, rtol=1e-5, atol=1e-5)
    assert (want.sum(axis=0) == 1).all()  # disjoint blocks covering the vector


def test_block_operator_documented_rules_where_the_paper_is_infeasible():
    op = BlockSum(7, 0.4)  # b = 2, z = 2, count = 3 > b: the paper's rows cannot cover; even split
    assert op.shape == (2, 7) and op.block_sizes.tolist() == [4, 3]
    tiny = BlockSum(3, 0.2)  # smaller than 1 / r: one measurement, the sum
    assert tiny.shape == (1, 3) and tiny.dense().tolist() == [[1, 1, 1]]


@pytest.mark.parametrize(
    "kind,tile", [("block", 4096), ("gaussian", 4096), ("bernoulli", 4096), ("gaussian", 37)]
)
def test_adjoint_identity_and_min_norm_least_squares(kind, tile):
    size, rate = 150, 0.3
    op = make_operator(kind, size, rate, seed=3, tile=tile)
    rng = np.random.default_rng(0)
    x, y = (
        rng.standard_normal(size).astype(np.float32),
        rng.standard_normal(op.shape[0]).astype(np.float32),
    )
    lhs = float(jnp.dot(op.measure(jnp.asarray(x)), y))
    rhs = float(jnp.dot(x, op.adjoint(jnp.asarray(y))))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-4)
    dense = op.dense().astype(np.float64)
    np.testing.assert_allclose(dense @ x, op.measure(jnp.asarray(x)), rtol=1e-4, atol=1e-4)
    measured = dense @ x
    rec = np.asarray(min_norm(op, jnp.asarray(measured, jnp.float32)))
    np.testing.assert_allclose(rec, np.linalg.pinv(dense) @ measured, rtol=1e-3, atol=1e-3)


def test_block_min_norm_is_exact_for_block_constant_vectors():
    op = BlockSum(103, 0.3)
    values = np.random.default_rng(1).standard_normal(op.shape[0])
    x = np.repeat(values, op.block_sizes).astype(np.float32)
    np.testing.assert_allclose(min_norm(op, op.measure(jnp.asarray(x))), x, rtol=1e-5, atol=1e-6)


def test_ista_recovers_a_dct_sparse_signal_better_than_min_norm():
    size = 512
    s = np.zeros(size, np.float32)
    s[[3, 40, 200, 311]] = [4.0, -3.0, 2.0, 1.5]
    x = idct(jnp.asarray(s), norm="ortho")
    op = RandomMatrix(size, 0.3, "gaussian", seed=1)
    y = op.measure(x)
    error = lambda rec: float(jnp.linalg.norm(rec - x) / jnp.linalg.norm(x))  # noqa: E731
    assert error(ista_dct(op, y, 0.01, 300)) < 0.05 < 0.5 < error(min_norm(op, y))


def test_coherence_matches_a_direct_double_loop():
    a = 16
    for phi in (BlockSum(a, 0.5).dense(), RandomMatrix(a, 0.5, "bernoulli", seed=2).dense()):
        for name in ("dct", "dft"):
            psi = basis(name, a)
            direct = max(
                abs(np.vdot(psi[:, j], phi[i]))
                / (np.linalg.norm(phi[i]) * np.linalg.norm(psi[:, j]))
                for i in range(phi.shape[0])
                for j in range(a)
            )
            # phi is float32
            assert coherence(phi, psi) == pytest.approx(math.sqrt(a) * direct, rel=1e-6)
    # spikes vs Fourier: minimal
    assert coherence(np.eye(a)[:1], basis("dft", a)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown basis"):
        basis("wavelet", 4)


def test_layerwise_compressor_bytes_equal_the_sent_arrays_and_vmap_across_clients():
    params = {"w": np.ones((20, 5), np.float32), "b": np.ones(5, np.float32)}
    comp = LayerwiseCompressor(params, {"w": 0.3, "b": 0.5}, "gaussian", seed=4)
    updates = {
        "w": np.random.default_rng(0).standard_normal((3, 20, 5)).astype(np.float32),
        "b": np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32),
    }
    batched = jax.vmap(comp.compress)(updates)
    single = comp.compress(jax.tree_util.tree_map(lambda a: a[1], updates))
    for got, want in zip(batched, single):
        # float32 sums of 100 products: an entry near zero carries the sum's rounding, not its own
        # (the CI failure
        # of 2026-12-04 was entry 0.0154 off by 2.4e-7), so the tolerance is relative to the layer's
        # scale
        np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    sent = comp.compress(params)
    assert [y.shape[0] for y in sent] == [2, 30]  # leaves in key order: b (5 * 0.5), w (100 * 0.3)
    assert (
        traffic.compressed_upload_bytes(comp)
        == traffic.array_bytes(sent) + 4 * 2 + traffic.SEED_BYTES
    )
    block = LayerwiseCompressor(params, {"w": 0.3, "b": 0.5})
    assert (
        traffic.compressed_upload_bytes(block)
        == traffic.array_bytes(block.compress(params)) + 4 * 2
    )
    assert traffic.dense_upload_bytes(params) == traffic.array_bytes(params) == 4 * 105
    meter = traffic.TrafficMeter()
    meter.record(10, 100, 400)
    row = meter.record(5, 100, 400)
    assert (
        row["uplink_bytes"] == 500
        and meter.uplink == 1500
        and row["traffic_gb_total"] == 7500 / 1e9
    )


def test_fedavg_with_rate_one_block_compression_is_fedavg():
    params, cohort_of, fedavg = two_logistic_clients()
    cohort = cohort_of(0)
    plain = FederatedRound(fedavg)
    identity = FederatedRound(fedavg, [CompressedSensing(rates="1.0")])
    a = plain.round(plain.init(params), cohort, jax.random.key(1))[0].params
    b = identity.round(identity.init(params), cohort, jax.random.key(1))[0].params
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
    half = FederatedRound(fedavg, [CompressedSensing(rates="0.5")])
    dense = traffic.dense_upload_bytes(params)
    assert plain.upload_bytes(plain.init(params), dense) == dense == 4 * 51  # 48 weights + 3 biases
    # floor(0.5 * 3), floor(0.5 * 48), one rate per layer
    assert half.upload_bytes(half.init(params), dense) == 4 * (1 + 24) + 4 * 2


def test_loop_records_traffic_and_dynamic_rates(tmp_path):
    c = default_config()
    c.rounds, c.eval_every, c.data.num_clients = 2, 2, 20
    c.client.update(epochs=1, batch_size=50)
    c.sampling.cohort_size = 4
    c.compression.enabled = True
    summary = run_experiment(c, str(tmp_path), progress=False)
    # [0]: round 0
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))][1:]
    params_bytes = rows[0]["downlink_bytes"] / 4
    assert all(0 < r["uplink_bytes"] <= 0.5 * params_bytes * 4 + 4 * 64 for r in rows)
    assert all(set(r["compression_rates"]) <= {0.2, 0.3, 0.4, 0.5} for r in rows)
    assert summary.uplink_gb == pytest.approx(sum(r["uplink_bytes"] for r in rows) / 1e9)
    bad = default_config()
    bad.compression.update(
        enabled=True, rates="1.5", kind="dense", r_min=0.6, r_max=0.5, materialize_gb=-1.0
    )
    with pytest.raises(ValueError) as err:
        run_experiment(bad, str(tmp_path / "bad"), progress=False)
    for text in (
        "compression.rates",
        "compression.kind 'dense'",
        "r_min=0.6 exceeds",
        "compression.materialize_gb must be >= 0 (0 = never), got -1.0",
    ):
        assert text in str(err.value)


def test_a_round_where_every_client_was_dropped_keeps_the_dynamic_rate_reference():
    """Bug (CUAG-PFL sound mode, CIFAR-10): every client of a round sent a non-finite update, the
    zeroed sum became Alg. 2's reference, and the next round crashed ("the reference weights are all
    zero"). An all-zero aggregate now leaves the reference as it was, and the next round's rates are
    computable."""
    from fedjax_dp.core.uploads import ServerContext

    reference = {"w": jnp.arange(1.0, 13.0).reshape(3, 4), "b": jnp.ones(3)}
    cs = CompressedSensing(rates="dynamic", reconstruct="aggregate").specialize(reference)
    # dynamic block rates: the counts travel as an input, the measurements are padded
    inputs = cs.inputs(1)
    zero_sum = cs.padded.compress(jax.tree_util.tree_map(jnp.zeros_like, reference), inputs["rows"])
    ctx = ServerContext(
        reference,
        inputs,
        jnp.inf,
        jax.random.key(0),
        {},
        {},
        jnp.zeros(2, bool),
        jnp.zeros(2, bool),
    )
    _, new_reference, _ = cs.server(zero_sum, ctx)
    for a, b in zip(jax.tree_util.tree_leaves(new_reference), jax.tree_util.tree_leaves(reference)):
        np.testing.assert_array_equal(a, b)
    cs.specialize(new_reference)  # raised before the fix
    nonzero = cs.compressor.compress(reference)
    _, moved, _ = cs.server(nonzero, ctx._replace(kept=jnp.ones(2, bool)))
    assert float(jnp.abs(moved["w"] - cs.compressor.reconstruct(nonzero)["w"]).max()) == 0.0


def test_dynamic_block_rates_share_one_compiled_round_and_match_the_static_operators():
    """Alg. 2 picks a new rate vector most rounds; with static measurement counts each new vector
    recompiled the whole round (4 new vectors in 6 CIFAR-10 rounds: 44 s of compiling). The counts
    now travel as an input and the measurements are padded to r_max: one program (one static key,
    one trace) for every vector, the same measurements in the first b_l entries (zeros after) and
    the same reconstruction."""
    from fedjax_dp.compression.upload_transform import CompressedSensing

    cs = CompressedSensing(rates="dynamic", reconstruct="aggregate")
    first, second = (
        cs.specialize({"w": jnp.ones((40, 50)), "b": jnp.full(50, v)}) for v in (0.01, 3.0)
    )
    assert first.layer_rates() != second.layer_rates() and first.static_key() == second.static_key()
    traces = []

    @jax.jit
    def round_trip(update, rows):
        traces.append(1)
        measured = first.padded.compress(update, rows)
        return measured, first.padded.reconstruct(measured, rows)

    update = {
        "w": jax.random.normal(jax.random.key(1), (40, 50)),
        "b": jax.random.normal(jax.random.key(2), (50,)),
    }
    for specialized in (first, second):
        padded, rebuilt = round_trip(update, specialized.inputs(1)["rows"])
        static = specialized.compressor.compress(update)
        for got, want in zip(padded, static):
            np.testing.assert_allclose(got[: len(want)], want, rtol=1e-6, atol=1e-6)
            assert not np.any(np.asarray(got[len(want) :]))
        expected = specialized.compressor.reconstruct(static)
        for got, want in zip(
            jax.tree_util.tree_leaves(rebuilt), jax.tree_util.tree_leaves(expected)
        ):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert len(traces) == 1


@pytest.mark.parametrize(
    "kind,size,tile", [("gaussian", 150, 37), ("bernoulli", 150, 37), ("gaussian", 40, 4096)]
)
def test_a_materialized_random_matrix_is_the_same_operator(kind, size, tile):
    """Table 7's random matrices were regenerated tile by tile at every product (about 200 products
    per min-norm reconstruction: hours a round for cnn_pfl's dense layer). Held in memory for the
    round they are the same matrix: the same measurements, adjoint and reconstruction up to
    summation order."""
    from fedjax_dp.compression.materialized import MaterializedRandomMatrix, materialized_matrices

    op = make_operator(kind, size, 0.3, seed=5, tile=tile)
    (matrix,) = materialized_matrices([op], limit_bytes=1e9)
    held = MaterializedRandomMatrix(op, matrix)
    assert held.shape == op.shape
    x = jax.random.normal(jax.random.key(0), (size,))
    y = op.measure(x)
    np.testing.assert_allclose(held.measure(x), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(held.adjoint(y), op.adjoint(y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(min_norm(held, y), min_norm(op, y), rtol=1e-4, atol=1e-5)
    # ISTA's step, without regenerating
    assert float(held.lipschitz) == pytest.approx(op.lipschitz, rel=1e-4)
    np.testing.assert_allclose(
        ista_dct(held, y, iterations=20), ista_dct(op, y, iterations=20), rtol=1e-3, atol=1e-4
    )
    # the same draws
    np.testing.assert_allclose(np.asarray(matrix)[:, :size], op.dense(), rtol=1e-6)


def test_materialized_matrices_fit_the_limit_and_only_the_last_rounds_live(caplog):
    from fedjax_dp.compression import materialized
    from fedjax_dp.compression.materialized import matrix_bytes, materialized_matrices

    block, a, b = BlockSum(100, 0.5), RandomMatrix(100, 0.5, seed=1), RandomMatrix(200, 0.5, seed=2)
    assert matrix_bytes(a) == 4 * 50 * 100
    # b does not fit beside a
    first = materialized_matrices([block, a, b], limit_bytes=matrix_bytes(a))
    assert first[0] is None and first[1].shape == (50, 100) and first[2] is None
    again = materialized_matrices([a, b], limit_bytes=1e9)
    # a's matrix reused, not regenerated
    assert again[0] is first[1] and again[1].shape == (100, 200)
    materialized_matrices([b], limit_bytes=1e9)
    assert set(materialized._current) == {b}  # a released
    with caplog.at_level(logging.WARNING):
        assert materialized_matrices([a], limit_bytes=0) == (None,) and materialized._current == {}
    assert "does not fit compression.materialize_gb" in caplog.text  # said, not silently slow


def test_gaussian_compression_rounds_agree_with_and_without_materialized_matrices():
    """The CS upload transform passes the round's matrices as an input when they fit
    ``materialize_gb``; a DP round (clip, compress, noise, server reconstruction of the noised sum)
    gives the same model."""
    from fedjax_dp.core.uploads import fixed_denominator
    from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise

    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    data = random_client_data(np.random.default_rng(0), [6, 9, 7])
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    cohort = pack_cohort(
        x, y, [np.arange(6), np.arange(6, 15), np.arange(15, 22)], 4, 1, np.random.default_rng(0)
    )
    fedavg = FedAvg(model.per_example_loss, optax.sgd(0.1))
    results = []
    for gb in (0.0, 1.0):
        uploads = [
            CompressedSensing(
                rates="dynamic", operator="gaussian", reconstruct="aggregate", materialize_gb=gb
            ),
            FlatClip(1.0),
            GaussianNoise(((1, 0.5),)),
            fixed_denominator(3),
        ]
        runner = FederatedRound(fedavg, uploads)
        state = runner.init(params)
        assert ("matrices" in runner.specialized(state).inputs(1)[0]) == (gb > 0)
        for t in range(2):
            state = runner.round(state, cohort, jax.random.key(t))[0]
        results.append(state.params)
    for u, v in zip(*(jax.tree_util.tree_leaves(r) for r in results)):
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="materialize_gb must be >= 0, got -1"):
        CompressedSensing(operator="gaussian", materialize_gb=-1)
