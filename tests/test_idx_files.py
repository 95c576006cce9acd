"""MNIST IDX loading: fixture files written here, clear errors, and the real files when present."""

import gzip
import os
import struct

import numpy as np
import pytest

from fedjax_dp.data.idx_files import MNIST_FILES, load_mnist, read_idx


def write_idx(path, array):
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(
        ">" + "I" * array.ndim, *array.shape
    )
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def make_mnist_dir(tmp_path, n_train=12, n_test=5, gz=True):
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images, labels = rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n)
        for name, arr in zip(MNIST_FILES[split], (images, labels)):
            write_idx(str(tmp_path / (name if gz else name[:-3])), arr)
        arrays[split] = (images, labels)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_round_trip_of_fixture_files(tmp_path, gz):
    arrays = make_mnist_dir(tmp_path, gz=gz)
    load_mnist.cache_clear()
    x, y, xt, yt = load_mnist(str(tmp_path))
    assert x.shape == (12, 28, 28, 1) and xt.shape == (5, 28, 28, 1)
    np.testing.assert_allclose(x[..., 0] * 255, arrays["train"][0], atol=1e-4)
    np.testing.assert_array_equal(yt, arrays["test"][1])


def test_missing_file_says_which_and_where(tmp_path):
    load_mnist.cache_clear()
    with pytest.raises(
        FileNotFoundError, match="train-images-idx3-ubyte.gz not found in .*data.data_dir"
    ):
        load_mnist(str(tmp_path))


def test_corrupt_file_is_rejected(tmp_path):
    path = str(tmp_path / "bad.gz")
    write_idx(path, np.zeros((3, 2)))
    with gzip.open(path, "rb") as f:
        data = f.read()
    with gzip.open(path, "wb") as f:
        f.write(data[:-1])
    with pytest.raises(ValueError, match=r"header says \(3, 2\) = 6 values but it holds 5"):
        read_idx(path)


def test_real_mnist_sizes(shared_data_dir):
    x, y, xt, yt = load_mnist(os.path.join(shared_data_dir, "mnist"))
    assert x.shape == (60000, 28, 28, 1) and xt.shape == (10000, 28, 28, 1)
    assert np.bincount(y).min() > 5000 and 0.12 < x.mean() < 0.14
