"""Distributed DP under a simulated secure aggregation: modular sums, the rotation, conditional
rounding, the discrete samplers, the accounting of each paper's bound, the pipeline against central
noise, dropouts, and the config's refusals before any data loads."""

from __future__ import annotations

import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special, stats

from fedjax_dp.core.uploads import ClientContext, ServerContext
from fedjax_dp.privacy.accounting.accountant import Accountant, RoundEvent
from fedjax_dp.privacy.distributed import modular, rotation, rounding
from fedjax_dp.privacy.distributed.discrete_noise import discrete_gaussian, skellam
from fedjax_dp.privacy.distributed.poisson import poisson
from fedjax_dp.privacy.distributed.events import (
    DistributedDiscreteGaussianDpEvent,
    SkellamDpEvent,
)
from fedjax_dp.privacy.distributed.plan import DistributedPlan
from fedjax_dp.privacy.distributed.transform import DistributedNoise


def test_the_modular_sum_is_the_plain_sum_until_it_wraps_then_wraps_as_modular_arithmetic_says():
    rng = np.random.default_rng(0)
    for bits in (8, 16, 31, 32):
        values = rng.integers(-(2 ** (bits - 3)), 2 ** (bits - 3), size=(40, 64))
        if bits == 32:
            values = rng.integers(-(2**28), 2**28, size=(40, 64))
        shares = modular.reduce(jnp.asarray(values, jnp.int32), bits)
        total = modular.to_signed(jnp.sum(shares, axis=0), bits)  # int32 sum, wrapping at 2^32
        exact = [int(v) for v in values.sum(axis=0)]  # Python integers: no overflow
        half = 2 ** (bits - 1)
        expected = [((v + half) % 2**bits) - half for v in exact]
        assert np.asarray(total).tolist() == expected
        unwrapped = [v for v in exact if -half <= v < half]
        assert len(unwrapped) > 0 and all(
            t == v for t, v in zip(np.asarray(total).tolist(), exact) if -half <= v < half
        )
    # a sum that leaves the range wraps by exactly 2^bits, and is flagged
    big = jnp.asarray([[100, -100]] * 3, jnp.int32)  # sums 300, -300 at 8 bits: range [-128, 128)
    assert np.asarray(modular.to_signed(jnp.sum(modular.reduce(big, 8), axis=0), 8)).tolist() == [
        300 - 256,
        -300 + 256,
    ]
    assert np.asarray(modular.wrapped(jnp.asarray([300.0, -300.0, 127.0, -128.0]), 8)).tolist() == [
        True,
        True,
        False,
        False,
    ]


def test_the_rotation_keeps_norms_and_inverts_to_float32_precision():
    x = jax.random.normal(jax.random.key(0), (1000,))
    signs = rotation.random_signs(jax.random.key(1), rotation.padded_dimension(1000))
    assert signs.shape == (1024,) and set(np.unique(np.asarray(signs))) == {-1.0, 1.0}
    y = rotation.rotate(x, signs)
    assert float(jnp.linalg.norm(y)) == pytest.approx(float(jnp.linalg.norm(x)), rel=1e-5)
    np.testing.assert_allclose(rotation.unrotate(y, signs, 1000), x, atol=1e-5)
    # flat: a one-hot vector's mass spreads to 1 / sqrt(D) in every coordinate
    spread = rotation.rotate(jnp.zeros(1024).at[3].set(1.0), signs)
    np.testing.assert_allclose(np.abs(spread), 1 / 32, rtol=1e-5)


def test_rounded_vectors_meet_the_norm_bound_the_accounting_assumes_and_are_unbiased():
    dim, norm, beta = 256, 30.0, math.exp(-0.5)
    bound = rounding.rounded_l2_bound(norm, beta, dim)
    assert bound < norm + math.sqrt(dim)  # the conditional bound is the tighter one here
    y = jax.random.normal(jax.random.key(2), (dim,))
    y = y / jnp.linalg.norm(y) * norm
    draws = jax.vmap(lambda k: rounding.conditional_round(k, y, bound)[0])(
        jax.random.split(jax.random.key(3), 400)
    )
    norms = np.linalg.norm(np.asarray(draws, np.float64), axis=1)
    assert norms.max() <= bound
    # unbiased: the mean of 400 draws is within 5 standard errors (<= 1 / (2 sqrt(400))) of y
    np.testing.assert_allclose(np.asarray(draws).mean(axis=0), y, atol=5 * 0.5 / 20)


def _chi_square_p(samples, pmf, support):
    """p-value of a chi-square test of ``samples`` against ``pmf`` on ``support`` (tails pooled
    into the extreme bins)."""
    samples = np.clip(np.asarray(samples), support[0], support[-1])
    observed = np.array([(samples == k).sum() for k in support], np.float64)
    expected = np.asarray([pmf(k) for k in support], np.float64)
    expected[0] += sum(pmf(k) for k in range(support[0] - 200, support[0]))
    expected[-1] += sum(pmf(k) for k in range(support[-1] + 1, support[-1] + 200))
    expected *= len(samples) / expected.sum()
    return stats.chisquare(observed, expected).pvalue


@pytest.mark.parametrize(
    "sigma, leftover_share", [(0.7, None), (2.5, None), (30.0, None), (2.5, 10_000)]
)
def test_the_discrete_gaussian_sampler_matches_its_pmf(sigma, leftover_share):
    """20,000 draws, fixed seed: the chi-square test does not reject at 1e-3 (a wrong sampler, such
    as a rounded continuous Gaussian, is rejected far below that at this size). A leftover buffer
    of 64 slots for the ~280 coordinates the first pass leaves runs the third pass too."""
    samples = np.asarray(
        discrete_gaussian(jax.random.key(4), sigma, (20000,), leftover_share=leftover_share)
    )
    norm = sum(math.exp(-(k**2) / (2 * sigma**2)) for k in range(-200, 201))
    pmf = lambda k: math.exp(-(k**2) / (2 * sigma**2)) / norm
    support = list(range(-math.ceil(4 * sigma), math.ceil(4 * sigma) + 1))
    assert _chi_square_p(samples, pmf, support) > 1e-3
    rounded = np.round(np.random.default_rng(0).normal(0, sigma, 20000))
    if sigma < 1:
        assert _chi_square_p(rounded, pmf, support) < 1e-3  # the test can tell


@pytest.mark.parametrize("mu", [3.0, 900.0])
def test_the_skellam_sampler_matches_its_pmf(mu):
    """Variance 3: two Poisson(1.5) (Knuth's sampler); 900: two Poisson(450) (PTRS proposals in
    ``rejection_sample``'s passes)."""
    samples = np.asarray(skellam(jax.random.key(5), mu, (20000,)))
    pmf = lambda k: stats.skellam.pmf(k, mu / 2, mu / 2)  # noqa: E731
    width = math.ceil(4 * math.sqrt(mu))
    assert _chi_square_p(samples, pmf, list(range(-width, width + 1))) > 1e-3
    assert samples.var() == pytest.approx(mu, rel=0.05)


@pytest.mark.parametrize("lam", [30.0, 1e6, 4e6])
def test_the_poisson_sampler_matches_its_pmf_where_it_rejects(lam):
    """PTRS (lam >= 10) through the three passes, vmapped as in the cohort map: 4 x 5,000 draws,
    binned in 40 bins of 0.2 sd (tails pooled), a chi-square test at 1e-3; a mean 0.15 sd off is
    told at lam 30 by the same test. Means of 10^6 and more were drawn in chunks of 5e4 before
    the log-pmf was made accurate (``privacy.distributed.poisson._poisson_log_pmf``)."""
    keys = jax.random.split(jax.random.key(6), 4)
    samples = np.asarray(jax.vmap(lambda k: poisson(k, lam, (5000,)))(keys)).ravel()
    sd = math.sqrt(lam)

    def p_value(draws, mean):
        edges = np.unique(np.floor(lam + sd * np.linspace(-4, 4, 41)))
        cdf = stats.poisson.cdf(edges, mean)
        expected = np.diff(np.concatenate([[0.0], cdf, [1.0]])) * len(draws)
        observed = np.bincount(np.searchsorted(edges, draws), minlength=len(edges) + 1)
        return stats.chisquare(observed, expected).pvalue

    assert p_value(samples, lam) > 1e-3
    if lam == 30.0:
        assert p_value(samples, lam + sd * 0.15) < 1e-3  # the test can tell


def _ddg_rdp_independent(l2, l1, sigma, n, n_tau, d, alpha):
    """Kairouz, Liu and Steinke 2021, Prop. 14 with Thm. 1's tau, transcribed from the paper."""
    tau = 10 * sum(math.exp(-2 * math.pi**2 * sigma**2 * k / (k + 1)) for k in range(1, n_tau))
    a2, a1 = l2 / (math.sqrt(n) * sigma), l1 / (math.sqrt(n) * sigma)
    return min(
        alpha / 2 * a2**2 + tau * d,
        alpha / 2 * (a2**2 + 2 * a1 * tau + tau**2 * d),
        alpha / 2 * (a2 + math.sqrt(d) * tau) ** 2,
    )


def _skellam_rdp_independent(l2, l1, mu, alpha):
    """Agarwal, Kairouz and Liu 2021, Thm. 3.5."""
    return alpha * l2**2 / (2 * mu) + min(
        ((2 * alpha - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu)
    )


def _subsampled(alpha, q, eps):
    """Zhu and Wang 2019, Thm. 5, at an integer order."""
    terms = [
        (1 - q) ** (alpha - 1) * (alpha * q - q + 1),
        special.comb(alpha, 2) * q**2 * (1 - q) ** (alpha - 2) * math.exp(eps(2)),
    ]
    terms += [
        3 * special.comb(alpha, l) * (1 - q) ** (alpha - l) * q**l * math.exp((l - 1) * eps(l))
        for l in range(3, alpha + 1)
    ]
    return min(math.log(sum(terms)) / (alpha - 1), eps(alpha))


@pytest.mark.parametrize("mechanism", ["ddgauss", "skellam"])
def test_the_accounted_epsilon_equals_an_independent_computation_of_each_papers_bound(mechanism):
    """10 Poisson(0.05)-sampled rounds at delta 1e-5, integer orders 2..64, the conversion by
    dp_accounting's ``compute_epsilon``."""
    if mechanism == "ddgauss":
        event = DistributedDiscreteGaussianDpEvent(900.0, 60000.0, 400.0, 20, 60, 4096)
        eps = lambda a: _ddg_rdp_independent(900.0, 60000.0, 400.0, 20, 60, 4096, a)
    else:
        event = SkellamDpEvent(900.0, 60000.0, 20 * 400.0**2)
        eps = lambda a: _skellam_rdp_independent(900.0, 60000.0, 20 * 400.0**2, a)
    orders = list(range(2, 65))
    rdp = np.array([10 * _subsampled(a, 0.05, eps) for a in orders])
    expected = rdp_privacy_accountant.compute_epsilon(orders, rdp, 1e-5)[0]
    accountant = Accountant("rdp", rdp_orders=orders)
    accountant.compose(RoundEvent("poisson", sampling_rate=0.05, mechanism=event), 10)
    assert accountant.epsilon(1e-5) == pytest.approx(expected, rel=1e-9)
    assert not Accountant("pld").kind == "rdp"  # PLD: refused (no PLD is known for either)
    with pytest.raises(ValueError, match="cannot compose"):
        Accountant("pld").compose(RoundEvent("poisson", sampling_rate=0.05, mechanism=event))


def _run_pipeline(plan, updates, key, dropout=0.0, summed_shares=False):
    """The transform's client side on each update, the engine's wrapping int32 sum, its server
    side: (decoded sum, survivors, wrapped coordinates)."""
    template = jax.ShapeDtypeStruct(updates.shape[1:], jnp.float32)
    noise = DistributedNoise(plan, template, dropout, summed_shares)
    inputs = {"round": jnp.float32(1)}

    def client(update, noise_key):
        ctx = ClientContext((), inputs, jnp.float32(plan.clip_norm), noise_key, True, True)
        return noise.client(update, ctx)

    flows = jax.vmap(client)(updates, jax.random.split(key, len(updates)))
    extras = jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), flows.extras)
    ctx = ServerContext((), inputs, 0.0, key, extras, flows.stats, None, None, key)
    decoded, _, metrics = noise.server(jnp.sum(flows.upload, axis=0), ctx)
    return decoded, float(metrics["ddp_survivors"]), float(metrics["ddp_wrapped"]), metrics


def _updates(n, dim, clip, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, dim))
    return jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True) * clip, jnp.float32)


@pytest.mark.parametrize("mechanism", ["ddgauss", "skellam"])
def test_with_many_bits_the_distributed_sum_carries_the_central_noise(mechanism):
    """18 bits, 50 clients, no dropout: the decoded sum minus the true sum has per-coordinate std z
    c (the central Gaussian's at the same z) up to the rounding's share gamma^2 / 4 per client; 512
    coordinates give the std to about 3 % (2 x 1 / sqrt(2 x 512)), so 10 % is a wide margin."""
    n, dim, clip, z = 50, 512, 1.0, 0.8
    plan = DistributedPlan(mechanism, 18, math.exp(-0.5), 4.0, clip, z, dim, n, n)
    updates = _updates(n, dim, clip)
    decoded, survivors, wrapped, _ = _run_pipeline(plan, updates, jax.random.key(6))
    error = np.asarray(decoded) - np.asarray(updates).sum(axis=0)
    expected = math.sqrt((z * clip) ** 2 + n * plan.gamma**2 / 4)
    assert survivors == n and wrapped == 0
    assert error.mean() == pytest.approx(0.0, abs=4 * expected / math.sqrt(dim))
    assert error.std() == pytest.approx(expected, rel=0.1)
    assert plan.gamma * math.sqrt(n) / 2 < 0.01 * z * clip  # at 18 bits rounding is negligible


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_summed_skellam_shares_release_the_same_sum_as_shares_drawn_per_client(dropout):
    """``ddp.shares=summed``: the decoded sum has the law of the per-client shares' sum (std
    sqrt(survivors) x the share's, in gamma units), by a two-sample KS test over 16 rounds of 256
    coordinates each (the std within 6 %, 5 standard errors), and the survivors' count sets it
    under dropout (zero updates: no rounding, and a dropped client's update does not enter the
    truth either)."""
    n, dim, clip, z = 40, 256, 1.0, 0.8
    plan = DistributedPlan("skellam", 18, math.exp(-0.5), 4.0, clip, z, dim, 10, n)
    updates = jnp.zeros((n, dim), jnp.float32)
    errors, stds = {}, {}
    for summed in (False, True):
        rows = []
        for seed in range(16):
            decoded, survivors, wrapped, _ = _run_pipeline(
                plan, updates, jax.random.key(100 + seed), dropout, summed
            )
            assert wrapped == 0
            rows.append((np.asarray(decoded) - np.asarray(updates).sum(axis=0)) / plan.gamma)
            share = math.sqrt(plan.share_parameter())
            stds.setdefault(summed, []).append(math.sqrt(survivors) * share)
        errors[summed] = np.concatenate(rows) / np.repeat(stds[summed], dim)
    assert stats.ks_2samp(errors[False], errors[True]).pvalue > 1e-3
    for summed in (False, True):
        assert errors[summed].std() == pytest.approx(1.0, rel=0.06)


def test_summed_shares_are_refused_for_the_discrete_gaussian():
    plan = DistributedPlan("ddgauss", 16, math.exp(-0.5), 4.0, 1.0, 1.0, 64, 10, 10)
    template = jax.ShapeDtypeStruct((64,), jnp.float32)
    with pytest.raises(ValueError, match="only Skellam"):
        DistributedNoise(plan, template, 0.0, True)


def test_too_few_bits_wrap_and_the_round_reports_it():
    n, dim, clip, z = 50, 256, 1.0, 0.8
    plan = DistributedPlan("ddgauss", 18, math.exp(-0.5), 4.0, clip, z, dim, n, n)
    narrow = DistributedPlan("ddgauss", 8, math.exp(-0.5), 0.5, clip, z, dim, n, n)
    updates = _updates(n, dim, clip)
    assert _run_pipeline(plan, updates, jax.random.key(7))[2] == 0
    assert _run_pipeline(narrow, updates, jax.random.key(7))[2] > 0  # k = 0.5 sd: some wrap


def test_dropouts_leave_out_their_shares_and_a_round_below_the_threshold_aborts():
    n, dim = 40, 128
    plan = DistributedPlan("skellam", 16, math.exp(-0.5), 4.0, 1.0, 1.0, dim, 30, n)
    updates = _updates(n, dim, 1.0)
    decoded, survivors, _, metrics = _run_pipeline(plan, updates, jax.random.key(8), dropout=0.5)
    assert 10 <= survivors <= 30 and float(metrics["ddp_aborted"]) == 1.0
    assert float(jnp.abs(decoded).max()) == 0.0  # aborted: nothing released
    kept = DistributedPlan("skellam", 16, math.exp(-0.5), 4.0, 1.0, 1.0, dim, 10, n)
    decoded, survivors, _, metrics = _run_pipeline(kept, updates, jax.random.key(8), dropout=0.5)
    assert float(metrics["ddp_aborted"]) == 0.0 and float(jnp.abs(decoded).max()) > 0


def _config(**overrides):
    from fedjax_dp.training.default_config import default_config

    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.model.name = "dp_fedavg", 2, 2, "logistic"
    c.data.num_clients = 20
    c.client.update(epochs=1, batch_size=32)
    c.sampling.update(method="poisson", rate=0.5)
    c.dp.update(noise_mode="distributed", clip_norm=0.5, noise_multiplier=1.0)
    c.privacy.update(accountant="rdp")
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def test_a_distributed_run_is_accounted_by_its_event_and_names_its_trust_model(tmp_path):
    from fedjax_dp.training.loop import run_experiment

    run_experiment(_config(), str(tmp_path / "run"), progress=False)
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    (release,) = [r for r in privacy["releases"] if "distributed" in r["mechanism"]]
    assert privacy["noise_mode"] == "distributed (simulated secure aggregation)"
    assert "modular sum" in privacy["accounting"]["trust_model"] and privacy["formal"] is True
    assert release["event"].startswith("DistributedDiscreteGaussianDpEvent")
    plan_keys = ("ddp_min_survivors", "ddp_max_clients", "ddp_gamma", "ddp_padded_dim")
    a = privacy["accounting"]
    event = DistributedDiscreteGaussianDpEvent(
        a["ddp_l2_sensitivity_integer_units"],
        a["ddp_l1_sensitivity_integer_units"],
        a["ddp_share_std_integer_units"],
        a["ddp_min_survivors"],
        a["ddp_max_clients"],
        a["ddp_padded_dim"],
    )
    assert all(k in a for k in plan_keys)
    direct = Accountant("rdp").compose(RoundEvent("poisson", sampling_rate=0.5, mechanism=event), 2)
    assert privacy["epsilon"] == pytest.approx(direct.epsilon(1e-5), rel=1e-9)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert all("ddp_wrapped" in r and "ddp_survivors" in r for r in rows if r["round"] > 0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"ddp.bits": 3}, r"ddp.bits=3 is too few for the \d+ clients"),
        ({"ddp.bits": 40}, r"ddp.bits must be an integer in \[2, 32\].*40"),
        ({"ddp.dropout": 1.0}, r"ddp.dropout must lie in \[0, 1\), got 1.0"),
        ({"privacy.accountant": "pld"}, r"privacy.accountant='pld' cannot compose"),
        ({"sampling.method": "uniform"}, r"no accountant here composes it"),
        ({"dp.clip": "adaptive"}, r"dp.noise_mode='distributed' with dp.clip='adaptive'"),
        ({"ddp.shares": "summed"}, r"ddp.shares='summed' with ddp.mechanism='ddgauss'"),
        ({"ddp.shares": "pooled"}, r"ddp.shares 'pooled' unknown"),
    ],
)
def test_bad_distributed_configs_are_refused_naming_the_key_before_any_data_loads(
    tmp_path, monkeypatch, overrides, message
):
    import fedjax_dp.training.run_context as run_context
    from fedjax_dp.training.loop import run_experiment

    monkeypatch.setattr(
        run_context, "build_dataset", lambda *a, **k: pytest.fail("data loaded before the check")
    )
    with pytest.raises(ValueError, match=message):
        run_experiment(_config(**overrides), str(tmp_path / "bad"), progress=False)


def test_a_distributed_target_epsilon_is_calibrated_over_the_distributed_event():
    from fedjax_dp.algorithms.dp_section import calibrated_noise_multiplier, noise_releases

    c = _config(**{"privacy.target_epsilon": 6.0})
    z = calibrated_noise_multiplier(c, 20)
    (release,) = noise_releases(c, 20, z)
    spent = Accountant("rdp").compose(
        RoundEvent("poisson", sampling_rate=0.5, mechanism=release.event), 2
    )
    assert spent.epsilon(1e-5) == pytest.approx(6.0, abs=2e-3)
    assert isinstance(release.event, DistributedDiscreteGaussianDpEvent)
    assert dp_accounting.PoissonSampledDpEvent  # the sampler's event wraps it


def test_the_papers_emnist_setting_is_a_shipped_config_that_validates():
    """``ddp_emnist``: fl_run.py's 3,400 writers, 100 a round, 1,500 rounds, 16 bits, beta =
    e^-0.5, k = 4, epsilon 10, clip 0.03 (it runs where TFF's EMNIST files are present)."""
    from fedjax_dp import configs
    from fedjax_dp.training.config_validation import validate_config

    c = configs.get("ddp_emnist")
    validate_config(c)
    assert (c.data.num_clients, c.rounds, c.ddp.bits, c.ddp.k_stddevs) == (3400, 1500, 16, 4.0)
    assert c.sampling.rate * 3400 == pytest.approx(100) and c.dp.clip_norm == 0.03
    assert c.ddp.beta == pytest.approx(math.exp(-0.5)) and c.privacy.target_epsilon == 10.0
