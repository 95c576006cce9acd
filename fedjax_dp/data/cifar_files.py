"""Real CIFAR-10 and CIFAR-100 from ``{x,y}_{train,test}.npy.xz`` files (numpy ``.npy`` inside xz)
in a data directory, e.g. ``../shared/data/cifar10``: x uint8 NHWC (N, 32, 32, 3), y uint8 in [0,
10) (or [0, 100): CIFAR-100 fine labels).

CIFAR-100 in ``../shared/data/cifar100`` is NOT the canonical train/test split: a fixed 500 / 100
per class split rebuilt from public per-client partitions (its README gives the rule); test
accuracies on it are not directly comparable with published CIFAR-100 numbers. ``tfds:cifar100`` is
the canonical one.

Decompressing the 100 MB training file takes seconds, so the decoded uint8 arrays are kept in the
on-disk array cache (``array_cache``) and in memory; the float conversion happens per call.
The files are ordered by class within a split: partitioners shuffle, so nothing here does.
"""

from __future__ import annotations

import functools
import lzma

import numpy as np

from fedjax_dp.data.array_cache import cached_arrays
from fedjax_dp.data.file_integrity import read_checked
from fedjax_dp.data.local_files import find_file

SPLITS = ("train", "test")


def _read_npy(path: str) -> np.ndarray:
    """One ``.npy`` file, or one inside xz (``.npy.xz``)."""
    if not path.endswith(".xz"):
        return np.load(path, allow_pickle=False)
    with lzma.open(path) as f:
        return np.load(f, allow_pickle=False)


NUM_CLASSES = {"cifar10": 10, "cifar100": 100}


@functools.lru_cache(maxsize=2)
def load_cifar_uint8(
    data_dir: str, cache_dir: str | None = None, name: str = "cifar10"
) -> dict[str, np.ndarray]:
    """Returns ``{x_train, y_train, x_test, y_test}`` as stored (uint8)."""
    label = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}[name]
    paths = {
        f"{a}_{s}": find_file(data_dir, (f"{a}_{s}.npy.xz", f"{a}_{s}.npy"), label)
        for s in SPLITS
        for a in ("x", "y")
    }

    def build():
        out = {}
        for key, path in paths.items():
            out[key] = read_checked(path, label, _read_npy)
        for s in SPLITS:
            x, y = out[f"x_{s}"], out[f"y_{s}"]
            if x.ndim != 4 or x.shape[1:] != (32, 32, 3) or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"{label} {s}: expected x (N, 32, 32, 3) and y (N,), got {x.shape} and"
                    f" {y.shape}"
                )
            if y.size and int(y.max()) >= NUM_CLASSES[name]:
                raise ValueError(
                    f"{label} {s}: labels must lie in [0, {NUM_CLASSES[name]}), found"
                    f" {int(y.max())}"
                )
        return out

    return cached_arrays(name, list(paths.values()), build, cache_dir)


def load_cifar10(data_dir: str, cache_dir: str | None = None, name: str = "cifar10"):
    """Returns ``(x_train, y_train, x_test, y_test)``: float32 NHWC in [0, 1], int32 labels
    (``name="cifar100"``: CIFAR-100, see the module docstring on its split)."""
    raw = load_cifar_uint8(data_dir, cache_dir, name)
    return tuple(
        raw[f"{a}_{s}"].astype(np.float32) / 255.0 if a == "x" else raw[f"{a}_{s}"].astype(np.int32)
        for s in SPLITS
        for a in ("x", "y")
    )
