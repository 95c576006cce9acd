"""Accounting against independent closed forms, calibration round trips, GDP conversions."""

import math

import dp_accounting
import numpy as np
from scipy.stats import norm
import pytest
from dp_accounting import pld, rdp

from fedjax_dp.privacy.accounting import accountant as A
from fedjax_dp.privacy.accounting import calibration as C
from fedjax_dp.privacy.accounting import gdp


def test_t_gaussians_equal_sqrt_t_over_sigma_gdp():
    # No subsampling: T Gaussians of multiplier sigma are exactly (sqrt(T)/sigma)-GDP.
    sigma, rounds, delta = 2.0, 16, 1e-5
    exact = gdp.epsilon_from_mu(math.sqrt(rounds) / sigma, delta)
    pld_eps = A.epsilon_of([(A.RoundEvent("full", sigma), rounds)], delta, "pld")
    rdp_eps = A.epsilon_of([(A.RoundEvent("full", sigma), rounds)], delta, "rdp")
    assert pld_eps == pytest.approx(exact, rel=2e-3)  # PLD is tight up to discretisation
    assert exact <= rdp_eps <= 1.3 * exact  # RDP is an upper bound, somewhat loose


@pytest.mark.parametrize("q,sigma", [(0.01, 1.0), (0.1, 2.0), (0.5, 0.8)])
def test_one_step_subsampled_rdp_order_two(q, sigma):
    acc = rdp.RdpAccountant(orders=[2.0])
    acc.compose(A.RoundEvent("poisson", sigma, q).dp_event())
    assert acc.rdp[0] == pytest.approx(math.log1p(q**2 * math.expm1(sigma**-2)), rel=1e-9)


def test_abadi_setting_is_below_the_moments_accountant():
    # Abadi et al. 2016: q = 0.01, sigma = 4, T = 10^4, delta = 1e-5 -> 1.26 (moments accountant).
    event = [(A.RoundEvent("poisson", 4.0, 0.01), 10_000)]
    rdp_eps, pld_eps = A.epsilon_of(event, 1e-5, "rdp"), A.epsilon_of(event, 1e-5, "pld")
    assert pld_eps < rdp_eps < 1.26
    assert 0.8 < pld_eps


def test_replace_one_uses_sensitivity_two_s():
    # q = 1 fixed-size sampling = a Gaussian of sensitivity 2S: same as add/remove with z / 2.
    assert A.replace_one_scale() in (0.5, 1.0)
    fixed = A.epsilon_of(
        [(A.RoundEvent("fixed", 3.0, population=50, cohort_size=50), 5)], 1e-5, "rdp"
    )
    half = A.epsilon_of([(A.RoundEvent("full", 1.5), 5)], 1e-5, "rdp")
    assert fixed == pytest.approx(half, rel=1e-9)
    # and subsampling still amplifies
    assert (
        A.epsilon_of([(A.RoundEvent("fixed", 3.0, population=50, cohort_size=5), 5)], 1e-5, "rdp")
        < fixed
    )


def test_schedule_composes_each_round():
    events = [(A.RoundEvent("poisson", 1.0, 0.1), 30), (A.RoundEvent("poisson", 2.0, 0.2), 20)]
    acc = A.Accountant("rdp")
    for event, n in events:
        for _ in range(n):
            acc.compose(event)
    assert acc.rounds == 50 and acc.events == events
    direct = rdp.RdpAccountant(orders=list(A.RDP_ORDERS))
    for event, n in events:
        direct.compose(dp_accounting.SelfComposedDpEvent(event.dp_event(), n))
    assert acc.epsilon(1e-5) == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)
    assert acc.delta(acc.epsilon(1e-5)) == pytest.approx(1e-5, rel=1e-3)


@pytest.mark.parametrize(
    "kind,sampling", [("rdp", "poisson"), ("pld", "poisson"), ("rdp", "fixed")]
)
def test_calibration_round_trip(kind, sampling):
    z = C.calibrate_noise_multiplier(
        3.0, 1e-5, 200, sampling, sampling_rate=0.05, population=1000, cohort_size=50, kind=kind
    )
    event = A.RoundEvent(sampling, z, 0.05, 1000, 50)
    assert 3.0 - 5e-3 < A.epsilon_of([(event, 200)], 1e-5, kind) <= 3.0  # never over the target
    # the root lies within 1e-4 of z
    slightly_less = A.RoundEvent(sampling, z - 2e-4, 0.05, 1000, 50)
    assert A.epsilon_of([(slightly_less, 200)], 1e-5, kind) > 3.0


def test_the_pld_bracket_steps_down_from_the_rdp_answer_and_refuses_a_root_it_cannot_reach():
    """``pld_bracket``: the first lower end (0.9, 0.75, ... x z_rdp) that overspends, with the step
    above it (or 1.001 z_rdp) as the upper end; none of them: a clear error, not Brent's 'did not
    bracket'."""
    tried = []
    root = lambda r: lambda z: tried.append(z) or z < r  # noqa: E731  (overspends below the root r)
    assert (
        C.pld_bracket(root(1.9), 2.0).endpoint_1,
        C.pld_bracket(root(1.9), 2.0).endpoint_2,
    ) == (1.8, 2.002)
    tried.clear()
    bracket = C.pld_bracket(root(1.2), 2.0)
    assert (bracket.endpoint_1, bracket.endpoint_2) == (1.0, 1.5) and tried == [1.8, 1.5, 1.0]
    with pytest.raises(ValueError, match="below 0.25 x the RDP calibration's z = 2"):
        C.pld_bracket(root(0.4), 2.0)


def test_gdp_conversions():
    assert gdp.epsilon_from_mu(0.25, 1e-5) == pytest.approx(0.926, abs=1e-3)  # CUAG-PFL's example
    for mu in (0.1, 0.5, 1.0, 3.0):
        eps = gdp.epsilon_from_mu(mu, 1e-6)
        assert gdp.delta_from_mu(mu, eps) == pytest.approx(1e-6, rel=1e-6)
        assert gdp.mu_from_epsilon(eps, 1e-6) == pytest.approx(mu, rel=1e-6)
    assert gdp.mu_clt(0.1, 1.0, 100) == pytest.approx(0.1 * math.sqrt(100 * (math.e - 1)))


def test_a_tiny_noise_multiplier_reports_an_infinite_clt_epsilon_instead_of_crashing():
    """The report of a Poisson run at z = 0.03 (1/z^2 > 709) raised OverflowError in the CLT
    figure, at the end of the run, after its rounds."""
    from fedjax_dp.privacy.ledgers.client_level import CentralLedger
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
    from fedjax_dp.privacy.sampling import build as client_sampler
    from fedjax_dp.privacy.settings import PrivacySettings
    from fedjax_dp.training.default_config import default_config

    assert gdp.mu_clt(0.2, 0.03, 1) == math.inf
    cfg = default_config()
    cfg.sampling.update(method="poisson", rate=0.2)
    cfg.privacy.accountant = "rdp"
    ledger = CentralLedger(client_sampler(cfg.sampling, 100), PrivacySettings.from_config(cfg))
    noise = GaussianNoise(((1, 0.03),))
    releases = list(noise.releases(noise.inputs(1), 1.0))
    ledger.record(1, np.arange(20), releases)
    assert ledger.describe()["epsilons"]["gdp_clt_approximation"] == math.inf


def test_a_pld_past_its_ceiling_answers_with_rdp_instead_of_exhausting_memory():
    """At z = 1e-6 dp_accounting's PLD asked for petabytes (MemoryError) at the report's
    side-by-side figure, at the end of the run; past ``PLD_CEILING`` the PLD accountant answers
    with RDP's figure and the report says so. Below it, the PLD is built as before."""
    from fedjax_dp.privacy.accounting.accountant import PLD_CEILING, Accountant, RoundEvent
    from fedjax_dp.privacy.ledgers.client_level import CentralLedger
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
    from fedjax_dp.privacy.sampling import build as client_sampler
    from fedjax_dp.privacy.settings import PrivacySettings
    from fedjax_dp.training.default_config import default_config

    cfg = default_config()
    cfg.sampling.update(method="poisson", rate=0.2)
    cfg.privacy.accountant = "pld"
    ledger = CentralLedger(client_sampler(cfg.sampling, 100), PrivacySettings.from_config(cfg))
    noise = GaussianNoise(((1, 1e-6),))
    ledger.record(1, np.arange(20), list(noise.releases(noise.inputs(1), 1.0)))
    described = ledger.describe()
    assert described["epsilons"]["pld"] == described["epsilons"]["rdp"] > PLD_CEILING
    assert ledger.epsilon() == described["epsilons"]["rdp"]
    assert any("the PLD figure is RDP's" in n for n in described["notes"])
    usual = Accountant("pld").compose(RoundEvent("poisson", 1.0, sampling_rate=0.2), count=3)
    assert not usual.pld_replaced
    assert usual.epsilon(1e-5) < Accountant("rdp").compose(
        RoundEvent("poisson", 1.0, sampling_rate=0.2), count=3
    ).epsilon(1e-5)


def test_analytic_gaussian_beats_classic_formula_and_is_valid():
    for eps in (0.5, 1.0, 4.0):
        sigma = C.analytic_gaussian_sigma(eps, 1e-5)
        # independent check: the Gaussian mechanism's exact delta at eps (Balle and Wang 2018, Thm.
        # 8)
        exact_delta = norm.cdf(1 / (2 * sigma) - eps * sigma) - math.exp(eps) * norm.cdf(
            -1 / (2 * sigma) - eps * sigma
        )
        assert exact_delta == pytest.approx(1e-5, rel=1e-3)  # calibrated, and tight
        pld_eps = A.epsilon_of([(A.RoundEvent("full", sigma), 1)], 1e-5, "pld")
        assert pld_eps <= eps * 1.01
        if eps < 1:
            assert sigma < math.sqrt(2 * math.log(1.25 / 1e-5)) / eps


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: A.Accountant("rdp").epsilon(0.0), "delta must lie in \\(0, 1\\), got 0.0"),
        (
            lambda: A.Accountant("rdp").delta(-1.0),
            "epsilon must be a positive finite number, got -1.0",
        ),
        (
            lambda: A.RoundEvent("poisson", 1.0, 1.5),
            "sampling rate q must lie in \\(0, 1\\], got 1.5",
        ),
        (
            lambda: A.RoundEvent("poisson", -0.1, 0.5),
            "noise multiplier must be >= 0 and finite, got -0.1",
        ),
        (
            lambda: C.calibrate_noise_multiplier(1e-4, 1e-10, 10**6, "full"),
            "no noise multiplier <= 1000.0 reaches",
        ),
        (lambda: C.calibrate_noise_multiplier(-1.0, 1e-5, 10, "full"), "got -1.0"),
        (
            lambda: A.Accountant("rdp", rdp_orders=(0.5, 2)),
            "RDP orders must be a non-empty list of finite numbers > 1",
        ),
        (
            lambda: C.calibrate_noise_multiplier(
                1.0, 0.2, 10, "fixed", population=10, cohort_size=1
            ),
            "delta=0.2 >= the sampling rate q=0.1",
        ),
    ],
)
def test_bad_input_names_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_fixed_size_pld_is_the_dong_roth_su_reduction():
    """Sampling m of K without replacement, replace-one (Dong, Roth and Su 2019, Thm. 9): at m = K
    it is a Gaussian of sensitivity 2S (= add/remove z/2); below, it is tighter than the RDP bound
    of Wang et al. and at least the full-batch Poisson figure at the same rate with z/2 (it is that
    PLD)."""
    full = A.epsilon_of([(A.RoundEvent("fixed", 2.0, population=4, cohort_size=4), 1)], 1e-5, "pld")
    assert full == pytest.approx(
        A.epsilon_of([(A.RoundEvent("full", 1.0), 1)], 1e-5, "pld"), rel=1e-6
    )
    event = A.RoundEvent("fixed", 1.0, population=1000, cohort_size=10)
    drs, rdp_eps = (
        A.epsilon_of([(event, 1000)], 1e-5, "pld"),
        A.epsilon_of([(event, 1000)], 1e-5, "rdp"),
    )
    assert drs < rdp_eps
    direct = pld.PLDAccountant(value_discretization_interval=A.PLD_DISCRETIZATION)
    direct.compose(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(0.5)), 1000
    )
    assert drs == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)


def test_rdp_order_grid_is_a_parameter():
    event = A.RoundEvent("poisson", 1.0, 0.01)
    default = A.Accountant("rdp").compose(event, 1000).epsilon(1e-5)
    coarse = A.Accountant("rdp", rdp_orders=(2, 64)).compose(event, 1000).epsilon(1e-5)
    assert coarse > default  # the best order of a coarser grid can only be worse
    fine = (
        A.Accountant("rdp", rdp_orders=A.RDP_ORDERS + (1.05, 7.25, 9.5))
        .compose(event, 1000)
        .epsilon(1e-5)
    )
    assert fine <= default


def test_gdp_conversions_survive_a_huge_mu():
    """A local mechanism with a tiny multiplier (PriFedSync's z = 2 sigma / (B sqrt(L))) is mu-GDP
    with mu in the hundreds or more: the conversion used to overflow in e^eps Phi(b) (cancellation
    in eps + log Phi(b))."""
    from fedjax_dp.privacy.accounting import gdp

    previous = 0.0
    for mu in (50.0, 314.0, 9e9):
        epsilon = gdp.epsilon_from_mu(mu, 1e-5)
        assert math.isfinite(epsilon) and epsilon > previous and epsilon >= mu**2 / 2 * 0.99
        assert 0.0 <= gdp.delta_from_mu(mu, epsilon) <= 1.0
        previous = epsilon


def test_the_cached_pld_accountant_is_dp_accountings_to_the_bit_and_builds_each_mechanism_once():
    """``cached_pld``: a schedule of Poisson rounds at two noise levels, queried after every round
    as a run does, gives dp_accounting's PLDAccountant's epsilon and delta exactly, and each
    subsampled Gaussian's PLD is built once per (q, z), not once per query; fixed-size
    (Dong-Roth-Su) and full-participation rounds give its epsilon too (the latter through the
    parent's own path)."""
    from unittest import mock

    from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution

    from fedjax_dp.privacy.accounting import cached_pld

    cached_pld.subsampled_gaussian_pld.cache_clear()
    schedule = [
        (A.RoundEvent("poisson", 1.1, sampling_rate=0.05), 3),
        (A.RoundEvent("poisson", 0.9, sampling_rate=0.05), 2),
        (A.RoundEvent("poisson", 1.1, sampling_rate=0.05), 4),
    ]
    real = privacy_loss_distribution.from_gaussian_mechanism
    reference_builds = 0
    with mock.patch.object(
        privacy_loss_distribution, "from_gaussian_mechanism", side_effect=real
    ) as built:
        history = A.Accountant("pld", pld_discretization=1e-3)
        for event, count in schedule:
            for _ in range(count):
                history.compose(event)
                reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
                for past, n in history.events:
                    reference.compose(past.dp_event("pld"), n)
                reference_builds += len(history.events)
                assert history.epsilon(1e-5) == reference.get_epsilon(1e-5)
                assert history.delta(2.0) == reference.get_delta(2.0)
    ours = [
        c
        for c in built.call_args_list
        if c.kwargs.get("value_discretization_interval") == 1e-3
        and c.kwargs.get("sampling_prob") == 0.05
    ]
    # the reference builds each round's PLD per history; ours, 2 in all
    assert len(ours) - reference_builds == 2
    for event in (
        A.RoundEvent("fixed", 1.3, population=100, cohort_size=10),
        A.RoundEvent("full", 2.0),
    ):
        reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
        reference.compose(event.dp_event("pld"), 5)
        assert A.epsilon_of([(event, 5)], 1e-5, "pld", 1e-3) == reference.get_epsilon(1e-5)


def test_self_composition_bounds_from_cached_moments_are_dp_accountings_to_the_bit():
    """``cached_pld.ChernoffBounds``: dp_accounting's truncation bounds for any number of
    compositions, with the PMF's log moment generating functions computed once (40 log-sum-exps, not
    40 per query)."""
    from unittest import mock

    from dp_accounting.pld import common

    from fedjax_dp.privacy.accounting import cached_pld

    rng = np.random.default_rng(0)
    bounds = cached_pld.ChernoffBounds(common.compute_self_convolve_bounds)
    for size in (5, 301, 4000):
        pmf = rng.dirichlet(np.full(size, 0.3))
        cases = [(num_times, tail) for num_times in (1, 2, 40, 1000) for tail in (1e-15, 1e-6)]
        want = [
            common.compute_self_convolve_bounds(pmf, num_times, tail) for num_times, tail in cases
        ]
        with mock.patch.object(
            cached_pld.special, "logsumexp", wraps=cached_pld.special.logsumexp
        ) as logsumexp:
            assert [bounds(pmf, num_times, tail) for num_times, tail in cases] == want
        # once per order for this PMF, whatever the count and the tail
        assert logsumexp.call_count == 40
    pmf = rng.dirichlet(np.ones(50))
    # no truncation: the original's path
    assert bounds(pmf, 3, 0) == common.compute_self_convolve_bounds(pmf, 3, 0)
    assert bounds(list(pmf), 3, 1e-15) == common.compute_self_convolve_bounds(list(pmf), 3, 1e-15)
    # stands in only while composing
    assert common.compute_self_convolve_bounds is not cached_pld.chernoff_bounds
