"""``core.unrolled_threefry``: every sample equals jax.random's on the original key, to the bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core.unrolled_threefry import UNROLLED_THREEFRY, unrolled

SAMPLERS = {
    "normal": lambda k, s: jax.random.normal(k, s),
    "uniform": lambda k, s: jax.random.uniform(k, s, minval=-2.0, maxval=3.0),
    "rademacher": lambda k, s: jax.random.rademacher(k, s, jnp.float32),
    "bits8": lambda k, s: jax.random.bits(k, s, jnp.uint8),
    "bits16": lambda k, s: jax.random.bits(k, s, jnp.uint16),
    "bits32": lambda k, s: jax.random.bits(k, s, jnp.uint32),
    "randint": lambda k, s: jax.random.randint(k, s, -5, 1000),
    "permutation": lambda k, s: jax.random.permutation(k, int(np.prod(s))),
}


SHAPES = [(1,), (7,), (3, 5, 2), (40_001,)]


def test_samples_equal_jax_randoms_to_the_bit():
    """Every sampler, at every shape, from fresh, split and folded keys (one program per key
    kind)."""

    def all_draws(key):
        return {
            (name, shape): draw(key, shape) for name, draw in SAMPLERS.items() for shape in SHAPES
        }

    want_fn, got_fn = jax.jit(all_draws), jax.jit(lambda k: all_draws(unrolled(k)))
    for key in (
        jax.random.key(0),
        jax.random.split(jax.random.key(11), 3)[2],
        jax.random.fold_in(jax.random.key(5), 9),
    ):
        want, got = want_fn(key), got_fn(key)
        for case in want:
            np.testing.assert_array_equal(got[case], want[case], err_msg=str(case))
            assert got[case].dtype == want[case].dtype


def test_vmapped_keys_and_derived_keys_stay_equal():
    """Per-client keys under vmap, and keys split / folded from an unrolled key, draw the same
    numbers."""
    keys = jax.random.split(jax.random.key(3), 4)
    draw = lambda k: jax.random.normal(jax.random.fold_in(jax.random.split(k)[1], 2), (6, 9))  # noqa: E731
    np.testing.assert_array_equal(
        jax.jit(jax.vmap(lambda k: draw(unrolled(k))))(keys), jax.jit(jax.vmap(draw))(keys)
    )


def test_the_unrolled_program_has_no_loop_and_jaxs_has_one():
    """What makes it faster on CPU: JAX's threefry lowers to a rolled while loop there, this one to
    straight-line arithmetic that XLA fuses into one pass over the counters."""

    def hlo(fn):
        return jax.jit(fn).lower(jax.random.key(0)).as_text()

    assert "while" not in hlo(lambda k: jax.random.normal(unrolled(k), (100,)))
    if jax.default_backend() == "cpu":
        assert "while" in hlo(lambda k: jax.random.normal(k, (100,)))


def test_keys_whose_bits_would_differ_are_left_alone():
    rbg = jax.random.key(0, impl="rbg")
    assert unrolled(rbg) is rbg
    raw = jax.random.PRNGKey(0)
    assert unrolled(raw) is raw
    assert jax.random.key_impl(unrolled(jax.random.key(0))) == UNROLLED_THREEFRY
    jax.config.update("jax_threefry_partitionable", False)
    try:
        key = jax.random.key(0)
        assert unrolled(key) is key
    finally:
        jax.config.update("jax_threefry_partitionable", True)


@pytest.mark.parametrize("shape", [(3,), (200, 200), (5, 5, 1, 32)])
def test_dp_noise_is_the_earlier_sum_of_draws_up_to_one_rounding_of_the_summands(shape):
    """``mechanisms.standard_normal`` draws the same normals as before (unrolled key) and adds them
    in the same order, fused: XLA:CPU may contract a draw's last multiply with the addition (an
    FMA), so an entry may differ from the earlier ``jnp.sum`` over the draws' axis by a rounding of
    the summands, never more."""
    from fedjax_dp.privacy.mechanisms.gaussian import NOISE_DRAWS, standard_normal

    def before(key):
        draws = jax.random.normal(key, (NOISE_DRAWS * int(np.prod(shape)),)).reshape(
            (NOISE_DRAWS,) + shape
        )
        return jnp.sum(draws, axis=0) / jnp.sqrt(jnp.float32(NOISE_DRAWS)), jnp.max(jnp.abs(draws))

    key = jax.random.fold_in(jax.random.key(2), 17)
    want, largest = jax.jit(before)(key)
    got = jax.jit(lambda k: standard_normal(k, shape))(key)
    # a half-ulp per addition, generously
    rounding = NOISE_DRAWS * np.finfo(np.float32).eps * float(largest)
    np.testing.assert_allclose(got, want, rtol=0, atol=rounding)
