"""Per-layer adaptive quantile clipping (Andrew et al. 2021 per layer), central and local counts,
and CUAG-PFL's sound mode with it (issue 17: "fixed per-layer C_l or per-layer private adaptive
quantile")."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core.uploads import ClientContext, ServerContext
from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.accounting.calibration import constant_multipliers, upload_mus
from fedjax_dp.privacy.mechanisms.upload_layer_quantile_clip import PerLayerQuantileClip
from fedjax_dp.training.loop import run_experiment

from test_pfldyn_cuag import _pfl_config


def _client(clip, upload, state, key=0, present=True):
    ctx = ClientContext(
        state,
        {},
        jnp.inf,
        jax.random.key(key),
        jnp.asarray(present),
        jnp.asarray(present),
        0,
        count_key=jax.random.key(10_000 + key),
    )
    return clip.client(upload, ctx)


def _server(clip, flows, state, key=7):
    counts = sum(f.extras["layer_counts"] for f in flows)
    n = len(flows)
    ctx = ServerContext(
        state,
        {},
        clip.bound_after(None, state, None),
        jax.random.key(0),
        {"layer_counts": counts},
        {
            "norm": jnp.stack([f.stats["norm"] for f in flows]),
            "clipped": jnp.stack([f.stats["clipped"] for f in flows]),
        },
        jnp.ones(n, bool),
        jnp.ones(n, bool),
        jax.random.key(key),
    )
    return clip.server(None, ctx)


@pytest.mark.parametrize("local", [False, True])
def test_each_layer_threshold_follows_its_own_unclipped_fraction(local):
    """Layer 'a' is clipped in every client (norm 10 > C = 1): b_bar = 0 and C_a grows by exp(eta
    gamma); layer 'b' never is (norm 0.1): b_bar = 1 and C_b shrinks by exp(-eta (1 - gamma)); with
    almost no count noise, exactly Andrew et al.'s update per layer. The joint bound is sqrt(sum
    C_l^2)."""
    clip = PerLayerQuantileClip(
        initial_layer_norms=(1.0, 1.0),
        target_quantile=0.5,
        learning_rate=0.2,
        count_noise_std=1e-6,
        denominator=3.0,
        local=local,
    )
    state = clip.init(None)
    upload = {"a": jnp.full(4, 5.0), "b": jnp.full(4, 0.05)}  # norms 10 and 0.1
    flows = [_client(clip, upload, state, key=k) for k in range(3)]
    clipped = flows[0].upload
    assert float(jnp.linalg.norm(clipped["a"])) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(clipped["b"], upload["b"])
    assert float(flows[0].bound) == pytest.approx(math.sqrt(2.0))
    np.testing.assert_allclose(flows[0].extras["layer_counts"], [-0.5, 0.5], atol=1e-5)
    _, next_norms, metrics = _server(clip, flows, state)
    np.testing.assert_allclose(next_norms, [math.exp(0.2 * 0.5), math.exp(-0.2 * 0.5)], rtol=1e-5)
    assert float(metrics["layer_clip_max"]) == 1.0


def test_local_counts_are_noised_by_each_client_and_central_ones_by_the_server():
    upload = {"a": jnp.ones(3), "b": jnp.ones(3)}
    local = PerLayerQuantileClip(
        initial_layer_norms=(10.0, 10.0), count_noise_std=2.0, denominator=2.0, local=True
    )
    central = PerLayerQuantileClip(
        initial_layer_norms=(10.0, 10.0), count_noise_std=2.0, denominator=2.0, local=False
    )
    state = local.init(None)
    draws = np.stack(
        [
            np.asarray(_client(local, upload, state, key=k).extras["layer_counts"]) - 0.5
            for k in range(400)
        ]
    )
    # N(0, sigma_b^2) added on the client
    assert 1.8 < draws.std() < 2.2 and abs(draws.mean()) < 0.25
    # padding: 0
    assert not np.any(
        np.asarray(_client(local, upload, state, present=False).extras["layer_counts"])
    )
    # raw on the client
    np.testing.assert_allclose(_client(central, upload, state).extras["layer_counts"], [0.5, 0.5])
    _, a, _ = _server(central, [_client(central, upload, state)] * 2, state, key=1)
    _, b, _ = _server(central, [_client(central, upload, state)] * 2, state, key=2)
    assert not np.allclose(a, b)  # the server's count noise follows its key
    (release,) = local.releases({})
    assert release.locality == "local" and release.noise_multiplier == pytest.approx(
        2.0 / (0.5 * math.sqrt(2))
    )
    # L / sigma_b^2 per participation
    assert local.count_mu_squared() == pytest.approx(2 / 2.0**2)
    assert central.releases({})[0].locality == "central"


def test_the_uploads_noise_is_calibrated_to_what_the_counts_leave():
    mus, k, reserved = np.array([1.0, 2.0]), 4, 0.05
    z = constant_multipliers(mus, k, reserved)
    # exactly mu^2 in all
    np.testing.assert_allclose(k * ((2 / z) ** 2 + reserved), mus**2, rtol=1e-8)
    with pytest.raises(ValueError, match="spend the whole budget"):
        upload_mus(mus, k, reserved=0.25)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(initial_layer_norms=()), "initial_layer_norms must all be > 0"),
        (dict(count_noise_std=0.0), "count_noise_std must be > 0, got 0.0"),
        (dict(target_quantile=1.0), "target_quantile must lie in \\(0, 1\\), got 1.0"),
    ],
)
def test_bad_per_layer_adaptive_clip_settings_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        PerLayerQuantileClip(**{"initial_layer_norms": (1.0,), **bad})


def test_cuag_sound_mode_with_adaptive_per_layer_clips_spends_exactly_its_budget(tmp_path):
    """Each participation releases the clipped, noised upload and the noised per-layer counts; the
    upload's z is calibrated to what the counts leave, so K participations spend mu in all, by the
    ledger."""
    c = _pfl_config(
        "cuag_pfl",
        **{
            "cuag.mode": "sound",
            "cuag.mu": 2.0,
            "cuag.participations": 2,
            "cuag.adaptive_clip": True,
            "cuag.count_noise_std": 5.0,
            "cuag.clip_norm": 0.1,
            "compression.enabled": True,
        },
    )
    c.rounds, c.sampling.cohort_size = 4, 3
    run_experiment(c, str(tmp_path / "run"), progress=False)
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert privacy["formal"] is True
    mechanisms = " ".join(r["mechanism"] for r in privacy["releases"])
    assert "per-layer adaptive-clip counts" in mechanisms
    eps = np.array(privacy["accounting"]["per_client_epsilon"])
    k = np.array(privacy["accounting"]["per_client_participations"])
    assert k.max() <= 2 and np.any(k == 2)
    for n in np.flatnonzero(k):  # k_n participations of the calibrated pair spend mu sqrt(k_n / K)
        assert gdp.mu_from_epsilon(eps[n], 1e-5) == pytest.approx(2.0 * np.sqrt(k[n] / 2), rel=1e-6)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")][1:]
    assert rows[0]["layer_clip_max"] == pytest.approx(0.1) and rows[-1][
        "layer_clip_max"
    ] != pytest.approx(0.1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"cuag.mode": "paper"},
            "cuag.adaptive_clip=True adapts the sound mode's C_l; got cuag.mode='paper'",
        ),
        ({"cuag.mode": "sound", "cuag.count_noise_std": 0.0}, "needs cuag.count_noise_std > 0"),
    ],
)
def test_adaptive_clip_input_the_mode_cannot_use_is_refused(overrides, message):
    from fedjax_dp.training.config_validation import validate_config

    c = _pfl_config(
        "cuag_pfl",
        **{
            "compression.enabled": True,
            "cuag.adaptive_clip": True,
            "cuag.count_noise_std": 1.0,
            **overrides,
        },
    )
    with pytest.raises(ValueError, match=message):
        validate_config(c)


def test_a_count_noise_that_alone_spends_the_budget_is_refused_with_the_least_that_works(tmp_path):
    c = _pfl_config(
        "cuag_pfl",
        **{
            "cuag.mode": "sound",
            "cuag.mu": 0.25,
            "cuag.participations": 2,
            "cuag.adaptive_clip": True,
            "cuag.count_noise_std": 1.0,
            "compression.enabled": True,
        },
    )
    with pytest.raises(
        ValueError, match=r"cuag.count_noise_std=1.0: .* it must exceed sqrt\(K L\) / mu = 8 "
    ):
        run_experiment(c, str(tmp_path / "never"), progress=False)


@pytest.mark.parametrize("noise_mode", ["central", "local"])
def test_dp_fedavg_with_per_layer_adaptive_clips_adapts_every_layer_and_accounts_the_counts(
    tmp_path, noise_mode
):
    """dp.clip='per_layer_adaptive': thresholds start at S / sqrt(L) and move per layer; the counts
    are a release (central: the server's noise; local: each client's) composed with the raised
    update noise, so the round's z_eff is still dp.noise_multiplier."""
    from fedjax_dp.training.default_config import default_config

    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.data.num_clients = "dp_fedavg", 3, 3, 20
    c.client.update(epochs=1, batch_size=50)
    c.sampling.cohort_size = 5
    c.dp.update(
        clip="per_layer_adaptive", clip_norm=0.5, noise_multiplier=1.0, noise_mode=noise_mode
    )
    run_experiment(c, str(tmp_path / "run"), progress=False)
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert privacy["formal"] is True
    counts = [r for r in privacy["releases"] if "per-layer adaptive-clip counts" in r["mechanism"]]
    assert len(counts) == 1 and counts[0]["locality"] == noise_mode
    # z_count = 2 sigma_b
    assert counts[0]["noise_multiplier"] == pytest.approx(2 * max(5 / 20, 1.0))
    update = [r for r in privacy["releases"] if r["mechanism"].startswith("Gaussian noise")][0]
    z_eff = (update["noise_multiplier"] ** -2 + counts[0]["noise_multiplier"] ** -2) ** -0.5
    assert z_eff == pytest.approx(1.0, rel=1e-6)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")][1:]
    assert rows[0]["layer_clip_max"] == rows[0]["layer_clip_min"]  # S / sqrt(L) each: joint bound S
    assert rows[0]["clip_norm"] == pytest.approx(0.5, rel=1e-6)
    assert rows[-1]["layer_clip_min"] != rows[-1]["layer_clip_max"]  # each layer on its own course
