"""``timed``: the first call of a function (compilation included) and the median of later calls;
``best_ms``: the best mean of back-to-back calls, for operations of a few milliseconds where one
call's dispatch would dominate."""

from __future__ import annotations

import statistics
import time

import jax


def timed(fn, repeats: int) -> tuple[float, float]:
    """(first call incl. compilation, median of ``repeats`` later calls), seconds; blocks on
    results."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def best_ms(fn, *args, calls: int = 50, repeats: int = 5) -> float:
    """Best over ``repeats`` of the mean milliseconds of ``calls`` back-to-back calls (after a
    compiling one)."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / calls * 1e3)
    return best
