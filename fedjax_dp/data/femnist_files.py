"""FEMNIST (LEAF) by writer, from either of two files in ``data.data_dir``:

* ``femnist_leaf_sf005_uint8.npz``: ``x_{train,test}`` (N, 28, 28) uint8, ``y_{train,test}`` in [0,
  62) (0-9 digits, 10-35 upper case, 36-61 lower case) and ``writer_{train,test}`` (the writer id of
  every example);
* TensorFlow Federated's federated EMNIST, ``fed_emnist_{train,test}.h5`` (3,400 writers, 62
  classes: the DP-FTRL and MF papers' EMNIST) or ``fed_emnist_digitsonly_{train,test}.h5`` (3,383
  writers, digits): HDF5 groups ``examples/<writer>/pixels`` (n, 28, 28) float in [0, 1] and
  ``examples/<writer>/label`` (TFF's ``emnist.load_data``, derived from LEAF). Needs h5py (``pip
  install "fedjax_dp[shakespeare]"``).

The npz is read when both are present. Pixels are read as stored: the npz has LEAF's convention (ink
is dark, the background is 1.0), and TFF's files come from LEAF's preprocessing (their background is
not checked here: this machine has no copy). ``invert=True`` flips them (1 - x), giving the MNIST
convention for LEAF's.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from fedjax_dp.data.file_integrity import read_checked
from fedjax_dp.data.local_files import find_file, open_hdf5
from fedjax_dp.data.natural_clients import GroupedSplit

FILE_NAMES = ("femnist_leaf_sf005_uint8.npz", "femnist.npz")
TFF_PREFIXES = ("fed_emnist", "fed_emnist_digitsonly")  # <prefix>_train.h5 and <prefix>_test.h5
NUM_CLASSES = 62


@functools.lru_cache(maxsize=2)
def load_femnist(data_dir: str, invert: bool = False) -> tuple[GroupedSplit, GroupedSplit]:
    """Returns the ``(train, test)`` splits, examples grouped by writer id."""
    path = find_file(data_dir, FILE_NAMES + tuple(f"{p}_train.h5" for p in TFF_PREFIXES), "FEMNIST")
    if path.endswith(".h5"):
        test_path = path[: -len("_train.h5")] + "_test.h5"
        splits = [
            read_checked(path, "FEMNIST", _read_tff_split),
            read_checked(
                find_file(data_dir, (os.path.basename(test_path),), "FEMNIST"),
                "FEMNIST",
                _read_tff_split,
            ),
        ]
    else:
        splits = read_checked(path, "FEMNIST", _read_npz)
    splits = [GroupedSplit(1.0 - s.x if invert else s.x, s.y, s.client) for s in splits]
    for s, split in zip(("train", "test"), splits):
        if len(split.y) and not 0 <= split.y.min() <= split.y.max() < NUM_CLASSES:
            raise ValueError(
                f"FEMNIST {s} labels outside [0, {NUM_CLASSES}): [{split.y.min()}, {split.y.max()}]"
            )
    return splits[0], splits[1]


def _read_npz(path: str) -> list[GroupedSplit]:
    with np.load(path, allow_pickle=False) as f:
        missing = {f"{a}_{s}" for a in ("x", "y", "writer") for s in ("train", "test")} - set(
            f.files
        )
        if missing:
            raise ValueError(f"{path} lacks arrays {sorted(missing)}")
        return [
            GroupedSplit(
                f[f"x_{s}"].astype(np.float32)[..., None] / 255.0,
                f[f"y_{s}"].astype(np.int32),
                f[f"writer_{s}"].astype(str),
            )
            for s in ("train", "test")
        ]


def _read_tff_split(path: str) -> GroupedSplit:
    """One TFF federated-EMNIST HDF5 file: every writer's pixels and labels, in the file's writer
    order."""
    xs, ys, writers = [], [], []
    with open_hdf5(path, "data.source=femnist") as f:
        if "examples" not in f:
            raise ValueError(
                f"{path} is not a TFF federated-EMNIST file: it has no 'examples' group"
            )
        for writer, group in f["examples"].items():
            if "pixels" not in group or "label" not in group:
                raise ValueError(f"{path}: writer {writer!r} lacks 'pixels' or 'label'")
            xs.append(np.asarray(group["pixels"], np.float32).reshape(-1, 28, 28, 1))
            ys.append(np.asarray(group["label"], np.int32).reshape(-1))
            writers += [writer] * len(ys[-1])
            if len(xs[-1]) != len(ys[-1]):
                raise ValueError(
                    f"{path}: writer {writer!r} has {len(xs[-1])} images and {len(ys[-1])} labels"
                )
    if not xs:
        raise ValueError(f"{path} holds no writers")
    return GroupedSplit(np.concatenate(xs), np.concatenate(ys), np.array(writers))
