"""FEMNIST (LEAF) by writer from ``femnist_leaf_sf005_uint8.npz``: ``x_{train,test}`` (N, 28, 28)
uint8, ``y_{train,test}`` in [0, 62) (0-9 digits, 10-35 upper case, 36-61 lower case) and
``writer_{train,test}`` (the writer id of every example).

Pixels follow LEAF's convention (ink is dark, the background is 1.0); ``invert=True`` gives the
MNIST convention (background 0.0).
"""

from __future__ import annotations

import functools

import numpy as np

from fedjax_dp.data.local_files import find_file
from fedjax_dp.data.natural_clients import GroupedSplit

FILE_NAMES = ("femnist_leaf_sf005_uint8.npz", "femnist.npz")
NUM_CLASSES = 62


@functools.lru_cache(maxsize=2)
def load_femnist(data_dir: str, invert: bool = False) -> tuple[GroupedSplit, GroupedSplit]:
    """Returns the ``(train, test)`` splits, examples grouped by writer id."""
    path = find_file(data_dir, FILE_NAMES, "FEMNIST")
    with np.load(path, allow_pickle=False) as f:
        missing = {f"{a}_{s}" for a in ("x", "y", "writer") for s in ("train", "test")} - set(f.files)
        if missing:
            raise ValueError(f"{path} lacks arrays {sorted(missing)}")
        splits = []
        for s in ("train", "test"):
            x = f[f"x_{s}"].astype(np.float32)[..., None] / 255.0
            splits.append(GroupedSplit(1.0 - x if invert else x, f[f"y_{s}"].astype(np.int32), f[f"writer_{s}"].astype(str)))
    for s, split in zip(("train", "test"), splits):
        if len(split.y) and not 0 <= split.y.min() <= split.y.max() < NUM_CLASSES:
            raise ValueError(f"FEMNIST {s} labels outside [0, {NUM_CLASSES}): [{split.y.min()}, {split.y.max()}]")
    return splits[0], splits[1]
