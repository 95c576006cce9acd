"""The DP baselines of CUAG-PFL (seed 004 §7.2.3): UDP, PriFedSync, DP-SCAFFOLD."""

import json
import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from fedjax_dp.algorithms import dp_scaffold, prifedsync
from fedjax_dp.algorithms.scaffold import Scaffold
from fedjax_dp.core.strategy import StrategyChoice
from fedjax_dp.data.packing import pack_sampled_cohort
from fedjax_dp.models import get_model
from fedjax_dp.core.round import STEP_NOISE as STEP_NOISE_KEY
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient
from fedjax_dp.training.build import build_round
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


def _config(algorithm, **overrides):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = algorithm, 3, 3
    c.data.update(num_clients=10, test_fraction=0.25)
    c.model.name = "logistic"
    c.client.update(batch_size=8, learning_rate=0.1)
    c.sampling.cohort_size = 4
    if algorithm in ("pfldyn_proto", "prifedsync"):
        c.pfldyn.local_steps = 2
    if algorithm == "dp_scaffold":
        c.dp_scaffold.local_steps = 3
    c.engine.update(strategy="vmap", unroll="1")
    for path, value in overrides.items():
        section, key = path.split(".")
        c[section][key] = value
    return c


def _run(tmp_path, name, algorithm, **overrides):
    workdir = tmp_path / name
    run_experiment(_config(algorithm, **overrides), str(workdir), progress=False)
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    return rows, json.load(open(workdir / "privacy.json"))


def _gdp_delta(mu, epsilon):
    """delta(epsilon) of mu-GDP (Dong, Roth, Su 2019, Cor. 2.13), written out independently of
    privacy.accounting.gdp."""
    return stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(
        epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2)
    )


def _uploads(cfg, num_clients=10, size=100):
    model = get_model("logistic", (28, 28, 1), 10)
    choice = StrategyChoice(strategy="vmap", chunk_size=None, unroll=1, conv_impl="xla")
    return build_round(cfg, model, choice, num_clients, client_sizes=(size,) * num_clients).uploads


def _population(num_clients=10, size=100):
    return SimpleNamespace(num_clients=num_clients, train_sizes=lambda: np.full(num_clients, size))


def _tracker(cfg, num_clients=10, size=100):
    """The run's tracker as the loop builds it (``training.build.privacy_tracker``)."""
    from fedjax_dp.training.build import privacy_tracker

    model = get_model("logistic", (28, 28, 1), 10)
    choice = StrategyChoice(strategy="vmap", chunk_size=None, unroll=1, conv_impl="xla")
    runner = build_round(cfg, model, choice, num_clients, client_sizes=(size,) * num_clients)
    return privacy_tracker(cfg, runner, _population(num_clients, size))


def test_udp_paper_noise_is_wei_et_als_record_level_calibration_composed_unformally():
    cfg = _config("udp")
    cfg.rounds = 5
    uploads = _uploads(cfg, size=100)
    c = math.sqrt(2 * math.log(1.25 / 1e-5))
    releases = {t: uploads.releases(t)[0] for t in range(1, 6)}
    for t, release in releases.items():  # z_t = 2 c sqrt(t) / (epsilon m): grows with the rounds
        assert uploads.inputs(t)[1]["z"] == pytest.approx(
            2 * c * math.sqrt(t) / (10.0 * 100), rel=1e-12
        )
        # per C / m
        assert release.noise_multiplier == pytest.approx(2 * c * math.sqrt(t) / 10.0, rel=1e-12)
        assert not release.formal
    tracker = _tracker(cfg)
    tracker.record(1, np.array([0, 1]), uploads.releases(1))
    tracker.record(4, np.array([0, 2]), uploads.releases(4))
    eps = tracker.ledger.epsilons()
    z = {t: releases[t].noise_multiplier for t in (1, 4)}
    mu0 = math.sqrt((2 / z[1]) ** 2 + (2 / z[4]) ** 2)  # client 0 ran rounds 1 and 4
    assert _gdp_delta(mu0, eps[0]) == pytest.approx(1e-5, rel=1e-6)
    assert _gdp_delta(2 / z[4], eps[2]) == pytest.approx(1e-5, rel=1e-6)
    # one round-1 participation passes 10
    assert eps[1] == pytest.approx(10.3939, abs=1e-3) and eps[3] == 0
    report = tracker.report()
    assert report.epsilons["paper_claim"] == 10.0 and not report.formal
    assert report.epsilons["clients_over_claim"] == int((eps > 10).sum()) == 2


def test_udp_as_written_lets_clients_pass_its_claim_and_the_sound_mode_does_not(tmp_path):
    _, written = _run(tmp_path, "written", "udp")
    rows, sound = _run(tmp_path, "sound", "udp", **{"udp.mode": "sound"})
    assert written["epsilons"]["clients_over_claim"] > 0 and written["formal"] is False
    assert sound["epsilons"]["clients_over_claim"] == 0 and sound["epsilon"] <= 10.0
    assert (
        sound["epsilons"]["clients_participated"] >= 4
        and sound["formal"]
        and rows[-1]["test_accuracy"] > 0
    )


def test_udp_sound_noise_keeps_the_sqrt_t_growth_and_any_k_participations_fit_the_budget():
    cfg = _config("udp", **{"udp.mode": "sound", "udp.participations": 4})
    cfg.rounds = 20
    uploads = _uploads(cfg)
    z = np.array([uploads.releases(t)[0].noise_multiplier for t in range(1, 21)])
    np.testing.assert_allclose(z / z[0], np.sqrt(np.arange(1, 21)), rtol=1e-12)
    # rounds 1-4, the costliest four, spend exactly the budget
    worst = math.sqrt(np.sum((2 / z[:4]) ** 2))
    # (a hair under: kappa is 1e-9 above)
    assert _gdp_delta(worst, 10.0) == pytest.approx(1e-5, rel=1e-6)
    tracker = _tracker(cfg)
    # a first-round participation fits (an expected-cost
    assert tracker.eligible(1, uploads.releases(1)).all()
    for t in range(1, 5):  # calibration would not)
        tracker.record(t, np.array([0]), uploads.releases(t))
    # spent: 0 stops
    assert tracker.ledger.epsilons()[0] <= 10.0 and not tracker.eligible(5, uploads.releases(5))[0]


def test_prifedsync_noise_is_alg4s_at_a_fixed_sigma_exact_epsilon_and_the_seeds_figure_beside():
    cfg = _config("prifedsync")
    uploads = _uploads(cfg)
    # 2 sigma / (B sqrt(L)): logistic regression has L = 2 layers, B = 8
    z = 2 * 0.45 / (8 * math.sqrt(2))
    assert [r.noise_multiplier for r in uploads.releases(7)] == [pytest.approx(z, rel=1e-12)]
    assert uploads.releases(1)[0].locality == "local" and uploads.releases(1)[0].formal
    tracker = _tracker(cfg, size=100)
    for t, ids in enumerate(([0, 1], [0, 2], [0, 1]), start=1):
        tracker.record(t, np.array(ids), uploads.releases(t))
    eps = tracker.ledger.epsilons()
    assert _gdp_delta(math.sqrt(3) * 2 / z, eps[0]) == pytest.approx(1e-5, rel=1e-6)
    assert _gdp_delta(math.sqrt(2) * 2 / z, eps[1]) == pytest.approx(1e-5, rel=1e-6)
    report = tracker.report()
    assert report.epsilon == eps[0] and report.formal
    mu = 0.4 * 8 / 100 * math.sqrt(3 * math.expm1(0.45**-2))  # q = lambda B / |D|, t = 3 rounds
    assert _gdp_delta(mu, report.epsilons["paper_claim"]) == pytest.approx(1e-5, rel=1e-6)


def test_prifedsyncs_claimed_figure_reproduces_the_seeds_epsilon_range():
    from fedjax_dp.privacy.accounting.gdp import epsilon_from_mu

    claimed = [
        epsilon_from_mu(prifedsync.claimed_mu(0.45, t, 0.1, 50, 500), 1e-5) for t in (1, 300)
    ]
    # seed 004 §7.3
    assert claimed == [pytest.approx(0.41, abs=0.005), pytest.approx(10.24, abs=0.005)]


def test_prifedsync_without_effective_noise_or_clip_is_pfldyn_proto(tmp_path):
    plain, _ = _run(tmp_path, "pfl", "pfldyn_proto")
    private, record = _run(
        tmp_path, "pri", "prifedsync", **{"prifedsync.clip_norm": 1e3, "prifedsync.sigma": 1e-9}
    )
    for a, b in zip(plain[1:], private[1:]):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert private[-1]["personalized_accuracy"] == pytest.approx(
        plain[-1]["personalized_accuracy"], abs=0.02
    )
    assert record["unit"] == "client" and record["noise_mode"] == "local"


def _quadratic_loss(params, batch, key=None):
    """l(w; x) = ||w - x||^2 / 2 per example: its gradient w - x, its norm known."""
    return 0.5 * jnp.sum(jnp.square(params["w"][None, :] - batch["x"]), axis=1)


def test_the_median_clip_clips_each_example_at_the_batchs_median_norm_and_is_not_formal():
    # 5th: padding
    x = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 4.0], [9.0, 9.0]], np.float32)
    mask = jnp.array([True, True, True, True, False])
    hook = ClippedNoisyGradient(1.0, 0.0, median_clip=True)
    _, grads = hook(
        _quadratic_loss, {"w": jnp.zeros(2)}, {"x": jnp.asarray(x)}, mask, jax.random.key(0)
    )
    median = 2.5  # of the real norms 1, 2, 3, 4
    want = sum(-row * min(1.0, median / np.linalg.norm(row)) for row in x[:4]) / 5
    np.testing.assert_allclose(grads["w"], want, rtol=1e-6)
    assert not hook.step_release().formal and ClippedNoisyGradient(1.0, 1.0).step_release().formal
    with pytest.raises(ValueError, match="needs per_example=True"):
        ClippedNoisyGradient(1.0, 1.0, per_example=False, median_clip=True)


def test_dp_scaffold_with_a_clip_that_never_binds_and_no_noise_is_scaffold():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 2)).astype(np.float32)
    cohort = pack_sampled_cohort(
        x, np.zeros(24, np.int32), [np.arange(12), np.arange(12, 24)], 4, 3, rng
    )
    client = {
        "batches": {"x": jnp.asarray(cohort["batches"]["x"][0])},
        "mask": jnp.asarray(cohort["mask"][0]),
        "noise_key": jax.random.key(5),
        STEP_NOISE_KEY: jnp.float32(0.0),
    }
    params = {"w": jnp.array([0.5, -1.0])}
    shared = (params, {"w": jnp.array([0.1, 0.2])}, jnp.int32(0))
    own = {"w": jnp.array([-0.3, 0.05])}
    args, fields = (_quadratic_loss, optax.sgd(0.1)), dict(local_learning_rate=0.1, num_clients=2)
    want = Scaffold(*args, **fields).client_update(shared, client, own, jax.random.key(1))
    got = dp_scaffold.DpScaffold(*args, **fields, clip_norm=1e6, local_steps=3).client_update(
        shared, client, own, jax.random.key(1)
    )
    for a, b in zip(
        jax.tree_util.tree_leaves((want.upload, want.client_state)),
        jax.tree_util.tree_leaves((got.upload, got.client_state)),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    noisy = dp_scaffold.DpScaffold(*args, **fields, clip_norm=1.0, local_steps=3).client_update(
        shared, client | {STEP_NOISE_KEY: jnp.float32(1.0)}, own, jax.random.key(1)
    )
    assert not np.allclose(noisy.upload["model"]["w"], got.upload["model"]["w"])


def test_dp_scaffold_clients_hold_the_configured_steps_and_clip_and_the_ledger_accounts_them():
    """The ledger is built from the clients that run (``make_ledger``'s ``algorithm``), and the
    built clients hold the config's steps, clip and clip rule (their fields are keyword-only: a
    field added to Scaffold cannot shift them, as one added to FedAvg once shifted
    LdpMinibatch's)."""
    cfg = _config("dp_scaffold", **{"dp_scaffold.clip_norm": 0.3, "dp_scaffold.clip": "fixed"})
    model = get_model("logistic", (28, 28, 1), 10)
    choice = StrategyChoice(strategy="vmap", chunk_size=None, unroll=1, conv_impl="xla")
    clients = build_round(cfg, model, choice, 10, client_sizes=(100,) * 10).algorithm
    assert (clients.local_steps, clients.clip_norm, clients.median_clip) == (3, 0.3, False)
    accounting = dp_scaffold.make_ledger(cfg, _population(), clients)
    assert accounting.ledger.steps == 3 and accounting.clip_norm == 0.3 and accounting.formal
    with pytest.raises(TypeError, match="positional"):
        dp_scaffold.DpScaffold(_quadratic_loss, optax.sgd(0.1), 0.1, 2, optax.sgd(1.0), 1.0, 1, 0.3)


def test_dp_scaffold_as_written_is_labelled_and_its_fixed_clip_is_formal_with_thresholds_kept(
    tmp_path,
):
    rows, written = _run(tmp_path, "median", "dp_scaffold")
    assert written["formal"] is False and rows[-1]["formal"] is False
    assert any("median" in note and "NO formal guarantee" in note for note in written["notes"])
    _, fixed = _run(tmp_path, "fixed", "dp_scaffold", **{"dp_scaffold.clip": "fixed"})
    assert fixed["formal"] is True and fixed["unit"] == "example"
    # same z, same steps: same composition
    assert fixed["epsilon"] == pytest.approx(written["epsilon"])
    _, capped = _run(
        tmp_path,
        "capped",
        "dp_scaffold",
        **{"dp_scaffold.clip": "fixed", "privacy.client_epsilon_budget": 8.0},
    )
    spread = capped["epsilons"]["per_client"]
    assert capped["epsilon"] <= 8.0 and spread["thresholds_min_max"] == [8.0, 8.0]
    # a client's second participation would pass 8 (one costs ~7)
    assert spread["stopped_before_round"]


@pytest.mark.parametrize(
    "algorithm, path, value, message",
    [
        ("udp", "udp.epsilon", 0.0, "udp.epsilon .* must be > 0, got 0.0"),
        ("udp", "udp.clip_norm", -1.0, "udp.clip_norm C must be > 0, got -1.0"),
        ("prifedsync", "prifedsync.sigma", 0.0, "prifedsync.sigma must be > 0"),
        ("prifedsync", "pfldyn.alpha", 0.0, "pfldyn.alpha must be > 0"),
        ("udp", "udp.mode", "claimed", "udp.mode 'claimed' unknown"),
        ("dp_scaffold", "dp_scaffold.clip", "mean", "dp_scaffold.clip 'mean' unknown"),
        ("dp_scaffold", "privacy.accountant", "gdp", "privacy.accountant 'gdp' unknown"),
        ("dp_scaffold", "client.momentum", 0.9, "plain SGD clients"),
        (
            "fedavg",
            "udp.epsilon",
            5.0,
            "udp.epsilon=5.0 is set, but algorithm 'fedavg' does not read section 'udp'",
        ),
    ],
)
def test_bad_baseline_input_is_refused_before_loading(tmp_path, algorithm, path, value, message):
    c = _config(algorithm)
    c.data.source = "/no/such/source/but/validation/comes/first"
    section, key = path.split(".")
    c[section][key] = value
    with pytest.raises(ValueError, match=message):
        run_experiment(c, str(tmp_path / "never"), progress=False)
