"""A damaged data file is one line naming the file and its dataset, and a data folder's SHA256SUMS
is checked before its files are decoded (``data.file_integrity``)."""

from __future__ import annotations

import hashlib
import os

import pytest
from fixture_files import make_cifar_dir
from test_idx_files import make_mnist_dir

from fedjax_dp.data.cifar_files import load_cifar10
from fedjax_dp.data.file_integrity import DataFileError
from fedjax_dp.data.idx_files import MNIST_FILES, load_mnist


def _damage(path, at: int = 40) -> None:
    """Overwrites 16 bytes in the middle of a compressed stream."""
    data = bytearray(open(path, "rb").read())
    data[at : at + 16] = bytes(b ^ 0xFF for b in data[at : at + 16])
    open(path, "wb").write(bytes(data))


def test_a_damaged_gzip_file_is_one_line_naming_it_and_the_dataset(tmp_path):
    """It was 'error: CRC check failed ...' (or a zlib error) without the file's name."""
    make_mnist_dir(tmp_path, n_train=200)
    damaged = tmp_path / MNIST_FILES["train"][0]
    _damage(damaged, at=len(open(damaged, "rb").read()) // 2)
    load_mnist.cache_clear()
    with pytest.raises(DataFileError) as error:
        load_mnist(str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"MNIST: cannot read {damaged}: ")


def test_a_damaged_xz_file_is_one_line_naming_it_and_the_dataset(tmp_path):
    """It was a 41-line traceback ending in lzma's 'Corrupt input data'."""
    make_cifar_dir(tmp_path)
    damaged = tmp_path / "x_train.npy.xz"
    _damage(damaged, at=len(open(damaged, "rb").read()) // 2)
    with pytest.raises(DataFileError) as error:
        load_cifar10(str(tmp_path), "")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"CIFAR-10: cannot read {damaged}: LZMAError")


def test_a_data_folders_sha256sums_is_checked_before_its_files_are_read(tmp_path):
    """As ../shared/data ships one: <root>/SHA256SUMS lists <root>/mnist/<file>."""
    folder = tmp_path / "mnist"
    folder.mkdir()
    make_mnist_dir(folder)
    names = MNIST_FILES["train"] + MNIST_FILES["test"]
    sums = {n: hashlib.sha256(open(folder / n, "rb").read()).hexdigest() for n in names}
    (tmp_path / "SHA256SUMS").write_text("".join(f"{h}  mnist/{n}\n" for n, h in sums.items()))
    load_mnist.cache_clear()
    assert load_mnist(str(folder))[0].shape == (12, 28, 28, 1)
    # replaced by another valid file: it decodes, but it is not the file the folder lists
    os.replace(folder / MNIST_FILES["test"][1], folder / MNIST_FILES["train"][1])
    load_mnist.cache_clear()
    with pytest.raises(DataFileError) as error:
        load_mnist(str(folder))
    assert str(error.value).startswith(
        f"MNIST: {folder / MNIST_FILES['train'][1]} does not match its sha256 in"
        f" {tmp_path / 'SHA256SUMS'} (expected {sums[MNIST_FILES['train'][1]][:16]}..."
    )
