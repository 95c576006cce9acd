"""What the privacy report claims is what ran: sensitivities, sampling rates, budgets, refused
settings, labels of what no guarantee covers, and the randomness behind the noise (each test was
written failing, issue 16)."""

import json
import os
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core.uploads import ClientContext, Release
from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.accounting.accountant import Accountant
from fedjax_dp.privacy.sampling import FixedSizeSampling, PoissonSampling
from fedjax_dp.privacy.settings import PrivacySettings
from fedjax_dp.privacy.tracker import tracker_for
from fedjax_dp.privacy.mechanisms.upload_clipping import AdaptiveQuantileClip
from fedjax_dp.training.default_config import default_config


def _settings(**values) -> PrivacySettings:
    return PrivacySettings(**values)


def _tracker(release, settings, sampler):
    """The one tracker over ``release`` every round (``tracker_for``: central or local by the
    release)."""
    tracker = tracker_for([release], settings, sampler)
    return tracker


def test_one_more_unclipped_client_moves_the_count_by_the_sensitivity_the_accounting_assumes():
    clip = AdaptiveQuantileClip(initial_clip_norm=1.0, count_noise_std=3.0, denominator=10)
    state = clip.init(None)

    def count(norm, present=True):
        ctx = ClientContext(
            state,
            {},
            jnp.float32(math.inf),
            jax.random.key(0),
            jnp.bool_(present),
            jnp.bool_(present),
        )
        return float(clip.client({"w": jnp.array([norm])}, ctx).extras["count"])

    release = clip.releases({})[0]
    # std / z = the declared bound
    assumed_sensitivity = clip.count_noise_std / release.noise_multiplier
    cohort = [count(0.2), count(3.0), count(0.5)]
    added_unclipped, added_clipped = sum(cohort) + count(0.1), sum(cohort) + count(5.0)
    assert abs(added_unclipped - sum(cohort)) == pytest.approx(assumed_sensitivity)
    assert abs(added_clipped - sum(cohort)) == pytest.approx(assumed_sensitivity)
    assert count(0.1, present=False) == 0.0  # an absent slot moves nothing
    assert assumed_sensitivity == 0.5


def test_fixed_size_sampling_is_accounted_over_the_clients_still_eligible():
    """K = 20, m = 2, z = 1, per-client budgets that only some clients keep: once clients drop out,
    m is drawn from |E_t| < K, and the event must say so (it said K)."""
    # one round each (2S)
    settings = _settings(client_epsilon_budget=float(gdp.epsilon_from_mu(2.0 * 1.2, 1e-5)))
    release = Release("g", "central", 1.0, "S", bound_value=1.0)
    tracker = _tracker(release, settings, FixedSizeSampling(20, 2))
    assert tracker.ledger.clients.sensitivity_factor == 2.0  # fixed-size: replace-one
    tracker.record(1, np.array([0, 1]), [release])
    eligible = tracker.eligible(2, [release])
    assert eligible.sum() == 18
    assert tracker.ledger.event(2, [release]).population == 18


def test_local_noise_obeys_max_epsilon_before_each_round():
    settings = _settings(max_epsilon=1.0)
    release = Release("g", "local", 8.0, "S", bound_value=1.0)
    tracker = _tracker(release, settings, FixedSizeSampling(5, 5))
    one_round = gdp.epsilon_from_mu(2.0 / 8.0, settings.delta)  # replace-one: 2S / (z S)
    assert one_round < 1.0 < gdp.epsilon_from_mu(math.sqrt(2) * 2.0 / 8.0, settings.delta)
    assert tracker.allows(1, [release])
    tracker.record(1, np.arange(5), [release])
    assert not tracker.allows(2, [release])  # a second round would take every client past epsilon 1


def test_reported_sampling_rate_is_the_one_used_and_z0_is_not_formal():
    release = Release("g", "central", 1.0, "S")
    tracker = _tracker(release, _settings(), FixedSizeSampling(12, 4))
    tracker.record(1, np.arange(4), [release])
    assert tracker.report().sampling_rates == [pytest.approx(4 / 12)]
    silent = Release("g", "central", 0.0, "S")
    noiseless = _tracker(silent, _settings(), PoissonSampling(12, 0.3))
    noiseless.record(1, np.arange(4), [silent])
    report = noiseless.report()
    assert report.formal is False and math.isinf(report.epsilon)


def test_privacy_json_is_strict_json_and_lists_each_release(tmp_path):
    from fedjax_dp.training.reporting import privacy_record
    from fedjax_dp.training.results import ResultsWriter

    release = Release("Gaussian", "central", 1.0, "S", note="n")
    tracker = _tracker(release, _settings(), PoissonSampling(12, 0.3))
    tracker.record(1, np.arange(4), [release])
    for record in (privacy_record(tracker, []), privacy_record(None, [])):
        text = json.dumps(record, allow_nan=False)  # raises on Infinity / NaN
        assert json.loads(text)["formal"] in (True, False)
    record = privacy_record(tracker, [])
    assert record["releases"][0]["mechanism"] == "Gaussian" and record["noise_rng"] == "seeded"
    assert (
        privacy_record(None, [])["epsilon"] is None
        and privacy_record(None, [])["epsilon_unbounded"]
    )
    del ResultsWriter


def _refusal(**overrides):
    from fedjax_dp.training.config_validation import validate_config

    cfg = default_config()
    cfg.algorithm = "dp_fedavg"
    for path, value in overrides.items():
        section, key = path.split("__")
        cfg[section][key] = value
    with pytest.raises(ValueError) as error:
        validate_config(cfg)
    return str(error.value)


def test_local_noise_with_adaptive_clipping_is_refused():
    assert "dp.clip='adaptive' with dp.noise_mode='local' is refused" in _refusal(
        dp__clip="adaptive", dp__noise_mode="local"
    )


def test_conflicting_or_hopeless_dp_settings_are_refused_by_name():
    message = _refusal(privacy__target_epsilon=8.0, dp__noise_schedule="1:1.0,50:0.8")
    assert (
        "privacy.target_epsilon=8.0 and dp.noise_schedule='1:1.0,50:0.8' both choose z" in message
    )
    message = _refusal(privacy__max_epsilon=0.01, dp__noise_multiplier=0.5)
    assert "privacy.max_epsilon=0.01 is spent before round 1 ends" in message
    message = _refusal(privacy__max_epsilon=0.5, dp__noise_multiplier=1.0, dp__noise_mode="local")
    assert "privacy.max_epsilon=0.5 is spent before round 1 ends" in message
    assert "is not 'round:z'" in _refusal(dp__noise_schedule="1:x")


def test_a_noise_multiplier_that_calibration_or_a_schedule_would_replace_is_refused():
    """Bug (found 2026-11-29 by a new-user trial): ``dp.noise_multiplier=1.3`` on
    ``dp_fedavg_mnist``, whose ``privacy.target_epsilon=8`` chooses z, ran z = 0.717 without a word
    (the same beside ``dp.noise_schedule``); its epsilon was true, but the run was not the one asked
    for. Now the override is refused naming both keys."""
    import fedjax_dp

    with pytest.raises(ValueError) as error:
        fedjax_dp.Experiment("dp_fedavg_mnist", {"dp.noise_multiplier": 1.3})
    assert (
        "dp.noise_multiplier=1.3 is not read while privacy.target_epsilon=8.0 (only with"
        " privacy.target_epsilon 0.0): change privacy.target_epsilon or drop dp.noise_multiplier"
        in str(error.value)
    )
    with pytest.raises(
        ValueError,
        match=r"dp.noise_multiplier=0.5 is not read while dp.noise_schedule='1:1.0,50:0.8'",
    ):
        fedjax_dp.Experiment(
            "fedavg_mnist",
            {
                "algorithm": "dp_fedavg",
                "dp.noise_schedule": "1:1.0,50:0.8",
                "dp.noise_multiplier": 0.5,
            },
        )
    ran = fedjax_dp.Experiment(
        "dp_fedavg_mnist", {"dp.noise_multiplier": 1.3, "privacy.target_epsilon": 0.0}
    )
    assert ran.config.dp.noise_multiplier == 1.3


def test_pld_discretisation_is_a_parameter_checked_against_dp_accounting():
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from fedjax_dp.privacy.accounting.accountant import RoundEvent
    from fedjax_dp.privacy.accounting.calibration import calibrate_noise_multiplier

    event = RoundEvent("poisson", 1.1, sampling_rate=0.01)
    ours = Accountant("pld").compose(event, 2000).epsilon(1e-5)
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    reference.compose(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 2000
    )
    assert ours == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    coarse = Accountant("pld", pld_discretization=1e-3).compose(event, 2000).epsilon(1e-5)
    assert coarse > ours  # both pessimistic; the finer grid is tighter
    with pytest.raises(ValueError, match="delta=0.05 >= the sampling rate q=0.01"):
        calibrate_noise_multiplier(1.0, 0.05, 10, "poisson", sampling_rate=0.01, kind="pld")


def test_rdp_orders_and_fixed_size_pld_reach_the_tracker_and_the_report():
    from fedjax_dp.training.reporting import privacy_record

    assert "privacy.rdp_orders='2,x'" in _refusal(privacy__rdp_orders="2,x")
    assert "privacy.rdp_orders='0.5,2'" in _refusal(privacy__rdp_orders="0.5,2")
    release = Release("Gaussian", "central", 1.0, "S")
    tracker = _tracker(
        release,
        _settings(accountant="pld", rdp_orders=(2, 4, 8, 16, 32)),
        FixedSizeSampling(100, 10),
    )
    for t in range(1, 51):
        tracker.record(t, np.arange(10), [release])
    record = privacy_record(tracker, [])
    assert record["accounting"]["rdp_orders"] == [2.0, 4.0, 8.0, 16.0, 32.0]
    # Dong-Roth-Su is tighter than the RDP bound
    assert record["epsilons"]["pld"] < record["epsilons"]["rdp"]
    assert record["epsilon"] == record["epsilons"]["pld"]


def test_a_non_private_run_says_formal_false_wherever_its_epsilon_appears(tmp_path):
    from fedjax_dp.training.loop import run_experiment
    from fedjax_dp.training.reporting import format_summary, progress_postfix

    cfg = default_config()
    cfg.algorithm, cfg.rounds, cfg.eval_every = "dp_fedavg", 2, 2
    cfg.data.num_clients, cfg.model.name, cfg.sampling.cohort_size = 12, "logistic", 4
    cfg.client.update(epochs=1, batch_size=32)
    cfg.dp.clip = "median"
    cfg.privacy.max_epsilon = 50.0  # a budget rule with a non-private mechanism: not silent
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    # [0]: round 0
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")][1:]
    saved = json.load(open(tmp_path / "run" / "summary.json"))
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert all(row["formal"] is False for row in rows if "epsilon" in row)
    assert saved["formal"] is False and privacy["formal"] is False
    assert "formal: false" in format_summary(summary)
    assert "formal: false" in progress_postfix({"test_accuracy": 0.5}, rows[-1], object())["eps"]
    assert any("budget rule was applied to the formal part" in note for note in privacy["notes"])


def test_privacy_json_lists_what_is_outside_the_guarantee_and_each_relation(tmp_path):
    from fedjax_dp.training.loop import run_experiment

    cfg = default_config()
    cfg.algorithm, cfg.rounds, cfg.eval_every = "dp_fedavg", 2, 2
    cfg.data.num_clients, cfg.model.name, cfg.sampling.cohort_size = 12, "logistic", 4
    cfg.client.update(epochs=1, batch_size=32)
    cfg.dp.noise_mode = "local"
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    outside = " ".join(privacy["outside_guarantee"])
    for key in (
        "train_loss",
        "clipped_fraction",
        "median_update_norm",
        "between_client_variance",
        "update_scale",
    ):
        assert key in outside
    assert {r["neighboring_relation"] for r in privacy["releases"]} == {"replace-one"}


def _listed_run(tmp_path, **overrides):
    from fedjax_dp.training.loop import run_experiment

    cfg = default_config()
    cfg.algorithm, cfg.rounds, cfg.eval_every = "dp_fedavg", 2, 2
    cfg.data.num_clients, cfg.model.name, cfg.sampling.cohort_size = 12, "logistic", 4
    cfg.client.update(epochs=1, batch_size=32)
    for path, value in overrides.items():
        section, _, key = path.rpartition(".")
        (cfg[section] if section else cfg)[key] = value
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    published = {
        key for line in open(tmp_path / "run" / "metrics.jsonl") for key in json.loads(line)
    }
    return published, {line.split(":")[0] for line in privacy["outside_guarantee"]}


def test_every_figure_from_client_data_is_listed_outside_the_guarantee(tmp_path):
    """Issue 74, item 5: client_accuracy (each client's own test data) and client_accuracies.json
    were published in DP runs without being listed; so was test_accuracy where the central test set
    is the clients' own test data (the embedded MNIST subset has no test split)."""
    published, listed = _listed_run(tmp_path)
    assert {"client_accuracy", "test_accuracy", "test_loss"} <= published
    assert {
        "client_accuracy",
        "test_accuracy",
        "test_loss",
        "client_accuracies.json",
        "train_loss",
    } <= listed
    with pytest.raises(
        ValueError,
        match=(
            "eval_client_data=False needs a held-out central test set, and "
            "data.source='mnist_5k' has none"
        ),
    ):
        _listed_run(tmp_path / "never", eval_client_data=False)


def test_eval_client_data_false_computes_nothing_from_client_data(tmp_path, shared_data_dir):
    published, listed = _listed_run(
        tmp_path,
        eval_client_data=False,
        **{"data.source": "mnist", "data.data_dir": os.path.join(shared_data_dir, "mnist")},
    )
    assert "test_accuracy" in published and "client_accuracy" not in published
    assert not os.path.exists(tmp_path / "run" / "client_accuracies.json")
    assert not {"client_accuracy", "test_accuracy", "client_accuracies.json"} & listed


def test_personalised_figures_of_a_dp_run_are_listed_and_cannot_be_dropped(tmp_path):
    from fedjax_dp.training.loop import run_experiment

    cfg = default_config()
    cfg.algorithm, cfg.rounds, cfg.eval_every, cfg.model.name = "cuag_pfl", 1, 1, "logistic"
    cfg.data.update(num_clients=10, test_fraction=0.25)
    cfg.client.batch_size, cfg.pfldyn.local_steps, cfg.sampling.cohort_size = 8, 2, 4
    cfg.compression.enabled, cfg.cuag.mode, cfg.cuag.participations = True, "sound", 1
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert any(line.startswith("personalized*: ") for line in privacy["outside_guarantee"])
    cfg.eval_client_data = False
    with pytest.raises(
        ValueError,
        match="eval_client_data=False: algorithm 'cuag_pfl' is scored only by personalised",
    ):
        run_experiment(cfg, str(tmp_path / "never"), progress=False)


def test_a_server_set_drawn_from_the_clients_voids_the_guarantee(tmp_path):
    from fedjax_dp.training.build import server_set_breaches
    from fedjax_dp.training.loop import run_experiment

    cfg = default_config()
    cfg.algorithm, cfg.rounds, cfg.eval_every = "dp_fedavg", 1, 1
    cfg.data.num_clients, cfg.model.name, cfg.sampling.cohort_size = 12, "logistic", 4
    cfg.client.update(epochs=1, batch_size=32)
    cfg.fedmeta.enabled = True
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert privacy["formal"] is False and summary.formal is False
    assert any(
        "drawn IID from the training clients' own examples" in note for note in privacy["notes"]
    )
    cfg.server_data.overlap = 0.0  # held-out writers only: no breach
    assert server_set_breaches(cfg) == []


def _tiny_dp_config(**dp):
    cfg = default_config()
    cfg.algorithm, cfg.rounds, cfg.eval_every = "dp_fedavg", 3, 3
    cfg.data.num_clients, cfg.model.name, cfg.sampling.cohort_size = 12, "logistic", 4
    cfg.client.update(epochs=1, batch_size=32)
    cfg.dp.update(dp)
    return cfg


def test_sampling_does_not_depend_on_the_shuffles(tmp_path, monkeypatch):
    """Sampling and per-client shuffles drew from one generator: a different number of local epochs
    (a different number of shuffle draws) changed which clients later rounds sampled."""
    from fedjax_dp.training import loop as loop_module

    cohorts = []
    from fedjax_dp.training import run_context

    original = run_context.sample_cohort
    monkeypatch.setattr(
        run_context,
        "sample_cohort",
        lambda *a, **k: cohorts.append(original(*a, **k)) or cohorts[-1],
    )
    runs = []
    for epochs in (1, 3):
        cohorts.clear()
        cfg = _tiny_dp_config()
        cfg.client.epochs = epochs
        loop_module.run_experiment(cfg, str(tmp_path / f"e{epochs}"), progress=False)
        runs.append([c.tolist() for c in cohorts])
    assert runs[0] == runs[1]


def test_secure_rng_noise_is_not_reproducible_from_the_seed_and_is_not_written(tmp_path):
    from fedjax_dp.training.loop import run_experiment

    def final(name, secure):
        cfg = _tiny_dp_config()
        cfg.privacy.secure_rng = secure
        summary = run_experiment(cfg, str(tmp_path / name), progress=False)
        return summary.final["test_loss"], json.load(open(tmp_path / name / "privacy.json"))

    (seeded_a, record), (seeded_b, _) = final("a", False), final("b", False)
    (secure_a, secure_record), (secure_b, _) = final("c", True), final("d", True)
    assert seeded_a == seeded_b and secure_a != secure_b
    assert record["noise_rng"] == "seeded" and secure_record["noise_rng"] == "secure"
    saved = json.load(open(tmp_path / "c" / "checkpoints" / "round_000003" / "loop" / "metadata"))
    assert saved["host_rngs"] is None
    seeded = json.load(open(tmp_path / "a" / "checkpoints" / "round_000003" / "loop" / "metadata"))
    assert len(seeded["host_rngs"]) == 2


def test_noise_is_gaussian_and_never_drawn_in_low_precision():
    from fedjax_dp.privacy.mechanisms.gaussian import (
        NOISE_DRAWS,
        gaussian_noise_like,
        standard_normal,
    )

    x = np.asarray(standard_normal(jax.random.key(0), (1_000_000,)), np.float64)
    # N(0, 1): variance and kurtosis
    assert abs(x.var() - 1) < 0.01 and abs(np.mean(x**4) - 3) < 0.05
    draws = jax.random.normal(jax.random.key(0), (NOISE_DRAWS, 10))
    np.testing.assert_allclose(
        standard_normal(jax.random.key(0), (10,)), draws.sum(0) / np.sqrt(NOISE_DRAWS), rtol=1e-6
    )
    noise = gaussian_noise_like({"w": jnp.zeros(8, jnp.bfloat16)}, 1.0, jax.random.key(1))
    assert noise["w"].dtype == jnp.float32


def test_model_initialisation_key_is_no_round_key():
    """The model was initialised with fold_in(root, 6), which is round 6's key."""
    from fedjax_dp.core import rng

    streams = rng.run_streams(0)
    init = jax.random.key_data(streams.model_init).tolist()
    for stream in (streams.rounds, streams.noise):
        keys = jax.vmap(lambda t: jax.random.key_data(rng.round_key(stream, t)))(jnp.arange(10_000))
        assert init not in np.asarray(keys).tolist()
