"""Budget stop rules, per-client ledgers, and the loop's privacy report."""

import json

import numpy as np
import pytest

from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.accounting.accountant import Accountant, RoundEvent
from fedjax_dp.privacy.ledgers.budget import BudgetRule, ClientBook
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

EVENT = RoundEvent("poisson", 1.1, 0.1)


def first_round_over(measure, limit):
    acc = Accountant("rdp")
    for t in range(1, 10_000):
        acc.compose(EVENT)
        if measure(acc) > limit:
            return t
    raise AssertionError("never exceeded")


def rounds_allowed(rule):
    acc = Accountant("rdp")
    t = 0
    while rule.allows(acc, EVENT):
        acc.compose(EVENT)
        t += 1
    return t, acc


def test_epsilon_budget_stops_before_the_round_that_would_exceed_it():
    ran, acc = rounds_allowed(BudgetRule(delta=1e-5, max_epsilon=3.0))
    assert ran == first_round_over(lambda a: a.epsilon(1e-5), 3.0) - 1
    assert acc.epsilon(1e-5) <= 3.0


def test_geyer_rule_stops_when_delta_at_target_epsilon_would_exceed_q():
    ran, acc = rounds_allowed(BudgetRule(target_epsilon=2.0, max_delta=1e-4))
    assert ran == first_round_over(lambda a: a.delta(2.0), 1e-4) - 1
    assert acc.delta(2.0) <= 1e-4


def test_budget_rule_bad_input():
    with pytest.raises(ValueError, match=r"Q \(max_delta\) must lie in \(0, 1\), got 1.5"):
        BudgetRule(target_epsilon=1.0, max_delta=1.5)
    with pytest.raises(ValueError, match="epsilon must be a positive finite number, got 0"):
        BudgetRule(delta=1e-5, max_epsilon=0)


def test_client_ledger_heterogeneous_budgets():
    # z = 1, sensitivity S: each participation is 1-GDP; budgets allow sqrt(3.5) and sqrt(1.5) mu.
    budgets = np.array(
        [gdp.epsilon_from_mu(np.sqrt(3.5), 1e-5), gdp.epsilon_from_mu(np.sqrt(1.5), 1e-5)]
    )
    ledger = ClientBook(2, 1e-5, budgets)
    taken = np.zeros(2, int)
    for _ in range(10):
        eligible = ledger.eligible(1.0)
        ids = np.flatnonzero(eligible)
        ledger.record(ids, 1.0)
        taken[ids] += 1
    np.testing.assert_array_equal(taken, [3, 1])
    assert np.all(ledger.epsilons() <= budgets + 1e-9)
    np.testing.assert_allclose(ledger.epsilons()[0], gdp.epsilon_from_mu(np.sqrt(3), 1e-5))


def test_client_ledger_takes_each_clients_own_noise():
    """Issue 15 item 6: per-client events. Client 0 runs at z = 1, client 1 at z = 2: after two
    rounds their mu are sqrt(2) and sqrt(2 / 4), and eligibility is judged at each one's own z."""
    ledger = ClientBook(3, 1e-5, gdp.epsilon_from_mu(np.sqrt(2.2), 1e-5))
    for _ in range(2):
        ledger.record(np.array([0, 1]), np.array([1.0, 2.0]))
    np.testing.assert_allclose(
        ledger.epsilons()[:2],
        [gdp.epsilon_from_mu(np.sqrt(2), 1e-5), gdp.epsilon_from_mu(np.sqrt(0.5), 1e-5)],
    )
    assert ledger.epsilons()[2] == 0
    np.testing.assert_array_equal(ledger.eligible(np.array([1.0, 2.0, 1.0])), [False, True, True])


def test_tracker_composes_per_client_multipliers_of_a_local_release():
    from fedjax_dp.core.uploads import Release
    from fedjax_dp.privacy.sampling import FixedSizeSampling
    from fedjax_dp.privacy.settings import PrivacySettings
    from fedjax_dp.privacy.tracker import tracker_for

    settings = PrivacySettings()
    z = (1.0, 2.0, 4.0)
    release = Release("noise", "local", min(z), "S", client_multipliers=z)
    tracker = tracker_for([release], settings, FixedSizeSampling(3, 2))
    tracker.record(1, np.array([0, 2]), [release])
    tracker.record(2, np.array([1, 2]), [release])
    mu = np.sqrt([1.0, 0.25, 2 / 16]) * 2  # replace-one under local noise: sensitivity 2S
    np.testing.assert_allclose(
        tracker.ledger.epsilons(), [gdp.epsilon_from_mu(m, settings.delta) for m in mu]
    )
    assert tracker.epsilon() == tracker.ledger.epsilons().max()


def test_dp_run_writes_privacy_report_and_stops_on_budget(tmp_path):
    cfg = default_config()
    cfg.algorithm, cfg.rounds, cfg.eval_every = "dp_fedavg", 40, 10
    cfg.model.name = "logistic"
    cfg.client.epochs = 1
    cfg.sampling.method, cfg.sampling.rate = "poisson", 0.1
    cfg.dp.noise_multiplier, cfg.privacy.max_epsilon, cfg.privacy.accountant = 1.0, 2.0, "pld"
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    report = json.load(open(tmp_path / "run" / "privacy.json"))
    expected_stop = first_round_over_pld(cfg.privacy.max_epsilon)
    assert summary.stopped_early and summary.rounds == expected_stop - 1
    assert report["formal"] and report["epsilon"] <= 2.0 and report["rounds"] == expected_stop - 1
    assert set(report["epsilons"]) == {"rdp", "pld", "gdp_clt_approximation"}
    rows = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
    eps = [r["epsilon"] for r in rows if "epsilon" in r]
    assert eps == sorted(eps) and eps[-1] == pytest.approx(report["epsilon"])
    assert rows[-1].get("final_evaluation")


def first_round_over_pld(limit):
    acc = Accountant("pld")
    for t in range(1, 1000):
        acc.compose(RoundEvent("poisson", 1.0, 0.1))
        if acc.epsilon(1e-5) > limit:
            return t
