"""experiments/local_training_sensitivity.py: its two comparisons start where they should (one step
of XLA's convolution and of im2col agree to float rounding; the nudged start is 1e-7 away), so the
growth it reports comes from the training dynamics."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from conftest import load_experiment


@pytest.fixture(scope="module")
def sensitivity():
    return load_experiment("local_training_sensitivity")


def test_one_step_starts_the_comparisons_at_rounding_and_at_the_nudge(sensitivity):
    rng = np.random.default_rng(0)
    dataset = SimpleNamespace(example_shape=(32, 32, 3), num_classes=10)
    x = jax.numpy.asarray(rng.normal(size=(40, 32, 32, 3)).astype(np.float32))
    y = jax.numpy.asarray(rng.integers(0, 10, 40).astype(np.int32))
    run = lambda impl, eps=0.0: sensitivity.train(dataset, x, y, impl, 1, eps, 0, 0.1, 20)  # noqa: E731
    (im2col, loss_im2col), (xla, loss_xla), (nudged, _) = (
        run("im2col"),
        run("xla"),
        run("im2col", 1e-7),
    )
    assert sensitivity.relative_distance(im2col, xla) < 1e-6
    assert loss_im2col == pytest.approx(loss_xla, rel=1e-6)
    assert 5e-8 < sensitivity.relative_distance(im2col, nudged) < 5e-7
    assert sensitivity.relative_distance(im2col, im2col) == 0.0
