"""``auto``: the cohort strategy, scan unroll and conv implementation measured fastest per backend.

Measured on the 2-core CPU of this project (workload W of ``benchmarks/cohort_throughput.py``,
client-updates/s; full tables in ``benchmarks/RESULTS.md``):

* MLP 2NN, C = 1000: ``sequential`` 752 (unrolled steps) / 658 (scan) vs ``vmap`` 117 and
  ``chunked`` 187-219: vmapping per-client weights turns every matmul into a batched dot, which
  XLA:CPU runs far below its matmul peak, while one client at a time keeps plain GEMMs.
* FedAvg CNN, C = 100: im2col convs under ``lax.scan`` with ``sequential`` 14.9 or ``loop`` 14.0,
  vs XLA convs unrolled 8.2 (a conv inside a scan body: 1.7) and any vmap of per-client conv weights
  1.2-5.1 (grouped convolutions / batched matmuls).

On accelerators: one vmapped program over chunks of clients (bounded memory) with XLA convs.
Measured on one H100 (workload W): CNN C = 100 vmap 1758 vs ``sequential`` 892 vs ``loop`` 374;
MLP C = 1000 vmap 10628, ``chunked`` 250 10591, ``sequential`` 2889 (benchmarks/RESULTS.md).
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
            return StrategyChoice("sequential", None, 1, "im2col")
        return StrategyChoice("sequential", None, True, "xla")
    return StrategyChoice("chunked", max(1, min(cohort_size, 256)), 1, "xla")
