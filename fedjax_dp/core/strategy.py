"""``auto``: the cohort strategy, scan unroll and convolution implementation measured fastest per
backend and model family.

The rules (``choose_strategy``), and why:

* CPU, dense model: ``sequential`` (one client at a time inside one jit) with the local steps' scan.
  Vmapping per-client weights turns every matmul into a batched dot, which XLA:CPU runs far below
  its matmul peak; one client at a time keeps plain GEMMs, and unrolled steps were no faster once
  spread over the cores.
* CPU, conv model with at most ``MAX_UNROLLED_CONV_STEPS`` local steps and no other loop over the
  model: ``loop`` over clients with every step unrolled, XLA's convolution on a device per core
  (``per_layer`` on one core). XLA's gradient convolutions are slow inside a loop on XLA:CPU
  (jax-ml/jax#12868); without a loop they are not.
* CPU, other conv models, and conv models whose steps take per-example gradients (DP-SGD): the scan
  with im2col convolutions (per-example weight gradients become batched matmuls, not grouped
  convolutions).
* Every CPU choice spreads the cohort over one CPU device per core (``core.host_devices``): two
  clients on two single-core devices beat one client threaded over both.
* GPU: one vmapped program over chunks of at most 256 clients (memory bounded by the chunk), steps
  unrolled, im2col convolutions (vmapped per-client conv weights become slow grouped convolutions).
  TPU: the GPU rule with XLA convolutions, not measured.

The measurements behind each rule are in the documentation ("The cohort engine") and
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import dataclasses

import jax

from fedjax_dp.core.host_devices import cpu_devices


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    strategy: str
    chunk_size: int | None
    unroll: int | bool
    conv_impl: str
    # how many devices the cohort spreads over: loop, round-robin; traced strategies, a mesh
    devices: int = 1


MAX_UNROLLED_CONV_STEPS = 32


def choose_strategy(
    has_conv: bool,
    cohort_size: int,
    backend: str | None = None,
    loop_free_steps: int | None = None,
    per_example: bool = False,
) -> StrategyChoice:
    """The fastest measured formulation for this backend and model family. ``loop_free_steps``: the
    number of local steps when the client program has no other loop over the model (None: unknown,
    or it has one); ``per_example``: the local steps take per-example gradients (DP-SGD)."""
    backend = backend or jax.default_backend()
    if backend == "cpu":
        # one device per core (core.host_devices): the cohort spreads over them
        cores = len(cpu_devices())
        if has_conv and per_example:
            return StrategyChoice("sequential", None, 1, "im2col", devices=cores)
        if has_conv and loop_free_steps is not None and loop_free_steps <= MAX_UNROLLED_CONV_STEPS:
            return StrategyChoice(
                "loop", None, True, "xla" if cores > 1 else "per_layer", devices=cores
            )
        if has_conv:
            return StrategyChoice("sequential", None, 1, "im2col", devices=cores)
        return StrategyChoice("sequential", None, 1, "xla", devices=cores)
    chunk = max(1, min(cohort_size, 256))
    if backend == "gpu":
        return StrategyChoice("chunked", chunk, True, "im2col")
    return StrategyChoice("chunked", chunk, 1, "xla")
