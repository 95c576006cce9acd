"""Seed 003 (local mini-batch gradient DP with per-client thresholds, history- and
correlation-weighted aggregation): ledgers against dp_accounting, thresholds never exceeded, the
aggregation by hand, the step noise a client's own, resume, bad input."""

import json

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dp_accounting import rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from fedjax_dp.core.correlation_weights import CorrelationWeights, correlation_weights
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.core.uploads import ServerContext
from fedjax_dp.privacy.accounting.accountant import replace_one_scale
from fedjax_dp.privacy.ledgers.example_book import LEDGER_ORDERS, ExampleBook
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient
from fedjax_dp.training.default_config import default_config


def _ledger(
    sizes=(200,),
    thresholds=4.0,
    adaptive=True,
    steps=5,
    z0=1.0,
    zmax=8.0,
    rounds=10,
    rate=0.5,
    **options,
):
    return ExampleBook(
        client_sizes=np.asarray(sizes),
        batch_size=10,
        steps=steps,
        thresholds=thresholds,
        delta=1e-5,
        base_multiplier=z0,
        max_multiplier=zmax,
        participation_rate=rate,
        rounds=rounds,
        adaptive=adaptive,
        **options,
    )


def test_the_ledger_is_dp_accountings_subsampled_gaussian_over_the_steps_run():
    ledger = _ledger(thresholds=50.0, adaptive=False, z0=1.3)
    for t in (1, 2, 3):
        ledger.record([0], t)
    direct = rdp.RdpAccountant(
        orders=list(LEDGER_ORDERS),
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    step = dp_accounting.SampledWithoutReplacementDpEvent(
        200, 10, dp_accounting.GaussianDpEvent(1.3 * replace_one_scale())
    )
    direct.compose(step, 3 * 5)
    assert ledger.epsilons()[0] == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)
    assert ledger.steps_run[0] == 15


def _cut_probability(cap, size, batch, steps):
    """scipy's binomial tail of a Poisson step (rate B / n) over n and the add-one neighbour's n +
    1, times the
    steps: the total variation between cut and uncut batches (issue 74, F03)."""
    from scipy import stats

    return steps * max(
        stats.binom.sf(cap, size, batch / size), stats.binom.sf(cap, size + 1, batch / size)
    )


def _charged(epsilon, epsilon_at, eta, delta=1e-5):
    """Whether (epsilon, delta) holds for the cut mechanism: epsilon >= the uncut one's at delta -
    (1 + e^eps) eta."""
    return epsilon >= epsilon_at(delta - (1 + np.exp(epsilon)) * eta)


@pytest.mark.parametrize("per_example,effective", [(True, 1.0), (False, 0.5)])
def test_the_poisson_ledger_is_dp_accountings_poisson_gaussian_with_the_cut_charged_to_delta(
    per_example, effective
):
    """Poisson step batches: add/remove one example, multiplier z (per-example clip, sensitivity C)
    or z / 2 (clipped batch mean, 2C); each client's epsilon is the least with eps >=
    eps_uncut(delta - (1 + e^eps) eta), eta the cut's probability over its steps, both computed here
    by dp_accounting and scipy; the PLD ledger composes dp_accounting's PLD of the same steps (two
    noise levels) and is below the RDP one."""
    from dp_accounting.pld import pld_privacy_accountant

    from fedjax_dp.privacy.ledgers.example_book import LEDGER_PLD_DISCRETIZATION

    ledgers = {
        kind: _ledger(
            thresholds=50.0,
            z0=1.3,
            zmax=2.6,
            adaptive=False,
            step_sampling="poisson",
            per_example=per_example,
            accountant=kind,
        )
        for kind in ("rdp", "pld")
    }
    for ledger in ledgers.values():
        ledger.record([0], 1)
        ledger.record([0], 2, z=[2.6])
    eta = _cut_probability(ledgers["rdp"].batch_cap, 200, 10, 10)
    assert 0 < eta < 1e-7
    event = lambda z: dp_accounting.PoissonSampledDpEvent(
        10 / 200, dp_accounting.GaussianDpEvent(z * effective)
    )  # noqa: E731
    direct = rdp.RdpAccountant(orders=list(LEDGER_ORDERS))
    direct.compose(event(1.3), 5).compose(event(2.6), 5)
    got = ledgers["rdp"].epsilons()[0]
    assert _charged(got, direct.get_epsilon, eta) and not _charged(
        got * (1 - 1e-6), direct.get_epsilon, eta
    )
    assert got > direct.get_epsilon(1e-5)  # the cut costs something
    pld = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=LEDGER_PLD_DISCRETIZATION
    )
    pld.compose(event(1.3), 5).compose(event(2.6), 5)
    got = ledgers["pld"].pld_epsilons()[0]
    assert _charged(got, pld.get_epsilon, eta) and got <= pld.get_epsilon(
        1e-5 - (1 + np.exp(got)) * eta
    ) * (1 + 1e-6)
    assert ledgers["pld"].epsilons()[0] < ledgers["rdp"].epsilons()[0]


def test_a_poisson_client_at_its_threshold_spends_no_more_than_delta_once_the_cut_is_charged():
    """Issue 74, F03: n_k = 50, B = 16, 300 steps, threshold 8. The old cap (the n-point tail only)
    and charge (eta, not (1 + e^eps) eta) gave a true delta of 5.4e-4 for a reported 1e-5; now the
    delta the reported epsilon leaves for the uncut mechanism (dp_accounting) plus the cut's charge
    (scipy) is within 1e-5."""
    ledger = ExampleBook(
        client_sizes=np.asarray([50]),
        batch_size=16,
        steps=30,
        thresholds=8.0,
        delta=1e-5,
        base_multiplier=0.9,
        max_multiplier=8.0,
        participation_rate=1.0,
        rounds=10,
        step_sampling="poisson",
    )
    for t in range(1, 11):
        if ledger.eligible(t)[0]:
            ledger.record([0], t)
    eps = ledger.epsilons()[0]
    assert 6 < eps <= 8.0 and ledger.steps_run[0] >= 150
    eta = _cut_probability(ledger.batch_cap, 50, 16, int(ledger.steps_run[0]))
    direct = rdp.RdpAccountant(orders=list(LEDGER_ORDERS))
    for z, count in ledger.participations[0].items():
        direct.compose(
            dp_accounting.PoissonSampledDpEvent(16 / 50, dp_accounting.GaussianDpEvent(z)),
            count * 30,
        )
    assert direct.get_delta(eps) + (1 + np.exp(eps)) * eta <= 1e-5
    # the design
    assert _cut_probability(ledger.batch_cap, 50, 16, 300) * (1 + np.exp(8.0)) <= 0.01 * 1e-5


@pytest.mark.parametrize("z,q,count", [(1.3, 0.05, 5), (0.8, 0.2, 40), (4.0, 0.01, 300)])
def test_the_ledgers_cached_step_plds_compose_to_dp_accountings_own_to_the_bit(z, q, count):
    """The ledger builds a step's PLD once per (n_k, z) and self-composes it with truncation bounds
    from moments cached per PMF: each count's PMF and epsilons are those of dp_accounting's uncached
    ``from_gaussian_mechanism(...).self_compose(count)``, the second count from the cached step
    PLD."""
    from dp_accounting.pld import privacy_loss_distribution

    from fedjax_dp.privacy.accounting.accountant import RoundEvent
    from fedjax_dp.privacy.ledgers.example_book import LEDGER_PLD_DISCRETIZATION, _steps_pld

    event = RoundEvent("poisson", z, sampling_rate=q)
    for steps in (count, 3 * count):
        want = privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=z,
            sampling_prob=q,
            value_discretization_interval=LEDGER_PLD_DISCRETIZATION,
            neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        ).self_compose(steps)
        got = _steps_pld(event, steps)
        for a, b in ((got._pmf_add, want._pmf_add), (got._pmf_remove, want._pmf_remove)):
            np.testing.assert_array_equal(a._probs, b._probs)
            assert (a._lower_loss, a._infinity_mass) == (b._lower_loss, b._infinity_mass)
        for delta in (1e-5, 1e-8):
            assert got.get_epsilon_for_delta(delta) == want.get_epsilon_for_delta(delta)


def test_a_pld_ledger_decides_on_pld_so_a_client_spends_its_threshold_by_pld():
    """With ``accountant='pld'`` the schedule and the stop use the PLD bound the run reports: a
    client taking part in every round runs until one more participation at z_max would pass its
    threshold by PLD, and ends closer to it (by PLD) than under RDP decisions, which stop it early
    because RDP is looser."""
    spent = {}
    for kind in ("rdp", "pld"):
        ledger = _ledger(
            thresholds=1.0, rounds=12, rate=0.25, step_sampling="poisson", accountant=kind, zmax=4.0
        )
        for t in range(1, 13):
            if ledger.eligible(t)[0]:
                ledger.record([0], t)
        spent[kind] = ledger
    pld = spent["pld"]
    final = pld.pld_epsilons()[0]
    assert final <= 1.0 and pld.stopped_round[0] > 0
    # stopped because one more participation would pass it by PLD
    assert not pld._fits(0, pld.grid[-1], 1)
    assert final > spent["rdp"].pld_epsilons()[0] + 0.1
    # the same threshold with less noise in every participation
    rdp_z = spent["rdp"].multipliers_used
    assert (
        np.all(np.array(pld.multipliers_used[: len(rdp_z)]) <= rdp_z)
        and pld.multipliers_used[0] < rdp_z[0]
    )
    assert pld.steps_run[0] >= spent["rdp"].steps_run[0]


@pytest.mark.parametrize(
    "sizes,batch,steps,epsilon",
    [((30, 200, 5000), 10, 100, 4.0), ((64,), 16, 3000, 8.0), ((16, 40), 16, 50, 1.0)],
)
def test_the_poisson_cap_is_the_least_that_keeps_the_charged_cut_within_its_share_of_delta(
    sizes, batch, steps, epsilon
):
    """(1 + e^eps) times the cut's probability over n and n + 1 points (scipy) within 1 % of delta;
    n = B = 16 takes every example, so only the neighbour's 17th can be cut: the cap is 17."""
    from fedjax_dp.privacy.accounting.poisson_truncation import batch_cap

    cap = batch_cap(sizes, batch, steps, 1e-5, epsilon)
    charged = lambda c: (
        (1 + np.exp(epsilon)) * max(_cut_probability(c, n, batch, steps) for n in sizes)
    )  # noqa: E731
    assert charged(cap) <= 0.01 * 1e-5 < charged(cap - 1)
    if 16 in sizes:
        assert cap >= 17


def test_poisson_steps_refuse_a_client_smaller_than_the_expected_batch_by_name():
    """B / n_k is the inclusion probability: a FEMNIST writer with 4 examples and B = 16 crashed
    with 'cannot convert float NaN to integer' while the cap was computed."""
    from fedjax_dp.privacy.accounting.poisson_truncation import batch_cap

    with pytest.raises(
        ValueError,
        match=r"batch size B=16 is larger than the data of 2 clients \(e.g. 4 examples\)",
    ):
        batch_cap([4, 100, 7], 16, 100, 1e-5, 4.0)


def test_poisson_packing_takes_each_example_with_probability_b_over_n():
    from fedjax_dp.data.packing import pack_poisson_cohort

    x, y = np.arange(400, dtype=np.float32)[:, None], np.zeros(400, np.int32)
    clients = [np.arange(0, 40), np.arange(40, 400)]
    cohort = pack_poisson_cohort(x, y, clients, 8, 2000, 30, np.random.default_rng(0), num_slots=3)
    assert cohort["mask"].shape == (3, 2000, 30) and not cohort["mask"][2].any()
    for c, idx in enumerate(clients):
        taken = cohort["example_index"][c][cohort["mask"][c]]
        assert set(taken) <= set(idx)
        # each example: Bernoulli(8 / n)
        frequency = np.bincount(taken - idx[0], minlength=len(idx)) / 2000
        p = 8 / len(idx)
        assert abs(frequency.mean() - p) < 4 * np.sqrt(p * (1 - p) / (2000 * len(idx)))
        sizes = cohort["mask"][c].sum(axis=1)
        assert abs(sizes.mean() - 8) < 0.3 and sizes.max() <= 30  # expected B; never beyond the cap
        np.testing.assert_array_equal(cohort["batches"]["x"][c][cohort["mask"][c]][:, 0], taken)


def test_a_poisson_step_divides_the_noised_sum_by_the_expected_batch_not_the_padding():
    model_loss = lambda p, batch, key: 0.5 * jnp.sum((batch["x"] * p["w"]) ** 2, axis=-1)  # noqa: E731
    params, batch = {"w": jnp.ones(3)}, {"x": jnp.ones((12, 3)) * 0.1}
    mask = jnp.arange(12) < 5  # 5 real examples in 12 slots
    for normalizer, want in ((8, 5 / 8), (0, 5 / 12)):
        _, grads = ClippedNoisyGradient(100.0, 0.0, normalizer=normalizer)(
            model_loss, params, batch, mask, jax.random.key(0)
        )
        np.testing.assert_allclose(grads["w"], 0.01 * want * np.ones(3), rtol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    thresholds=st.lists(st.floats(0.3, 6.0), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
    schedule=st.sampled_from(["adaptive", "z0", "calibrated"]),
    rate=st.floats(0.2, 1.0),
    poisson=st.booleans(),
)
def test_no_client_ever_exceeds_its_threshold_and_a_spent_client_is_not_sampled_again(
    thresholds, seed, schedule, rate, poisson
):
    ledger = _ledger(
        sizes=(50, 80, 120, 400),
        thresholds=np.array(thresholds),
        adaptive=schedule == "adaptive",
        calibrated=schedule == "calibrated",
        rounds=12,
        rate=rate,
        step_sampling="poisson" if poisson else "fixed",
        accountant="pld" if poisson else "rdp",
    )
    rng = np.random.default_rng(seed)
    for t in range(1, 13):
        eligible = ledger.eligible(t)
        stopped = ledger.stopped_round > 0
        assert not np.any(eligible & stopped)
        ids = [k for k in np.flatnonzero(eligible) if rng.random() < rate]
        ledger.record(ids, t)
        assert np.all(ledger.epsilons() <= np.array(thresholds) + 1e-9)


def test_noise_rises_as_the_spent_loss_approaches_the_threshold():
    """A client expected in a quarter of the rounds takes part in every one: its spent loss runs
    ahead of the schedule, so each participation must afford the same remaining count with less
    budget."""
    ledger = _ledger(thresholds=3.0, rounds=20, rate=0.25)
    used = [float(ledger.record([0], t)[0]) for t in range(1, 9)]
    assert used[0] < used[-1] and all(a <= b for a, b in zip(used, used[1:]))
    z = ledger.grid
    k = int(np.flatnonzero(z == ledger.multipliers([0], 9)[0])[0])
    expected = 3.0  # rate 0.25, T - t + 1 = 12 rounds left
    # the least noise on the grid that fits
    assert k == 0 or not ledger._fits(0, z[k - 1], expected)


def test_a_calibrated_fixed_z_is_each_clients_least_z_for_its_expected_participations_and_kept():
    """The fixed-noise baseline for unequal clients (natural partitions): a small client gets more
    noise than a large one, each the least z (to 0.1 %) whose q T = 3 participations fit its
    threshold, chosen before its first participation; it does not move as the client runs ahead of
    the schedule (the adaptive rule would raise it), and the client stops where one more
    participation at its z would not fit."""
    sizes, rate, rounds = (40, 100, 400), 0.25, 12
    ledger = _ledger(
        sizes=sizes,
        thresholds=3.0,
        adaptive=False,
        calibrated=True,
        rounds=rounds,
        rate=rate,
        zmax=20.0,
    )
    chosen = ledger.multipliers([0, 1, 2], 1)
    assert chosen[0] > chosen[1] > chosen[2]
    # by the ledger's own accountant: 3 participations fit, 0.1 % less noise not
    for k, z in enumerate(chosen):
        fresh = _ledger(
            sizes=(sizes[k],), thresholds=3.0, adaptive=True, rounds=rounds, rate=rate, zmax=20.0
        )
        assert fresh._fits(0, z, rate * rounds) and (
            z == 1.0 or not fresh._fits(0, z / 1.001, rate * rounds)
        )
    used = []
    # client 0 takes part every round while eligible: 4x the expected rate
    for t in range(1, rounds + 1):
        if ledger.eligible(t)[0]:
            used.append(float(ledger.record([0], t)[0]))
    assert set(used) == {chosen[0]} and len(used) >= 3 and ledger.stopped_round[0] > 0
    assert ledger.epsilons()[0] <= 3.0 and not ledger._fits(0, chosen[0], 1)


def test_a_calibrated_fixed_z_needs_the_fixed_noise_baseline():
    with pytest.raises(ValueError, match="needs adaptive=False"):
        _ledger(adaptive=True, calibrated=True)


def test_history_and_correlation_weights_by_hand():
    uploads = {"w": jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [9.0, 9.0]])}
    kept = jnp.array([True, True, True, False])
    weights, cosine = correlation_weights(uploads, kept, 2.0)
    flat = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    mean = flat.mean(0)
    cos = flat @ mean / (np.linalg.norm(flat, axis=1) * np.linalg.norm(mean))
    want = np.exp(2 * cos) / np.exp(2 * cos).sum()
    np.testing.assert_allclose(weights[:3], want, rtol=1e-6)
    assert float(weights[3]) == 0.0
    ctx = ServerContext((), {}, jnp.inf, None, {}, {}, kept, kept)
    scaled, _, _ = CorrelationWeights(0.0).cohort(uploads, ctx)  # tau = 0: the plain mean after / K
    np.testing.assert_allclose(np.asarray(scaled["w"][:3]).sum(0) / 3, mean, rtol=1e-6)


def test_alpha_one_and_uniform_weights_is_the_plain_mean_and_alpha_scales_it(tmp_path):
    from fedjax_dp.algorithms.ldp_minibatch import build_ldp_minibatch
    from fedjax_dp.algorithms.registry import BuildContext
    from fedjax_dp.core.round import FederatedRound
    from fedjax_dp.data.packing import pack_sampled_cohort
    from fedjax_dp.models import get_model

    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 4, 4, 1)).astype(np.float32), rng.integers(0, 3, 60)
    cohort = pack_sampled_cohort(
        x, y, [np.arange(20), np.arange(20, 40), np.arange(40, 60)], 5, 3, rng
    )
    from fedjax_dp.core.round import STEP_NOISE, client_inputs

    def runner_for(**ldp):
        cfg = default_config()
        cfg.ldp.update(local_steps=3, **ldp)
        cfg.client.learning_rate = 0.1
        algorithm, uploads = build_ldp_minibatch(BuildContext(cfg, model, 3))
        return FederatedRound(algorithm, uploads), uploads

    # each client's noised upload, from a chain that keeps them stacked (tau = 0: weights 1/K)
    stacked, uploads = runner_for(weighting="correlation", temperature=0.0)
    state = stacked.init(params)
    engine, _ = stacked._program(uploads)
    shared = (stacked.algorithm.broadcast(state), state.uploads, uploads.inputs(1))
    step_noise = np.full(3, 0.5, np.float32)
    _, per_client = engine(
        shared, {**client_inputs(cohort, jax.random.key(1)), STEP_NOISE: step_noise}
    )
    mean = jax.tree_util.tree_map(lambda u: u.mean(0), per_client["upload"])
    for alpha in (1.0, 0.25):
        runner, _ = runner_for(alpha=alpha, weighting="uniform")
        new = runner(runner.init(params), cohort, jax.random.key(1), step_noise=step_noise).state
        delta = jax.tree_util.tree_map(jnp.subtract, new.params, params)
        for got, want in zip(jax.tree_util.tree_leaves(delta), jax.tree_util.tree_leaves(mean)):
            np.testing.assert_allclose(got, alpha * want, rtol=1e-5, atol=1e-7)


def test_the_step_noise_is_the_clients_own_multiplier_and_noise_key():
    from fedjax_dp.models import get_model

    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    batches = {"x": jnp.zeros((1, 4, 4, 4, 1)), "y": jnp.zeros((1, 4), jnp.int32)}
    mask = jnp.ones((1, 4), bool)
    train = make_local_trainer(
        model.per_example_loss, optax.sgd(1.0), gradient_hook=ClippedNoisyGradient(1.0, 99.0)
    )
    noiseless, _ = train(
        params, batches, mask, jax.random.key(1), noise_key=jax.random.key(2), noise_multiplier=0.0
    )
    stds = []
    for z in (0.5, 2.0):
        samples = jax.vmap(
            lambda k: jax.flatten_util.ravel_pytree(
                train(params, batches, mask, jax.random.key(1), noise_key=k, noise_multiplier=z)[0]
            )[0]
        )(jax.random.split(jax.random.key(3), 400))
        stds.append(float(jnp.std(samples - jax.flatten_util.ravel_pytree(noiseless)[0])))
    # one step of lr 1: noise N(0, (z C)^2) / B with B = 4
    np.testing.assert_allclose(stds, [0.5 / 4, 2.0 / 4], rtol=0.05)


def _ldp_config(**ldp):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.checkpoint_every = "ldp_minibatch", 4, 2, 2
    c.data.num_clients, c.model.name, c.sampling.cohort_size = 12, "logistic", 4
    c.client.update(batch_size=10, learning_rate=0.1)
    c.server_data.overlap = 0.0
    c.ldp.update(local_steps=3, thresholds="1,3", **ldp)
    return c


def test_a_run_reports_per_client_epsilons_and_resume_restores_every_ledger(tmp_path, monkeypatch):
    from fedjax_dp.training.loop import run_experiment
    from conftest import sigint_at_round

    full = run_experiment(_ldp_config(), str(tmp_path / "full"), progress=False)
    with monkeypatch.context() as m:
        sigint_at_round(m, 2)
        assert run_experiment(_ldp_config(), str(tmp_path / "resumed"), progress=False).interrupted
    resumed = run_experiment(_ldp_config(), str(tmp_path / "resumed"), progress=False, resume=True)
    a, b = (json.load(open(tmp_path / d / "privacy.json")) for d in ("full", "resumed"))
    assert a["epsilons"] == b["epsilons"] and full.epsilon == resumed.epsilon
    assert a["formal"] is True and a["unit"] == "example" and a["epsilon"] <= 3.0
    # [0]: round 0
    rows = [json.loads(line) for line in open(tmp_path / "full" / "metrics.jsonl")][1:]
    assert "validation_accuracy" in rows[1] and "max_client_weight" in rows[0]


def test_a_poisson_pld_run_reports_what_ran_and_resumes_its_ledgers(tmp_path, monkeypatch):
    from fedjax_dp.training.loop import run_experiment
    from conftest import sigint_at_round

    def config():
        c = _ldp_config(step_sampling="poisson")
        c.privacy.accountant = "pld"
        return c

    full = run_experiment(config(), str(tmp_path / "full"), progress=False)
    with monkeypatch.context() as m:
        sigint_at_round(m, 2)
        assert run_experiment(config(), str(tmp_path / "resumed"), progress=False).interrupted
    resumed = run_experiment(config(), str(tmp_path / "resumed"), progress=False, resume=True)
    a, b = (json.load(open(tmp_path / d / "privacy.json")) for d in ("full", "resumed"))
    assert a["epsilons"] == b["epsilons"] and full.epsilon == resumed.epsilon
    assert (
        a["neighboring_relation"] == "add-or-remove-one"
        and a["accountant"] == "per-client PLD ledger"
    )
    assert a["accounting"]["step_sampling"] == "poisson" and a["accounting"]["batch_cap"] > 10
    assert 0 < a["epsilon"] <= 3.0 and a["formal"] is True


@pytest.mark.parametrize(
    "path,value,message",
    [
        ("ldp__thresholds", "0,2", "every threshold epsilon_n must be > 0"),
        ("ldp__clip_norm", 0.0, "ldp.clip_norm C must be > 0"),
        ("client__learning_rate", -0.01, "client.learning_rate"),
        ("ldp__alpha", 1.5, r"ldp.alpha must lie in \(0, 1\]"),
        ("server_data__overlap", -1.0, "must be held out of every client's data"),
        ("ldp__step_sampling", "shuffle", "ldp.step_sampling 'shuffle' unknown"),
        ("privacy__accountant", "gdp", "privacy.accountant 'gdp' unknown"),
        ("ldp__fixed_noise", "median", "ldp.fixed_noise 'median' unknown"),
        ("ldp__fixed_noise", "calibrated", "set ldp.adaptive=False, got ldp.adaptive=True"),
    ],
)
def test_bad_input_is_refused_by_name_before_training(path, value, message):
    from fedjax_dp.training.config_validation import validate_config

    c = _ldp_config()
    section, key = path.split("__")
    c[section][key] = value
    with pytest.raises(ValueError, match=message) as refused:
        validate_config(c)
    problems = [line for line in str(refused.value).splitlines() if line.lstrip().startswith("- ")]
    # each problem said once
    assert len([p for p in problems if f"{section}.{key}" in p]) == 1, problems


def test_a_batch_larger_than_a_clients_data_is_refused_before_training(tmp_path):
    from fedjax_dp.training.loop import run_experiment

    c = _ldp_config()
    c.client.batch_size = 10_000
    with pytest.raises(
        ValueError,
        match=(
            "client.batch_size=10000: each local step draws 10000 examples without replacement .*"
            " more than the training data of"
        ),
    ):
        run_experiment(c, str(tmp_path / "run"), progress=False)


@pytest.mark.parametrize(
    "per_example,step_sampling", [(True, "fixed"), (False, "fixed"), (True, "poisson")]
)
def test_the_clients_run_the_configured_steps_and_clip_and_the_ledger_accounts_what_they_run(
    per_example, step_sampling
):
    """Regression (2026-11-28): a field added to FedAvg (``deferred_dense_rate``) shifted
    LdpMinibatch's positional arguments, so the clients ran ``client.batch_size`` steps (not
    ``ldp.local_steps``), clipped at ``float(per_example)`` (0 for the batch-mean clip: no training
    at all) and never Poisson-sampled, while the ledgers, read from the config, accounted
    ``ldp.local_steps`` steps of the configured sampling. The built clients must hold the config's
    mechanism, and the ledgers must be built from the clients."""
    import types

    from fedjax_dp.algorithms.ldp_minibatch import build_ldp_minibatch, make_ledger
    from fedjax_dp.algorithms.registry import BuildContext
    from fedjax_dp.core.round import STEP_NOISE, client_inputs
    from fedjax_dp.data.packing import pack_sampled_cohort
    from fedjax_dp.models import get_model
    from fedjax_dp.privacy.accounting.poisson_truncation import batch_cap

    cfg = _ldp_config(clip_norm=0.7, per_example=per_example, step_sampling=step_sampling)
    cfg.client.learning_rate = 1.0
    sizes = (40,) * cfg.data.num_clients
    model = get_model("logistic", (4, 4, 1), 3)
    algorithm, _ = build_ldp_minibatch(BuildContext(cfg, model, len(sizes), client_sizes=sizes))
    # the largest threshold
    cap = (
        batch_cap(np.asarray(sizes), 10, cfg.rounds * 3, cfg.privacy.delta, 3.0)
        if step_sampling == "poisson"
        else 0
    )
    assert (algorithm.local_steps, algorithm.requirements.sampled_steps, algorithm.clip_norm) == (
        3,
        3,
        0.7,
    )
    assert algorithm.per_example is per_example and algorithm.batch_size == 10
    assert algorithm.poisson_batch_cap == algorithm.requirements.poisson_batch_cap == cap

    dataset = types.SimpleNamespace(num_clients=len(sizes), train_sizes=lambda: np.asarray(sizes))
    accounting = make_ledger(cfg, dataset, algorithm)
    assert (
        accounting.ledger.steps,
        accounting.ledger.step_sampling,
        accounting.ledger.per_example,
    ) == (3, step_sampling, per_example)
    assert accounting.clip_norm == 0.7 and accounting.per_example is per_example

    # what one client does: three steps of lr 1, each a clipped gradient (noise 0): 0 < ||Delta|| <=
    # 3 C
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    x, y = 30 * rng.normal(size=(40, 4, 4, 1)).astype(np.float32), rng.integers(0, 3, 40)
    cohort = pack_sampled_cohort(x, y, [np.arange(40)], 10, 3, rng)
    client = jax.tree_util.tree_map(
        lambda v: v[0],
        {**client_inputs(cohort, jax.random.key(1)), STEP_NOISE: np.zeros(1, np.float32)},
    )
    out = algorithm.client_update((params, jnp.int32(0)), client, None, jax.random.key(2))
    norm = float(jnp.linalg.norm(jax.flatten_util.ravel_pytree(out.upload)[0]))
    assert 0.1 < norm <= 3 * 0.7 * (1 + 1e-5)
