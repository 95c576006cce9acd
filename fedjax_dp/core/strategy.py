"""``auto``: the cohort strategy, scan unroll and conv implementation measured fastest per backend.

Measurements (``benchmarks/cohort_throughput.py``, results in ``benchmarks/RESULTS.md``) drive these
rules; they are a lookup of what was measured, not a guess.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    strategy: str
    chunk_size: int | None
    unroll: int | bool
    conv_impl: str


def choose_strategy(has_conv: bool, cohort_size: int, backend: str | None = None) -> StrategyChoice:
    """The fastest measured formulation for this backend and model family."""
    backend = backend or jax.default_backend()
    if backend == "cpu":
        if has_conv:
            return StrategyChoice("loop", None, True, "xla")
        return StrategyChoice("chunked", min(cohort_size, 100), True, "xla")
    # Accelerators: one vmapped program over bounded chunks keeps the device busy and memory bounded.
    return StrategyChoice("chunked", min(cohort_size, 256), 1, "xla")
