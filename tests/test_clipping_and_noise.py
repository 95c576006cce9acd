"""Clipping post-conditions (property tests), noise statistics, and RNG key discipline."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from fedjax_dp.core import rng, tree
from fedjax_dp.privacy.mechanisms import clipping
from fedjax_dp.privacy.mechanisms.gaussian import gaussian_noise_like


def random_tree(seed, scale):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "w": scale * jax.random.normal(k1, (7, 5)),
        "b": {"x": scale * jax.random.normal(k2, (3,))},
    }


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), scale=st.floats(1e-4, 1e3), clip=st.floats(1e-3, 1e2))
def test_flat_clip_postconditions(seed, scale, clip):
    update = random_tree(seed, scale)
    result = clipping.clip_by_global_norm(update, clip)
    norm = float(tree.l2_norm(update))
    assert float(result.norm) == pytest.approx(norm, rel=1e-5)
    assert float(tree.l2_norm(result.clipped)) <= clip * (1 + 1e-5)
    if norm <= clip:
        for a, b in zip(
            jax.tree_util.tree_leaves(result.clipped), jax.tree_util.tree_leaves(update)
        ):
            np.testing.assert_array_equal(a, b)
    else:  # same direction, norm exactly S
        assert float(tree.l2_norm(result.clipped)) == pytest.approx(clip, rel=1e-5)
        cos = float(optax_vdot(result.clipped, update)) / (clip * norm)
        assert cos == pytest.approx(1.0, abs=1e-5)
    assert bool(result.was_clipped) == (norm > clip)


def optax_vdot(a, b):
    return sum(
        jnp.vdot(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), scale=st.floats(1e-3, 1e2))
def test_per_layer_clip_bounds_each_layer_and_joint_sensitivity(seed, scale):
    update = random_tree(seed, scale)
    norms = {"w": 0.5, "b": {"x": 0.2}}
    result = clipping.clip_per_layer(update, norms)
    for leaf, c in zip(jax.tree_util.tree_leaves(result.clipped), jax.tree_util.tree_leaves(norms)):
        assert float(jnp.linalg.norm(leaf)) <= c * (1 + 1e-5)
    assert float(tree.l2_norm(result.clipped)) <= clipping.per_layer_sensitivity(norms) * (1 + 1e-5)
    assert clipping.per_layer_sensitivity(norms) == pytest.approx(math.sqrt(0.29))


def test_clip_is_vmappable_and_jittable():
    updates = jax.vmap(lambda k: {"a": jax.random.normal(k, (10,))})(
        jax.random.split(jax.random.key(0), 6)
    )
    clipped = jax.jit(jax.vmap(lambda u: clipping.clip_by_global_norm(u, 1.0)))(updates)
    assert clipped.clipped["a"].shape == (6, 10)
    assert np.all(np.linalg.norm(clipped.clipped["a"], axis=1) <= 1 + 1e-6)


def test_clip_rejects_nonpositive_threshold():
    with pytest.raises(ValueError, match="clip norm S must be > 0, got 0"):
        clipping.clip_by_global_norm({"a": jnp.ones(3)}, 0)
    with pytest.raises(ValueError, match="must exceed z/2"):
        clipping.adaptive_update_noise_multiplier(2.0, 0.5)


def test_gaussian_noise_statistics():
    std, n = 0.7, 200_000
    noise = gaussian_noise_like(
        {"a": jnp.zeros((n // 2,)), "b": jnp.zeros((n // 4, 2))}, std, jax.random.key(42)
    )
    x = np.concatenate([np.ravel(l) for l in jax.tree_util.tree_leaves(noise)])
    # mean: sd of the sample mean is std / sqrt(n); allow 5 sd
    assert abs(x.mean()) < 5 * std / math.sqrt(n)
    # variance: sd of the sample variance is std^2 sqrt(2 / (n - 1)); allow 5 sd
    assert abs(x.var(ddof=1) - std**2) < 5 * std**2 * math.sqrt(2 / (n - 1))
    assert stats.kstest(x / std, "norm").pvalue > 1e-3
    # the two leaves are independent draws, not copies
    assert abs(np.corrcoef(np.ravel(noise["a"])[:1000], np.ravel(noise["b"])[:1000])[0, 1]) < 0.2


def test_noise_keys_are_never_reused():
    root = jax.random.key(0)
    seen = set()
    for t in range(1, 6):
        k = rng.round_key(root, t)
        for purpose in rng.Purpose:
            pk = rng.purpose_key(k, purpose)
            for ck in list(rng.client_keys(pk, 8)) + [pk]:
                data = tuple(np.asarray(jax.random.key_data(ck)).ravel().tolist())
                assert data not in seen
                seen.add(data)
    assert len(seen) == 5 * len(rng.Purpose) * 9


def test_local_noise_with_per_client_multipliers_uses_each_clients_own_z():
    """Heterogeneous DP (seed 004): client n adds N(0, (z_n S)^2); the release lists every z_n."""
    from fedjax_dp.core.uploads import ClientContext
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise

    noise = GaussianNoise(local=True, client_multipliers=(0.5, 3.0))
    upload = {"w": jnp.zeros(20000)}
    stds = []
    for client_id in (0, 1):
        ctx = ClientContext(
            (),
            noise.inputs(1),
            jnp.float32(2.0),
            jax.random.key(client_id),
            True,
            True,
            jnp.int32(client_id),
        )
        stds.append(float(jnp.std(noise.client(upload, ctx).upload["w"])))
    np.testing.assert_allclose(stds, [1.0, 6.0], rtol=0.03)
    assert noise.releases(noise.inputs(1))[0].client_multipliers == (0.5, 3.0)
    with pytest.raises(ValueError, match="need local noise"):
        GaussianNoise(client_multipliers=(1.0,))


@pytest.mark.parametrize(
    "shape,dtype", [((3,), jnp.float32), ((5, 5, 1, 32), jnp.float32), ((7, 3), jnp.float64)]
)
def test_the_flat_noise_draw_is_the_draw_of_the_shape_value_for_value(shape, dtype):
    """``standard_normal`` draws flat and reshapes (faster to compile): the values are those of
    drawing the shape directly, so no seeded run changes."""
    from fedjax_dp.privacy.mechanisms.gaussian import NOISE_DRAWS, standard_normal

    with jax.enable_x64(dtype == jnp.float64):
        key = jax.random.key(7)
        direct = jnp.sum(jax.random.normal(key, (NOISE_DRAWS,) + shape, dtype), axis=0) / jnp.sqrt(
            jnp.asarray(NOISE_DRAWS, dtype)
        )
        np.testing.assert_array_equal(standard_normal(key, shape, dtype), direct)
