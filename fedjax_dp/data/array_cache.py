"""On-disk cache of decoded arrays, so that a second load of a slow source (xz-compressed CIFAR-10,
thousands of HDF5 snippets, a TFDS split read record by record) is a single ``np.load``.

The cache key covers the source files' absolute paths, sizes and modification times plus the
loader's own parameters: a changed source file is decoded again, never served stale. The cache
directory is ``$FEDJAX_DP_CACHE`` or ``~/.cache/fedjax_dp``; pass ``cache_dir=""`` to disable.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Callable

import numpy as np


def default_cache_dir() -> str:
    return os.environ.get(
        "FEDJAX_DP_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "fedjax_dp")
    )


def cache_key(name: str, source_paths: list[str], params: dict | None = None) -> str:
    stats = []
    for path in sorted(source_paths):
        st = os.stat(path)
        stats.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
    blob = json.dumps([name, stats, params or {}], sort_keys=True, default=str).encode()
    return f"{name}-{hashlib.sha256(blob).hexdigest()[:16]}"


def cached_arrays(
    name: str,
    source_paths: list[str],
    build: Callable[[], dict[str, np.ndarray]],
    cache_dir: str | None = None,
    params: dict | None = None,
) -> dict[str, np.ndarray]:
    """Returns ``build()``'s dict of arrays, from ``cache_dir`` when an entry for the same sources
    exists. Writes are atomic (temporary file, then rename), so an interrupted run never leaves a
    truncated entry behind."""
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    if not cache_dir:
        return build()
    path = os.path.join(cache_dir, cache_key(name, source_paths, params) + ".npz")
    if os.path.exists(path):
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    arrays = build()
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return arrays
