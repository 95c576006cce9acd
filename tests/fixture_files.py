"""Small data files in the real formats (CIFAR-10 .npy.xz, FEMNIST .npz, TFF Shakespeare HDF5),
written by tests so that the loaders are exercised without the real data."""

import lzma

import h5py
import numpy as np


def write_npy_xz(path, array):
    with lzma.open(path, "wb") as f:
        np.save(f, array)


def make_cifar_dir(tmp_path, n_train=20, n_test=10):
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        write_npy_xz(
            tmp_path / f"x_{split}.npy.xz", rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8)
        )
        write_npy_xz(tmp_path / f"y_{split}.npy.xz", (np.arange(n) % 10).astype(np.uint8))


def make_femnist_file(
    tmp_path, writers_train=("w0", "w1", "w2"), writers_test=("w0", "w1", "w9"), per=4
):
    rng = np.random.default_rng(1)
    arrays = {}
    for split, writers in (("train", writers_train), ("test", writers_test)):
        n = per * len(writers)
        arrays[f"x_{split}"] = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        arrays[f"y_{split}"] = rng.integers(0, 62, n).astype(np.int16)
        arrays[f"writer_{split}"] = np.repeat(np.array(writers), per)
    np.savez(tmp_path / "femnist_leaf_sf005_uint8.npz", **arrays)
    return arrays


def make_tff_emnist_dir(
    tmp_path,
    writers_train=("f0000_14", "f0001_41"),
    writers_test=("f0000_14", "f0001_41"),
    per=3,
    prefix="fed_emnist",
):
    """TensorFlow Federated's federated-EMNIST layout: ``examples/<writer>/{pixels, label}`` per
    split."""
    rng = np.random.default_rng(2)
    arrays = {}
    for split, writers in (("train", writers_train), ("test", writers_test)):
        with h5py.File(tmp_path / f"{prefix}_{split}.h5", "w") as f:
            for writer in writers:
                pixels = rng.random((per, 28, 28)).astype(np.float32)
                labels = rng.integers(0, 62, per).astype(np.int32)
                f.create_dataset(f"examples/{writer}/pixels", data=pixels)
                f.create_dataset(f"examples/{writer}/label", data=labels)
                arrays[(split, writer)] = (pixels, labels)
    return arrays


def make_shakespeare_dir(tmp_path, train, test):
    for split, roles in (("train", train), ("test", test)):
        with h5py.File(tmp_path / f"shakespeare_{split}.h5", "w") as f:
            for role, snippets in roles.items():
                f.create_dataset(
                    f"examples/{role}/snippets",
                    data=np.array(snippets, dtype=object),
                    dtype=h5py.string_dtype(),
                )
