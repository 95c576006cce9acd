"""Shared test fixtures: tiny models and data, and the location of the optional shared data."""

import os

import jax
import numpy as np
import pytest

jax.config.update("jax_default_matmul_precision", "highest")

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.fixture
def shared_data_dir():
    if not os.path.isdir(SHARED_DATA):
        pytest.skip("../shared/data is absent on this machine")
    return SHARED_DATA


def random_client_data(rng: np.random.Generator, sizes, shape=(4, 4, 1), num_classes=3):
    """Per-client (x, y) arrays with the given example counts."""
    return [(rng.standard_normal((n,) + shape).astype(np.float32), rng.integers(0, num_classes, n).astype(np.int32))
            for n in sizes]
