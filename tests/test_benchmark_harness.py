"""The benchmarks' own harness runs every formulation it offers (the numbers themselves are measured by
the benchmarks, never asserted here)."""

import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.mark.parametrize("strategy", ["loop", "sequential"])
def test_program_memory_covers_every_strategy(strategy):
    """Bug: ``WorkloadW.program_memory`` traced the cohort engine inside jit, which the ``loop`` strategy
    (a Python loop over per-client programs) cannot be, so every ``loop`` case of
    ``cohort_throughput.py`` failed, the regression pair ``cnn:10:loop:-:full:im2col`` /
    ``...:xla`` among them. For ``loop`` it analyses the one-client program the loop calls."""
    sys.path.insert(0, BENCHMARKS)
    try:
        from workload_w import WorkloadW
    finally:
        sys.path.remove(BENCHMARKS)
    work = WorkloadW("mlp", strategy, None, 1, "xla")
    memory = work.program_memory(2)
    assert set(memory) == {"argument", "output", "temp", "alias"}
    assert memory["argument"] > 0 and all(isinstance(v, int) for v in memory.values())
