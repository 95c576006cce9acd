"""``timed``: the first call of a function (compilation included) and the median of later calls."""

from __future__ import annotations

import statistics
import time

import jax


def timed(fn, repeats: int) -> tuple[float, float]:
    """(first call incl. compilation, median of ``repeats`` later calls), seconds; blocks on results."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)
