"""Real MNIST from IDX files (``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``) in a data
directory, e.g. ``../shared/data/mnist`` on this project's machines. Decoded arrays are cached in
memory, so a second load in one process is free."""

from __future__ import annotations

import functools
import gzip

import numpy as np

from fedjax_dp.data.file_integrity import read_checked
from fedjax_dp.data.local_files import find_file

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def read_idx(path: str) -> np.ndarray:
    """Parses one IDX file (gzip or raw): magic (0, 0, dtype 0x08, ndim), big-endian dims, data."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (magic {data[:4]!r})")
    ndim = data[3]
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(
            f"{path}: header says {dims} = {int(np.prod(dims))} values but it holds {body.size}"
        )
    return body.reshape(dims)


def _locate(data_dir: str, name: str) -> str:
    return find_file(data_dir, (name, name[:-3]), "MNIST")


@functools.lru_cache(maxsize=4)
def load_mnist(data_dir: str):
    """Returns ``(x_train, y_train, x_test, y_test)``: float32 (N, 28, 28, 1) in [0, 1], int32
    labels."""
    out = []
    for split in ("train", "test"):
        images, labels = (
            read_checked(_locate(data_dir, name), "MNIST", read_idx) for name in MNIST_FILES[split]
        )
        if images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"MNIST {split}: {images.shape[0]} images but {labels.shape[0]} labels"
            )
        out += [(images.astype(np.float32) / 255.0)[..., None], labels.astype(np.int32)]
    return tuple(out)
