"""DP-FedAvg: reduces to FedAvg without noise or clipping, adds correctly scaled central and local
noise, contains NaN clients, labels median clipping, adapts S toward the target quantile."""

import math

import jax
import numpy as np
import optax
import pytest

from fedjax_dp.core.round import FederatedRound
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.models import get_model
from fedjax_dp.privacy.mechanisms import gaussian as mechanisms
from fedjax_dp.privacy.mechanisms.upload_clipping import AdaptiveQuantileClip, FlatClip
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config

from conftest import make_round, random_client_data

SIZES = [8, 8, 8, 8, 8, 8]


def setup(sizes=SIZES, seed=0):
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    data = random_client_data(np.random.default_rng(seed), sizes)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    offsets = np.cumsum([0, *sizes])
    cohort = pack_cohort(
        x,
        y,
        [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))],
        4,
        1,
        np.random.default_rng(seed),
    )
    return model, params, cohort


def dp_round(model, d=len(SIZES), z=0.0, clip="fixed", clip_norm=1.0, mode="central", lr=0.1, **dp):
    """DP-FedAvg as the loop builds it: FedAvg + chain(statistics, clip, gaussian, fixed
    denominator)."""
    return make_round(
        model,
        "dp_fedavg",
        num_clients=max(d, len(SIZES)),
        **{
            "sampling.cohort_size": d,
            "client.learning_rate": lr,
            "dp.noise_multiplier": z,
            "dp.clip": clip,
            "dp.clip_norm": clip_norm,
            "dp.noise_mode": mode,
            **{f"dp.{k}": v for k, v in dp.items()},
        },
    )


def run(runner, params, cohort, key):
    result = runner(runner.init(params), cohort, key)
    return result.state, result.metrics


def leaves(t):
    return jax.tree_util.tree_leaves(t)


def flat(t):
    return np.concatenate([np.ravel(x) for x in leaves(t)])


def test_no_noise_no_clipping_equals_fedavg():
    model, params, cohort = setup()
    want, _ = run(
        FederatedRound(FedAvg(model.per_example_loss, optax.sgd(0.1))),
        params,
        cohort,
        jax.random.key(1),
    )
    got, metrics = run(dp_round(model, clip_norm=1e6), params, cohort, jax.random.key(1))
    for a, b in zip(leaves(got.params), leaves(want.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert float(metrics["clipped_fraction"]) == 0.0


@pytest.mark.parametrize("mode", ["central", "local"])
def test_noise_has_the_calibrated_scale(mode):
    model, params, cohort = setup()
    z, clip, d = 2.0, 0.05, 4
    clean, _ = run(
        dp_round(model, d, 0.0, clip_norm=clip, mode=mode), params, cohort, jax.random.key(1)
    )
    noisy, _ = run(
        dp_round(model, d, z, clip_norm=clip, mode=mode), params, cohort, jax.random.key(1)
    )
    noise = flat(noisy.params) - flat(clean.params)
    # central: one N(0, (zS)^2) draw on the sum; local: one per client (6 of them); both divided by
    # D
    std = z * clip / d * (math.sqrt(len(SIZES)) if mode == "local" else 1.0)
    n = noise.size  # 51 entries: sd of the sample variance is std^2 sqrt(2/(n-1))
    assert abs(noise.var() / std**2 - 1) < 5 * math.sqrt(2 / (n - 1))


def test_clipped_updates_respect_the_bound():
    model, params, cohort = setup()
    state, metrics = run(dp_round(model, clip_norm=1e-3, lr=1.0), params, cohort, jax.random.key(1))
    shift = np.linalg.norm(flat(state.params) - flat(params))
    assert shift <= 1e-3 * (1 + 1e-4) and float(metrics["clipped_fraction"]) == 1.0


def test_nan_client_is_dropped_counted_and_never_reaches_the_model():
    model, params, cohort = setup()
    cohort["batches"]["x"] = cohort["batches"]["x"].copy()
    cohort["batches"]["x"][2, 0, 0] = np.nan
    for clip in ("fixed", "median", "adaptive"):
        state, metrics = run(dp_round(model, z=1.0, clip=clip), params, cohort, jax.random.key(1))
        assert int(metrics["dropped_clients"]) == 1, clip
        assert np.all(np.isfinite(flat(state.params))), clip


def test_median_clipping_is_labelled_not_private_and_uses_the_median():
    model, params, cohort = setup()
    runner = dp_round(model, clip="median")
    # the threshold, the noise
    assert [r.formal for r in runner.uploads.releases(1)] == [False, True]
    _, metrics = run(runner, params, cohort, jax.random.key(1))
    assert float(metrics["clip_norm"]) == pytest.approx(float(metrics["median_update_norm"]))
    assert 0.3 <= float(metrics["clipped_fraction"]) <= 0.5  # half of 6 clients, ties aside


def test_adaptive_clipping_moves_toward_the_quantile():
    model, params, cohort = setup()
    runner = dp_round(model, z=1.0, clip="adaptive", clip_norm=1e-4)
    position = [i for i, t in enumerate(runner.uploads) if isinstance(t, AdaptiveQuantileClip)][0]
    assert runner.uploads[position].count_noise_std == 1.0  # sigma_b = max(D / 20, 1)
    state = runner.init(params)
    norms = []
    # every update is larger than S: the unclipped fraction is ~0 < 0.5, so S grows
    for t in range(8):
        state = runner(state, cohort, jax.random.key(t)).state
        norms.append(float(state.uploads[position]))
    assert norms[-1] > 1e-4 * math.exp(0.2 * 0.5 * 8) * 0.3
    noise = [t for t in runner.uploads if isinstance(t, GaussianNoise)][0]
    assert noise.update_multiplier(1.0) > 1.0  # the count's privacy is paid by more update noise


def _tf_privacy_quantile_step(estimate, norms, noise, denominator, target, learning_rate):
    """TF Privacy's ``QuantileEstimatorQuery`` (geometric update), transcribed from
    tensorflow_privacy/privacy/dp_query/quantile_estimator_query.py: each record contributes
    (norm <= estimate) - 0.5 to a Gaussian sum query normalised by ``denominator``; then
    below = clip(result + 0.5, 0, 1) and estimate * exp(-lr (below - target))."""
    result = (sum(float(n <= estimate) - 0.5 for n in norms) + noise) / denominator
    below = min(1.0, max(0.0, result + 0.5))
    return estimate * math.exp(-learning_rate * (below - target))


def test_the_adaptive_clip_follows_tf_privacys_quantile_estimator_clamp_included():
    """A seeded sequence of cohorts (sizes 1-12 around D = 4, so the unclipped fraction often leaves
    [0, 1] before the clamp) through the transform's own client and server sides; the count noise is
    what the transform drew (read back from a zero-count call with the same key)."""
    from fedjax_dp.core import rng as rng_lib
    from fedjax_dp.core.uploads import ClientContext, ServerContext

    clip = AdaptiveQuantileClip(
        initial_clip_norm=1.0,
        target_quantile=0.3,
        learning_rate=0.5,
        count_noise_std=1.5,
        denominator=4.0,
    )
    generator = np.random.default_rng(7)
    state, reference, clamped = clip.init(None), 1.0, 0
    for t in range(40):
        norms = generator.lognormal(0.0, 1.0, size=generator.integers(1, 13)).astype(np.float32)
        key = jax.random.key(t)
        count = sum(
            clip.client(
                {"w": np.array([n], np.float32)},
                ClientContext(state, {}, np.inf, None, np.bool_(True), np.bool_(True)),
            ).extras["count"]
            for n in norms
        )
        everyone = np.ones(len(norms), bool)
        ctx = lambda extras: ServerContext(
            state,
            {},
            state,
            None,
            extras,  # noqa: E731
            {"norm": norms, "clipped": norms > 0},
            everyone,
            everyone,
            key,
        )
        noise = float(
            clip.count_noise_std
            * mechanisms.standard_normal(
                rng_lib.purpose_key(key, rng_lib.Purpose.CLIP_ADAPTATION), ()
            )
        )
        unclamped = (float(count) + noise) / 4.0 + 0.5
        clamped += not 0 <= unclamped <= 1
        _, state, _ = clip.server(None, ctx({"count": count}))
        reference = _tf_privacy_quantile_step(reference, norms, noise, 4.0, 0.3, 0.5)
        assert float(state) == pytest.approx(reference, rel=1e-5), t
    assert clamped >= 5  # the sequence exercises the clamp


def test_variance_metrics_match_definition():
    model, params, cohort = setup()
    _, metrics = run(dp_round(model, clip_norm=1e6), params, cohort, jax.random.key(1))
    fedavg = FederatedRound(FedAvg(model.per_example_loss, optax.sgd(0.1)))
    deltas = []
    for c in range(len(SIZES)):
        one = {
            k: jax.tree_util.tree_map(lambda a: a[c : c + 1], v) if k != "example_index" else v
            for k, v in cohort.items()
        }
        s, _ = run(fedavg, params, one, jax.random.key(1))
        deltas.append(flat(s.params) - flat(params))
    deltas = np.stack(deltas)
    mu = deltas.mean(0)
    assert float(metrics["between_client_variance"]) == pytest.approx(
        np.mean((deltas - mu) ** 2), rel=1e-3
    )
    assert float(metrics["update_scale"]) == pytest.approx(np.mean(mu**2), rel=1e-3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="clip norm S must be > 0, got -1"):
        FlatClip(-1)
    with pytest.raises(ValueError, match="noise multipliers must be >= 0"):
        GaussianNoise(((1, -0.5),))
    cfg = default_config()
    cfg.algorithm, cfg.dp.clip, cfg.dp.noise_multiplier = "dp_fedavg", "huge", -0.5
    with pytest.raises(ValueError) as error:
        validate_config(cfg)
    assert "dp.clip 'huge' unknown" in str(error.value) and "got -0.5" in str(error.value)


@pytest.mark.parametrize("path, value", [("rounds", 0), ("data.num_clients", 0)])
def test_a_bad_round_or_client_count_is_reported_once_under_calibration(path, value):
    """The calibration of ``privacy.target_epsilon`` needs both counts: it is not tried (and does
    not repeat the count's error in its own words) when one of them is refused."""
    from fedjax_dp.configs.dp_fedavg_mnist import get_config

    cfg = get_config()
    *sections, key = path.split(".")
    (cfg[sections[0]] if sections else cfg)[key] = value
    with pytest.raises(ValueError, match=f"{path} must be >= 1, got 0") as error:
        validate_config(cfg)
    assert "privacy.target_epsilon" not in str(error.value)


def test_calibrated_local_noise_spends_the_target_epsilon_not_more(tmp_path):
    """Bug (found for issue 19): ``privacy.target_epsilon`` under ``dp.noise_mode='local'``
    calibrated z for the central, sampling-amplified event, so a client in every round spent far
    more than the target (the report said so: the accounting was right, the calibration wrong).
    Local noise is accounted per client without amplification, replace-one (sensitivity 2S): z must
    be calibrated for that. Every client takes part in every round here (q = 1), so the report is
    the worst client's."""
    from fedjax_dp.experiment import Experiment

    summary = Experiment(
        "fedavg_mnist",
        {
            "algorithm": "dp_fedavg",
            "rounds": 3,
            "eval_every": 3,
            "data.num_clients": 8,
            "sampling.method": "poisson",
            "sampling.rate": 1.0,
            "client.epochs": 1,
            "client.batch_size": 50,
            "dp.noise_mode": "local",
            "privacy.target_epsilon": 8.0,
            "privacy.delta": 1e-5,
            "model.name": "logistic",
        },
    ).run(str(tmp_path / "r"), progress=False)
    assert summary.rounds == 3
    assert summary.epsilon <= 8.0 + 1e-3
    assert summary.epsilon == pytest.approx(8.0, rel=0.02)  # calibrated, not merely over-noised


def test_a_calibrated_run_says_what_z_was_calibrated_to_beside_the_realised_epsilon(tmp_path):
    """Issue 74, item 20: under local noise privacy.target_epsilon=4 reported 2.84 (z is calibrated
    for a client in every round, the report is the realised maximum); both are now said, in
    privacy.json and the printed summary."""
    import json

    from fedjax_dp.training.loop import run_experiment

    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.model.name = "dp_fedavg", 3, 3, "logistic"
    c.data.num_clients, c.sampling.cohort_size = 20, 4
    c.client.update(epochs=1, batch_size=32)
    c.dp.noise_mode, c.privacy.target_epsilon = "local", 4.0
    summary = run_experiment(c, str(tmp_path / "run"), progress=False)
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert privacy["accounting"]["calibrated_epsilon"] == 4.0
    assert "every one of the 3 rounds" in privacy["accounting"]["calibrated_for"]
    assert summary.epsilon < 4.0  # no client took part in all 3 rounds of 4 of 20
    line = next(row for row in summary.format().splitlines() if row.startswith("calibrated"))
    assert "epsilon 4 for a client taking part in every one of the 3 rounds" in line
    assert f"realised max over clients {summary.epsilon:.4g}" in line


def test_a_sampling_rate_schedule_divides_round_t_by_its_own_q_t_k():
    """Geyer et al.'s 1 / m_t: with a denominator schedule the round divides the sum by D_t (a
    traced input: one program), so round 2 of ((1, 10), (2, 20)) equals a constant D = 20 and moves
    half as far as round 1."""
    from fedjax_dp.core.uploads import chain, fixed_denominator

    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    data = random_client_data(np.random.default_rng(0), [6] * 4)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    cohort = pack_cohort(
        x, y, [np.arange(6 * k, 6 * k + 6) for k in range(4)], 3, 1, np.random.default_rng(1)
    )

    def step(denominators, round_index):
        fedavg = FederatedRound(
            FedAvg(model.per_example_loss, optax.sgd(0.1)), uploads=chain(denominators)
        )
        state = fedavg.init(params)
        new = fedavg(state, cohort, jax.random.key(3), round_index=round_index).state.params
        return [
            np.asarray(a) - np.asarray(b)
            for a, b in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(params))
        ]

    scheduled = fixed_denominator(10.0, ((1, 10.0), (2, 20.0)))
    first, second = step(scheduled, 1), step(scheduled, 2)
    for one, two, constant in zip(first, second, step(fixed_denominator(20.0), 1)):
        # float32 rounding of w + delta (parameters ~ 1)
        np.testing.assert_allclose(two, constant, atol=1e-7)
        np.testing.assert_allclose(two, one / 2, atol=1e-7)
    assert max(float(np.abs(d).max()) for d in first) > 1e-3  # the round moved the model


def test_a_rate_schedule_samples_and_accounts_each_round_at_its_own_rate(tmp_path):
    """``sampling.rate_schedule='1:0.1,4:0.3'``: rounds 1-3 draw about q K = 50 of the 500 clients,
    rounds 4-6 about 150, and the epsilon is dp_accounting's composition of 3 rounds at q = 0.1 and
    3 at q = 0.3; calibrating one z to the schedule, or an adaptive clip's fixed expected count, is
    refused by name before any data is loaded."""
    import json

    from fedjax_dp.experiment import Experiment
    from fedjax_dp.privacy import Accountant, RoundEvent

    overrides = {
        "rounds": 6,
        "privacy.target_epsilon": 0.0,
        "dp.noise_multiplier": 1.0,
        "dp.clip": "fixed",
        "sampling.rate_schedule": "1:0.1,4:0.3",
    }
    summary = Experiment("dp_fedavg_mnist", overrides).run(
        str(tmp_path), overwrite=True, progress=False
    )
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    sizes = [r["cohort_size"] for r in rows if "cohort_size" in r]
    assert max(sizes[:3]) < 90 < 110 < min(sizes[3:])
    want = Accountant("pld").compose(RoundEvent("poisson", 1.0, sampling_rate=0.1), 3)
    want.compose(RoundEvent("poisson", 1.0, sampling_rate=0.3), 3)
    assert summary.formal and summary.epsilon == pytest.approx(want.epsilon(1e-5), rel=1e-9)
    assert json.load(open(tmp_path / "privacy.json"))["sampling_rates"] == [0.1, 0.3]
    for bad, key in (
        (dict(overrides, **{"privacy.target_epsilon": 4.0}), "privacy.target_epsilon"),
        (dict(overrides, **{"dp.clip": "adaptive"}), "dp.clip='adaptive'"),
        (dict(overrides, **{"sampling.rate_schedule": "2:0.1"}), "must start at round 1"),
        (dict(overrides, **{"sampling.rate_schedule": "1:1.5"}), "every q must lie in (0, 1]"),
    ):
        with pytest.raises(
            ValueError,
            match=key.replace("(", r"\(")
            .replace(")", r"\)")
            .replace("[", r"\[")
            .replace("]", r"\]"),
        ):
            Experiment("dp_fedavg_mnist", bad)
