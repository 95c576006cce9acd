"""The privacy audit: it must catch broken mechanisms and never accuse sound ones."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.privacy.accounting.accountant import RoundEvent, epsilon_of
from fedjax_dp.privacy.audit.canary import (
    audit,
    clopper_pearson,
    dp_fedavg_round,
    epsilon_lower_bound,
)

DELTA = 1e-5


def _round(variant, z=1.0, d=50):
    others = jnp.asarray(np.random.default_rng(0).normal(size=(10, d)), jnp.float32)
    direction = jnp.zeros(d).at[0].set(1.0)
    return dp_fedavg_round(others, 10.0 * direction, 1.0, z, variant), direction  # canary norm 10 S


def _claim(z):
    return epsilon_of([(RoundEvent("full", z), 1)], DELTA, "pld")


@pytest.mark.parametrize("variant", ["no_noise", "noise_too_small", "no_clipping"])
def test_audit_catches_broken_mechanisms(variant):
    mechanism, direction = _round(variant)
    result = audit(mechanism, direction, _claim(1.0), DELTA, trials=20000)
    assert result.violated and result.epsilon_lower > _claim(1.0) + 1


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0])
def test_sound_mechanism_stays_below_its_claim(z):
    mechanism, direction = _round("sound", z)
    result = audit(mechanism, direction, _claim(z), DELTA, trials=20000, seed=int(10 * z))
    assert not result.violated
    # and the audit is not vacuous: it detects the canary somewhat
    assert result.epsilon_lower > 0.2


def test_audit_catches_mis_accounting():
    mechanism, direction = _round("sound", 1.0)  # runs with z = 1, claims what z = 4 would give
    assert audit(mechanism, direction, _claim(4.0), DELTA, trials=20000).violated


def test_clopper_pearson_and_bound_arithmetic():
    low, high = clopper_pearson(0, 100)
    assert low == 0 and high == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-9)
    low, high = clopper_pearson(50, 100)
    assert low == pytest.approx(0.3983, abs=1e-3) and high == pytest.approx(0.6017, abs=1e-3)
    out, inside = np.zeros(1000), np.ones(1000)  # perfectly separated
    _, fpr_high = clopper_pearson(0, 1000)
    tpr_low, _ = clopper_pearson(1000, 1000)
    assert epsilon_lower_bound(out, inside, 0.5, DELTA) == pytest.approx(
        np.log((tpr_low - DELTA) / fpr_high)
    )
    assert epsilon_lower_bound(out, out, 0.5, DELTA) == 0.0  # indistinguishable: no evidence
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(5, 3)
    with pytest.raises(ValueError, match="variant"):
        _round("slightly_broken")


@pytest.mark.slow  # 23 s quiet; the mechanism-level audits above run in the default suite
def test_end_to_end_audit_of_a_short_training_run():
    import jax
    import optax
    from fedjax_dp.algorithms.fedavg import FedAvg
    from fedjax_dp.core.round import FederatedRound
    from fedjax_dp.core.uploads import fixed_denominator
    from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
    from fedjax_dp.data.packing import pack_cohort
    from fedjax_dp.models import get_model
    from fedjax_dp.privacy.audit.canary import audit_training_run

    rng = np.random.default_rng(0)
    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    x, y = (
        rng.normal(size=(40, 4, 4, 1)).astype(np.float32),
        rng.integers(0, 3, 40).astype(np.int32),
    )
    cohort = pack_cohort(x, y, [np.arange(10 * k, 10 * k + 10) for k in range(4)], 10, 1, rng)
    canary = pack_cohort(
        np.full((10, 4, 4, 1), 5.0, np.float32), np.zeros(10, np.int32), [np.arange(10)], 10, 1, rng
    )
    z, rounds = 3.0, 3
    claim = epsilon_of([(RoundEvent("full", z), rounds)], DELTA, "pld")
    algorithm = FedAvg(model.per_example_loss, optax.sgd(1.0))
    round_for = lambda z: FederatedRound(
        algorithm,
        [FlatClip(1.0), GaussianNoise(((1, z),)), fixed_denominator(5)],  # noqa: E731
    )
    sound = audit_training_run(
        round_for, params, cohort, canary, rounds, z, claim, DELTA, trials=600
    )
    # noise off
    broken = audit_training_run(
        round_for, params, cohort, canary, rounds, 0.0, claim, DELTA, trials=600
    )
    assert not sound.violated and broken.violated


def _cuag_setting():
    return dict(sampling_rate=0.1, batch_size=50, dataset_size=500, local_steps=25)


@pytest.mark.parametrize("replacement", ["zero", "orthogonal"])
def test_audit_catches_cuag_paper_self_norm_clipping(replacement):
    """CUAG-PFL Alg. 4 as written (C_l = the layer's own norm) claims mu = 0.25 -> epsilon 0.93; the
    audit of one aggregation shows it holds no such guarantee, even against a same-norm
    replacement."""
    import warnings

    from fedjax_dp.privacy.accounting import gdp

    from fedjax_dp.privacy.mechanisms import adaptive_gdp
    from fedjax_dp.privacy.audit.canary import client_perturbation, cuag_round
    from fedjax_dp.privacy.mechanisms.upload_cuag_noise import CuagPaperNoise

    d = 50
    others = jnp.asarray(np.random.default_rng(0).normal(size=(2, d)), jnp.float32)
    direction = jnp.zeros(d).at[0].set(1.0)
    other = None if replacement == "zero" else 10.0 * jnp.zeros(d).at[1].set(1.0)
    claim = gdp.epsilon_from_mu(0.25, DELTA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        noise = CuagPaperNoise(mu=0.25, **_cuag_setting())  # round 1's sigma_t, as a run draws it
    assert noise.inputs(1)["sigma"] == adaptive_gdp.noise_scale(1, 0.25, **_cuag_setting())
    paper = client_perturbation([noise], {"a": jnp.zeros(d // 2), "b": jnp.zeros(d - d // 2)})
    result = audit(
        cuag_round(others, 10.0 * direction, paper, other), direction, claim, DELTA, trials=20000
    )
    assert result.violated and result.epsilon_lower > claim + 3


@pytest.mark.parametrize("mu", [0.25, 1.0])
def test_cuag_sound_mode_stays_below_its_accounted_claim(mu):
    from fedjax_dp.privacy.accounting import gdp
    from fedjax_dp.privacy.accounting.calibration import analytic_gaussian_sigma
    from fedjax_dp.privacy.audit.canary import client_perturbation, cuag_round
    from fedjax_dp.privacy.mechanisms.upload_cuag_noise import cuag_sound_noise

    d = 50
    # the canary client's own upload: the strongest view local noise must resist
    others = jnp.zeros((0, d))
    direction = jnp.zeros(d).at[0].set(1.0)
    claim = gdp.epsilon_from_mu(mu, DELTA)
    z = analytic_gaussian_sigma(claim, DELTA)  # one Gaussian release of sensitivity sqrt(sum C_l^2)
    sound = client_perturbation(
        cuag_sound_noise((1.0, 0.1), ((1, z),)), {"a": jnp.zeros(25), "b": jnp.zeros(25)}
    )
    result = audit(
        cuag_round(others, 10.0 * direction, sound), direction, claim, DELTA, trials=20000, seed=3
    )
    assert not result.violated
    assert result.epsilon_lower > 0.25 * claim  # not vacuous


@pytest.mark.parametrize("centred", [True, False])
def test_audit_of_the_adaptive_clip_count_catches_the_old_accounting(centred):
    """The count released 0/1 bits (sensitivity 1) while the claim assumed centred
    bits (1/2). With sigma_b = 1 the claim is a Gaussian of multiplier 2; the old release breaks
    it."""
    from fedjax_dp.privacy.audit.canary import adaptive_clip_count_round
    from fedjax_dp.privacy.mechanisms.upload_clipping import AdaptiveQuantileClip

    clip = AdaptiveQuantileClip(initial_clip_norm=1.0, count_noise_std=1.0, denominator=10)
    mechanism = adaptive_clip_count_round(
        clip, np.linspace(0.1, 3, 9), canary_norm=0.2, centred=centred
    )
    result = audit(mechanism, jnp.ones(1), _claim(2.0), DELTA, trials=200000)
    assert result.violated != centred
    assert result.epsilon_lower > 0.5  # not vacuous
