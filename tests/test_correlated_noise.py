"""Correlated-noise DP-FL (issue 75): the strategies' streams against their matrices, tree
aggregation's noise covariance, sensitivity under participation against brute force, the
participation samplers' enforcement, the identity strategy against DP-FedAvg's noise bit for bit,
the reported epsilon against dp_accounting on the release's event, resume in the middle of a band,
and the refusals of bad input before any data is loaded."""

import json
import math
import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import sigint_at_round

from fedjax_dp.core.uploads import ServerContext, inputs_of, state_init
from fedjax_dp.privacy.accounting.accountant import Accountant, RoundEvent
from fedjax_dp.privacy.sampling import ParticipationSampling
from fedjax_dp.privacy.correlated import strategies, tree_aggregation
from fedjax_dp.privacy.correlated.participation import (
    Participation,
    brute_force_sensitivity,
    sensitivity,
)
from fedjax_dp.privacy.correlated.plan import NoisePlan, prefix_sensitivity
from fedjax_dp.privacy.mechanisms.upload_correlated_noise import stream_release
from fedjax_dp.privacy.settings import PrivacySettings
from fedjax_dp.privacy.tracker import calibrate_for
from fedjax_dp.privacy.ledgers.correlated import CorrelatedLedger
from fedjax_dp.privacy.mechanisms.upload_correlated_noise import CorrelatedNoise
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

N = 12
MIN_SEP = Participation("min_separation", 3, 3)


@pytest.fixture(scope="module")
def built():
    """Every strategy for N rounds under 3-min-separation, k = 3 (BLT and dense optimised once)."""
    return {name: strategies.build(name, N, MIN_SEP) for name in strategies.STRATEGIES}


SQUARE = tuple(n for n in strategies.STRATEGIES if n != "tree_honaker")


@pytest.mark.parametrize("name", SQUARE)
def test_each_streamed_noising_matrix_is_the_inverse_of_its_strategy(built, name):
    s = built[name]
    C_inverse = np.asarray(s.noising.materialize(N), np.float64)
    np.testing.assert_allclose(C_inverse @ s.matrix(), np.eye(N), atol=2e-5)
    C = s.matrix()
    assert np.allclose(C, np.tril(C)) and np.all(np.diag(C) > 0)


def test_streamed_blt_noise_equals_jax_privacys_dense_inverse_times_z(built):
    s = built["blt"]
    decay, scale, inv_decay, inv_scale = strategies._blt_parameters(N, 3, 3)
    from jax_privacy.matrix_factorization import buffered_toeplitz

    with jax.enable_x64(True):
        inverse = buffered_toeplitz.BufferedToeplitz.build(inv_decay, inv_scale)
        dense_inverse = np.asarray(inverse.materialize(N))  # jax_privacy's own dense C^{-1}
    z = np.asarray(jax.random.normal(jax.random.key(0), (N, 7)))
    state = s.noising.init_multiply(jnp.zeros(7))
    streamed = []
    for t in range(N):
        out, state = s.noising.multiply_next(jnp.asarray(z[t], jnp.float32), state)
        streamed.append(np.asarray(out))
    np.testing.assert_allclose(np.stack(streamed), dense_inverse @ z, rtol=1e-5, atol=1e-5)
    assert jax.tree_util.tree_map(jnp.shape, state) == jax.tree_util.tree_map(
        # buffers x parameters, whatever the round
        jnp.shape,
        s.noising.init_multiply(jnp.zeros(7)),
    )


def test_honakers_stream_is_its_decoder_on_the_node_draws_and_decodes_the_prefix_sums(built):
    s = built["tree_honaker"]
    C, B = s.matrix(), s.decoder()
    np.testing.assert_allclose(B @ C, np.tril(np.ones((N, N))), atol=1e-12)  # unbiased: A = B C
    depth = tree_aggregation.levels(N)
    z = np.asarray(jax.random.normal(jax.random.key(2), (N, depth, 5)))
    node_draws = np.stack([z[end - 1, level] for level, end in tree_aggregation.nodes(N)])
    state, prefix = s.noising.init_multiply(jnp.zeros(5)), np.zeros(5)
    for t in range(N):
        out, state = s.noising.multiply_next(jnp.asarray(z[t], jnp.float32), state)
        prefix = prefix + np.asarray(out)
        np.testing.assert_allclose(prefix, B[t] @ node_draws, atol=2e-5)
    # Honaker's estimate of every prefix has at most the plain tree's variance (per unit draw)
    plain = np.cumsum(np.linalg.inv(built["tree"].matrix()), axis=0)
    assert np.all((B**2).sum(axis=1) <= (plain**2).sum(axis=1) + 1e-12)


@pytest.mark.parametrize("name", ["tree", "tree_honaker"])
def test_tree_aggregation_noise_covariance_is_the_closed_form(name):
    """Prefix noise of binary-tree aggregation: cov = B B^T with A = B C (the plain tree: entry (t,
    t) = the number of nodes in t's binary decomposition, popcount t). Sample covariance within 6
    standard errors."""
    n, draws = 8, 40000
    s = strategies.build(name, n, Participation("single"))
    shape = (n, draws) if s.draws == 1 else (n, s.draws, draws)
    z = jax.random.normal(jax.random.key(1), shape)
    state = s.noising.init_multiply(jnp.zeros(draws))
    rows = []
    for t in range(n):
        out, state = s.noising.multiply_next(z[t], state)
        rows.append(out)
    prefix = np.cumsum(np.asarray(jnp.stack(rows), np.float64), axis=0)
    B = s.decoder()
    want = B @ B.T
    if name == "tree":
        np.testing.assert_allclose(np.diag(want), [bin(t).count("1") for t in range(1, n + 1)])
    got = prefix @ prefix.T / draws
    standard_error = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want**2) / draws)
    assert np.all(np.abs(got - want) <= 6 * standard_error), np.abs(got - want) / standard_error


@pytest.mark.parametrize(
    "participation",
    [
        Participation("min_separation", 3, 3),
        Participation("min_separation", 2),
        Participation("single"),
        Participation("cyclic", 4),
    ],
    ids=["b3k3", "b2", "single", "cyclic4"],
)
@pytest.mark.parametrize("name", strategies.STRATEGIES)
def test_sensitivity_under_participation_equals_brute_force(built, name, participation):
    C = built[name].matrix()
    brute = brute_force_sensitivity(C, participation)
    exact = (
        name in ("identity", "tree", "tree_restart")
        or (name == "banded" and participation.scheme in ("single", "cyclic"))
        or participation == MIN_SEP
        and name == "banded"
    )
    got = sensitivity(C, participation)
    assert got >= brute * (1 - 1e-9)
    if exact or participation.scheme in ("single", "cyclic"):
        assert got == pytest.approx(brute, rel=1e-9)
    for t in (1, 5, N):  # the prefix sensitivities of the accounting: exact or bounds, never below
        bound = prefix_sensitivity(built[name], participation, t)
        assert bound >= brute_force_sensitivity(C[:t, :t], participation) * (1 - 1e-7)


def test_a_tree_restarted_every_b_rounds_holds_one_participation_per_tree_and_streams_its_blocks():
    """DP-FTRL's TreeRestart (Kairouz et al. 2021, Sec. 4): restarted every b rounds under
    b-min-separation, a client's participations fall in different trees, so sens^2 = k (one
    unit-norm path per tree, the columns of different trees orthogonal) where one tree over the run
    pays for their overlap; its noise is the block-diagonal C's inverse times z, the trees' streams
    one after the other, and a restart clears the buffers."""
    n, b = 16, 4
    for participation in (Participation("min_separation", b), Participation("cyclic", b)):
        k = participation.participations(n)
        restarted = strategies.build("tree_restart", n, participation)
        assert restarted.period == b and restarted.buffers == tree_aggregation.levels(b)
        column_norms = np.linalg.norm(restarted.matrix(), axis=0)
        # the brute force over every pattern: the first round of each tree (norm sqrt(levels)) in
        # all k trees
        assert brute_force_sensitivity(restarted.matrix(), participation) == pytest.approx(
            math.sqrt(k) * column_norms.max(), rel=1e-12
        )
        assert sensitivity(restarted.matrix(), participation) == pytest.approx(
            brute_force_sensitivity(restarted.matrix(), participation), rel=1e-9
        )
        plain = strategies.build("tree", n, participation)
        assert sensitivity(restarted.matrix(), participation) < sensitivity(
            plain.matrix(), participation
        )
    z = np.asarray(jax.random.normal(jax.random.key(3), (n, 5)))
    one_tree = strategies.build("tree", b, Participation("single"))
    state, blocks = restarted.noising.init_multiply(jnp.zeros(5)), []
    for t in range(n):
        out, state = restarted.noising.multiply_next(jnp.asarray(z[t], jnp.float32), state)
        blocks.append(np.asarray(out))
    tree_inverse = np.asarray(one_tree.noising.materialize(b), np.float64)
    want = np.concatenate([tree_inverse @ z[start : start + b] for start in range(0, n, b)])
    np.testing.assert_allclose(np.stack(blocks), want, rtol=1e-5, atol=1e-5)
    # once per run: one tree
    assert strategies.build("tree_restart", n, Participation("single")).period == n


def prefix_rmse_at_unit_noise(C, participation):
    """sens(C) x the RMS over rounds of ||(A C^{-1})[t]||: the prefix sums' noise over z S."""
    decoder = np.tril(np.ones(C.shape)) @ np.linalg.inv(C)
    return sensitivity(C, participation) * np.sqrt(np.mean((decoder**2).sum(axis=1)))


@pytest.mark.parametrize(
    "participation", [MIN_SEP, Participation("single")], ids=["b3k3", "single"]
)
def test_the_dense_strategy_is_jax_privacys_optimum_and_no_worse_than_banded(participation):
    """``dense.optimize`` returns the strategy C itself (not its Gram matrix X = C^T C): under
    min-separation its columns have equal norm, and its prefix-sum error is at most the banded
    Toeplitz C's, a point of the same feasible set (b-banded, equal column norms; Choquette-Choo et
    al. 2023, Sec. 4)."""
    from jax_privacy.matrix_factorization import dense

    n = 24
    s = strategies.build("dense", n, participation)
    C = s.matrix()
    with jax.enable_x64(True):
        want = np.asarray(
            (
                dense.optimize(n)
                if participation.scheme == "single"
                else dense.optimize(n, bands=3, equal_norm=True)
            ),
            np.float64,
        )
    np.testing.assert_allclose(C, want, rtol=1e-9, atol=1e-12)
    norms = np.linalg.norm(C, axis=0)
    np.testing.assert_allclose(norms, norms.max(), rtol=1e-6)
    banded = strategies.build(
        "banded", n, participation, bands=3 if participation.scheme != "single" else n
    )
    assert prefix_rmse_at_unit_noise(C, participation) <= prefix_rmse_at_unit_noise(
        banded.matrix(), participation
    ) * (1 + 1e-6)


def test_banded_under_single_participation_bands_the_whole_run_by_default():
    """With each client in at most one round there is no separation to keep the bands within:
    ``dp.bands = 0`` means the run (as ``tree_restart``'s period does), not one band, which would be
    independent noise."""
    single = Participation("single")
    s = strategies.build("banded", 24, single)
    assert s.bands == 24
    identity = strategies.build("identity", 24, single)
    assert prefix_rmse_at_unit_noise(s.matrix(), single) < 0.75 * prefix_rmse_at_unit_noise(
        identity.matrix(), single
    )


def test_blt_prefix_sensitivity_is_exact_where_its_toeplitz_coefficients_decrease(built):
    s = built["blt"]
    assert np.all(np.diff(s.toeplitz_coef) <= 0)
    assert prefix_sensitivity(s, MIN_SEP, N) == pytest.approx(
        brute_force_sensitivity(s.matrix(), MIN_SEP), rel=1e-6
    )


def test_identity_strategy_adds_dp_fedavgs_noise_bit_for_bit():
    plan = NoisePlan(strategies.identity(N), Participation("single"), 1.3)
    correlated, gaussian = CorrelatedNoise(plan), GaussianNoise(((1, plan.std_over_clip),))
    total = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(5)}
    key = jax.random.key(7)

    def server(transform):
        inputs = {k: jnp.float32(v) for k, v in inputs_of(transform, 3).items()}
        ctx = ServerContext(
            state_init(transform, total), inputs, jnp.float32(0.5), key, {}, {}, None, None, key
        )
        return jax.jit(lambda t: transform.server(t, ctx)[0])(total)

    a, b = server(correlated), server(gaussian)
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(lambda x, y: bool(jnp.array_equal(x, y)), a, b)
    )


def test_the_participation_sampler_enforces_min_separation_and_the_ledger_refuses_a_broken_cohort():
    sampler = ParticipationSampling(
        30, Participation("min_separation", 4, 2), cohort_size=10, check_in_rate=0.8
    )
    plan = NoisePlan(strategies.identity(20), sampler.participation, 1.0)
    ledger, generator = CorrelatedLedger(sampler, PrivacySettings()), np.random.default_rng(0)
    seen = {i: [] for i in range(30)}
    for t in range(1, 21):
        releases = list(CorrelatedNoise(plan).releases({"round": t}, 1.0))
        ids = sampler.sample(generator, ledger.eligible(t, releases), t)
        assert len(ids) <= 10
        ledger.record(t, ids, releases)
        for i in ids:
            seen[int(i)].append(t)
    for rounds in seen.values():
        assert len(rounds) <= 2 and all(b - a >= 4 for a, b in zip(rounds, rounds[1:]))
    assert max(len(r) for r in seen.values()) == 2
    busy = max(seen, key=lambda i: seen[i][-1] if seen[i] else 0)
    releases = list(CorrelatedNoise(plan).releases({"round": 20}, 1.0))
    with pytest.raises(RuntimeError, match="against the participation scheme"):
        ledger.record(20, [busy], releases)


def test_cyclic_samplers_take_the_rounds_group():
    sampler = ParticipationSampling(10, Participation("cyclic", 3))
    assert sampler.sample(np.random.default_rng(0), None, 2).tolist() == [1, 4, 7]
    assert sampler.expected_cohort() == pytest.approx(10 / 3) and sampler.slots() == 4
    poisson = ParticipationSampling(300, Participation("cyclic_poisson", 3, rate=0.5))
    ids = poisson.sample(np.random.default_rng(0), None, 3)
    assert np.all(ids % 3 == 2) and 20 < len(ids) < 80


def test_the_amplified_bandmf_account_equals_jax_privacys_event():
    from jax_privacy.experimental.accounting import amplified_bandmf_event

    participation = Participation("cyclic_poisson", 4, rate=0.2)
    plan = NoisePlan(strategies.banded(N, 4), participation, 1.1)
    event = plan.event_through(10)
    assert event == amplified_bandmf_event(1.1, 10, num_bands=4, sampling_prob=0.2)
    reference = dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(1e-5)
    assert Accountant("pld").compose(event).epsilon(1e-5) == pytest.approx(reference, rel=1e-3)
    three = Accountant("pld").compose(RoundEvent("poisson", 1.1, sampling_rate=0.2), 3)
    assert three.epsilon(1e-5) == Accountant("pld").compose(event).epsilon(1e-5)


def _config(noise="banded", **sampling):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.checkpoint_every = "dp_fedavg", 6, 3, 3
    c.data.num_clients = 24
    c.client.update(epochs=1, batch_size=20)
    c.sampling.update(
        method="min_separation", min_separation=2, cohort_size=6, check_in_rate=0.7, **sampling
    )
    c.dp.update(noise=noise, noise_multiplier=0.9)
    return c


def test_the_epsilon_reported_is_dp_accountings_on_the_releases_event(tmp_path):
    c = _config()
    c.privacy.accountant = "pld"
    summary = run_experiment(c, str(tmp_path / "run"), progress=False)
    with open(tmp_path / "run" / "privacy.json") as f:
        privacy = json.load(f)
    release = privacy["releases"][0]
    assert release["accumulation"].startswith("one event") and privacy["formal"]
    multiplier = privacy["accounting"]["stream_event_multiplier"]
    assert release["event"] == str(dp_accounting.GaussianDpEvent(multiplier))
    direct = (
        dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
        .compose(dp_accounting.GaussianDpEvent(multiplier))
        .get_epsilon(c.privacy.delta)
    )
    assert summary.epsilon == pytest.approx(direct, rel=1e-9)
    # the whole stream's z over the bound through round 6 of 6: the plan's own multiplier
    assert multiplier == pytest.approx(0.9, rel=1e-12)
    assert privacy["accounting"]["prefix_sum_rmse_over_z_clip"] > 0
    assert privacy["accounting"]["most_participations_of_a_client"] <= 3


def test_a_run_resumed_in_the_middle_of_a_band_equals_the_uninterrupted_one(tmp_path, monkeypatch):
    c = _config()
    run_experiment(c, str(tmp_path / "a"), progress=False)
    with monkeypatch.context() as m:
        sigint_at_round(m, 3)
        stopped = run_experiment(_config(), str(tmp_path / "b"), progress=False)
    assert stopped.interrupted and stopped.rounds == 3
    run_experiment(_config(), str(tmp_path / "b"), progress=False, resume=True)
    for name in ("metrics.jsonl", "privacy.json"):
        with open(tmp_path / "a" / name, "rb") as f, open(tmp_path / "b" / name, "rb") as g:
            assert f.read() == g.read(), name


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(sampling=dict(method="poisson")),
            r"dp.noise='banded' is calibrated for a participation scheme.*"
            r"sampling.method='poisson'",
        ),
        (dict(dp=dict(bands=3)), r"dp.bands=3 > sampling.min_separation=2"),
        (dict(dp=dict(strategy_rounds=4)), r"dp.strategy_rounds=4 < rounds=6"),
        (
            dict(dp=dict(noise="tree_restart", tree_restart=9)),
            r"dp.tree_restart=9 > the strategy's rounds 6",
        ),
        (
            dict(dp=dict(noise="tree_restart", tree_restart=-1)),
            r"dp.tree_restart must be an integer >= 0.*-1",
        ),
        (dict(dp=dict(noise_mode="local")), r"dp.noise='banded' with dp.noise_mode='local'"),
        (
            dict(dp=dict(noise="blt"), sampling=dict(method="cyclic_poisson")),
            r"dp.noise='blt' with sampling.method=" r"'cyclic_poisson'",
        ),
        (
            dict(privacy=dict(target_epsilon=1e-4)),
            r"privacy.target_epsilon=0.0001: no noise multiplier",
        ),
        (
            dict(algorithm="fedavg"),
            r"sampling.method='min_separation' is a participation scheme.*algorithm='fedavg'",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_keys_before_any_data_is_loaded(
    tmp_path, monkeypatch, overrides, message
):
    import fedjax_dp.training.run_context as run_context

    monkeypatch.setattr(
        run_context, "build_dataset", lambda *a, **k: pytest.fail("data loaded before the check")
    )
    c = _config()
    for section, values in overrides.items():
        if isinstance(values, dict):
            c[section].update(values)
        else:
            c[section] = values
    if c.algorithm == "fedavg":
        c.dp.noise = "gaussian"
    with pytest.raises(ValueError, match=message):
        run_experiment(c, str(tmp_path / "bad"), progress=False)


def calibrate(rounds, participation, epsilon, delta, accountant):
    """The correlated ledger's calibration of the whole stream (``calibrate_for``)."""
    sampler = ParticipationSampling(100, participation, cohort_size=10)
    settings = PrivacySettings(delta=delta, accountant=accountant)
    return calibrate_for(
        lambda z: [stream_release(participation, z, rounds)], settings, sampler, rounds, epsilon
    )


def test_calibration_meets_the_target_for_the_whole_stream():
    z = calibrate(40, Participation("min_separation", 4), 2.0, 1e-5, "pld")
    assert Accountant("pld").compose(RoundEvent("full", z)).epsilon(1e-5) == pytest.approx(
        2.0, abs=2e-3
    )
    amplified = calibrate(40, Participation("cyclic_poisson", 4, rate=0.3), 2.0, 1e-5, "pld")
    assert Accountant("pld").compose(
        RoundEvent("poisson", amplified, sampling_rate=0.3), 10
    ).epsilon(1e-5) == pytest.approx(2.0, abs=2e-3)
    assert amplified < z * math.sqrt(10)  # amplification buys noise
