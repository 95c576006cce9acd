"""CUAG-PFL's adaptive Gaussian noise (seed 004, Alg. 4): the paper's formulas, its self-norm
clipping as written, the sound variant, and the accounting of the schedule actually run."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.privacy.accounting import gdp

from fedjax_dp.privacy.mechanisms import adaptive_gdp

SETTING = dict(sampling_rate=0.1, batch_size=50, dataset_size=500, local_steps=25)


def test_sigma_schedule_plugs_back_into_the_papers_mu_and_the_headline_epsilon():
    # the paper's mu = 0.25 -> 0.92
    assert gdp.epsilon_from_mu(0.25, 1e-5) == pytest.approx(0.92, abs=0.01)
    for t in (1, 7, 300):
        sigma = adaptive_gdp.noise_scale(t, 0.25, **SETTING)
        # by hand: sigma_t = sqrt(1 / ln(mu^2 |D|^2 / (4 lambda^2 B^2 t P) + 1))
        by_hand = math.sqrt(1 / math.log(0.25**2 * 500**2 / (4 * 0.1**2 * 50**2 * t * 25) + 1))
        assert sigma == pytest.approx(by_hand, rel=1e-12)
        assert adaptive_gdp.formula_mu(sigma, t, **SETTING) == pytest.approx(0.25, rel=1e-12)
    assert adaptive_gdp.noise_scale(2, 0.25, **SETTING) > adaptive_gdp.noise_scale(
        1, 0.25, **SETTING
    )


def test_the_schedule_actually_run_spends_mu_sqrt_harmonic_not_mu():
    harmonic = sum(1 / t for t in range(1, 301))
    assert adaptive_gdp.schedule_mu(300, 0.25, **SETTING) == pytest.approx(
        0.25 * math.sqrt(harmonic), rel=1e-9
    )
    claim = adaptive_gdp.paper_claim(300, 0.25, 1e-5, **SETTING)
    assert claim["formal_guarantee"] is False and "NO formal" in claim["note"]
    assert claim["epsilon_schedule_clt"] > 2.5 * claim["epsilon_claimed"]


def test_paper_mode_noise_scales_with_each_layers_own_norm():
    layers = {"small": jnp.full((20000,), 0.01), "big": jnp.full((20000,), 3.0)}
    # what CuagPaperNoise.client runs
    noisy = adaptive_gdp.paper_perturb(layers, jax.random.key(0), 0.7, 50)
    for name, x in layers.items():
        expected_std = 2 * float(jnp.linalg.norm(x)) * 0.7 / 50
        assert float(jnp.std(noisy[name] - x)) == pytest.approx(expected_std, rel=0.03)
    zero = adaptive_gdp.paper_perturb({"w": jnp.zeros(5)}, jax.random.key(1), 0.7, 50)
    # a zero upload gets no noise at all: nothing is bounded
    np.testing.assert_array_equal(zero["w"], 0.0)


def test_sound_mode_clips_each_layer_and_adds_noise_of_the_joint_sensitivity():
    """The sound mode's transforms as a run has them (``cuag_sound_noise``: per-layer clip, then
    local noise of z sqrt(sum_l C_l^2))."""
    from fedjax_dp.privacy.audit.canary import client_perturbation
    from fedjax_dp.privacy.mechanisms.upload_cuag_noise import cuag_sound_noise

    layers = {"a": jnp.full((40000,), 1.0), "b": jnp.full((40000,), 1e-4)}
    perturb = client_perturbation(cuag_sound_noise((3.0, 4.0), ((1, 0.5),)), layers)
    noisy = perturb(layers, jax.random.key(0))
    for name in layers:
        assert float(jnp.std(noisy[name] - jnp.mean(noisy[name]))) == pytest.approx(
            0.5 * 5.0, rel=0.03
        )
    clean = client_perturbation(cuag_sound_noise((3.0, 4.0), ((1, 1e-9),)), layers)(
        layers, jax.random.key(0)
    )
    assert float(jnp.linalg.norm(clean["a"])) == pytest.approx(3.0, rel=1e-5)
    np.testing.assert_allclose(clean["b"], layers["b"], atol=1e-6)  # under its threshold: untouched


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="t = 1, got 0"):
        adaptive_gdp.noise_scale(0, 0.25, **SETTING)
    with pytest.raises(ValueError, match="mu must be .* got -1"):
        adaptive_gdp.noise_scale(1, -1, **SETTING)
    with pytest.raises(ValueError, match="batch_size must be .* got 0"):
        adaptive_gdp.noise_scale(1, 0.25, **{**SETTING, "batch_size": 0})
