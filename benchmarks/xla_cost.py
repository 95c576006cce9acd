"""What the benchmarks share: the cost of one jitted program measured by XLA, and the JSON
output."""

from __future__ import annotations

import os
import platform
import statistics
import time

import jax
from fedjax_dp.training.results import dumps as strict_json


def compiled_cost(fn, *args, repeats: int = 3) -> dict:
    """Median seconds of ``repeats`` calls after compilation, and XLA's memory analysis of the
    compiled program (exact buffer sizes, unlike sampled RSS)."""
    compiled = jax.jit(fn).lower(*args).compile()
    memory = compiled.memory_analysis()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    total = memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
    return {
        "seconds": statistics.median(times),
        "temp_bytes": int(memory.temp_size_in_bytes),
        "memory_bytes": int(total),
    }


def write_result(path: str, result: dict) -> None:
    """Writes ``result`` with the machine it was measured on."""
    machine = {
        "backend": jax.default_backend(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "jax": jax.__version__,
    }
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(strict_json({"machine": machine, **result}, indent=2))
    print("wrote", path)
