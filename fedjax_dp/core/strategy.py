"""``auto``: the cohort strategy, scan unroll and conv implementation measured fastest per backend.

Measured on the 2-core CPU of this project (workload W of ``benchmarks/cohort_throughput.py``,
client-updates/s; full tables in ``benchmarks/RESULTS.md``):

* MLP 2NN, C = 1000: ``sequential`` 752 (unrolled steps) / 658 (scan) vs ``vmap`` 117 and
  ``chunked`` 187-219: vmapping per-client weights turns every matmul into a batched dot, which
  XLA:CPU runs far below its matmul peak, while one client at a time keeps plain GEMMs. Spread over a
  device per core (below), the local steps' scan is no slower than unrolled steps and compiles in a
  fraction of the time (2026-12-01, one run, each case its own process: workload W's MLP at C = 100 666 /
  664 updates/s scan / unrolled, at C = 1000 708 and 685 against 626 and 647; ``fedavg_mnist``'s round
  program compiles in 2.0 s against 5.9 s, its 100 rounds in 16.3 s against 20.5 s), so dense models
  keep the scan (``unroll`` 1).
* FedAvg CNN, C = 100: im2col convs under ``lax.scan`` with ``sequential`` 14.9 or ``loop`` 14.0,
  vs XLA convs unrolled 8.2 (a conv inside a scan body: 1.7) and any vmap of per-client conv weights
  1.2-5.1 (grouped convolutions / batched matmuls). With reshape-and-max pooling (2026-11-24): ``auto``
  15.1-17.6, 1.25-1.27x the best peer (a PyTorch loop, 12.1-13.1) side by side, 1.09x on a day the
  peers ran at 15.2-15.6; every local step
  unrolled measured equal (16.5-17.4), and clients in parallel over two host devices no faster (that
  day's scan threads well; the unrolled client below does not, and gains from them).

On a GPU: one vmapped program over chunks of at most 256 clients (memory bounded by the chunk), the
local steps unrolled, im2col convolutions. Measured on one H100 (workload W, ``benchmarks/
gpu_side_by_side.py``, 2026-11-23): CNN C = 1000, chunk 256: im2col 2732, unrolled 3038, vs XLA
convs 461 (vmapped per-client conv weights become a grouped convolution, slow for more than ~100
groups; 1732 at C = 100 in one chunk) and chunks of 100 / 500 2702 / 2749 (memory 3.1 / 13.4 GB);
MLP C = 10000: unrolled 14091 vs 12425; ``sequential`` and ``loop`` 2-4x slower at every size.
TPU: the GPU rule with XLA convolutions, not measured.

CPU, conv model whose client program can be loop-free (``loop_free_steps``: at most
``MAX_UNROLLED_CONV_STEPS`` local steps and no other scan over the model, 2026-11-26): ``loop`` over clients,
every local step unrolled, each conv layer by its shape (``per_layer``: im2col for thin inputs, XLA's
convolution otherwise). XLA's gradient convolutions are 10-60x slower inside a loop on XLA:CPU
(jax-ml/jax#12868), which is why the scan formulation needs im2col; without a loop they are not, and
im2col's patch matrix (25x the input) costs more than XLA's convolution once it outgrows the cache.
Measured, quiet 2-core VM, interleaved: the CUAG-PFL / PFLDyn(Proto) round of ``cnn_pfl`` (P = 25 steps of
two batches of 50) 7.7-8.3 s against 11.4-11.9 s for the scan with im2col (1.49x); workload W's CNN (6
steps) 21.4-23.0 against 19.4-20.5 updates/s (1.10x; all-XLA 20.9-21.2), and side by side on that host 0.92-1.01x
a PyTorch loop. Longer local training keeps the scan: unrolled steps compile in time linear in their number.

Every CPU choice spreads the cohort over one CPU device per core (``core.host_devices``; 2026-11-26, interleaved,
two nice-19 jobs in the background): XLA:CPU threads one small client's operations over the cores poorly, two
clients on two single-core devices well. The loop sends clients round-robin, one in flight per device (the same
sums bit for bit): workload W's CNN at C = 100 29.9-31.4 against 22.1-22.8 updates/s on one device (1.34-1.39x),
the CUAG-PFL round 6.4-6.5 against 7.0-7.2 s (1.10x, its batches of 50 thread better). A client on one core
favours XLA's convolution more than one threaded over two: forward + backward on one core, XLA / im2col time,
10 x 14x14, 32 -> 64: 0.60 (0.90 threaded); 50 x 32x32, 3 -> 64: 0.74 (1.88); im2col still wins only at batch 10
with cin <= 3 (1.23, 1.50), a first layer, which needs no input gradient; the whole FedAvg CNN client on one
core all-XLA 52.7-52.9 against per-layer 55.0-56.5 ms, and spread over two devices 33.2-34.3 against 31.7-33.4
updates/s. So the spread loop uses XLA's convolution in every layer (``cnn_pfl``'s layers already were). The scans run as a mesh
(``shard_map``, sums combined by ``psum``: float order changes): workload W's MLP at C = 1000 1059 against 503
updates/s (2.1x), the CNN's im2col scan 23.2-23.7 against 19.6-20.0 (1.18x).

CPU, conv model whose local steps take per-example gradients (``per_example``: DP-SGD's clipping, seed 003's local
DP and DP-SCAFFOLD; 2026-12-02): the scan with im2col, loop-free or not. Vmapped over the batch, XLA's convolution
weight gradient becomes a grouped convolution, slow on XLA:CPU; im2col's is a batched matmul of patches and output
gradients, about as fast as the plain batch gradient. One DP-SGD step of the FedAvg CNN at B = 16: 44 ms im2col,
59 ms XLA. A round, the engines alternated (``benchmarks/dp_sgd_engine.py``, 2-core VM): ``ldp_minibatch_mnist``
3.58-3.73 s against 4.03-4.11 s unrolled with XLA convolutions (1.12x), compiled in 8.9-9.3 s against 22.6-23.2 s
(2.5x); DP-SCAFFOLD on ``cuag_pfl_cifar10`` 5.33-5.72 s against 5.37-5.98 s (1.01x), compiled in 12.9-13.7 s
against 50.8-63.4 s (3.9x). ``ldp_minibatch_mnist`` for 10 rounds: 56.7-58.0 s against 67.3-71.1 s, the same
accuracy and epsilon.
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
    devices: int = 1  # how many devices the cohort spreads over: loop, round-robin; traced strategies, a mesh


MAX_UNROLLED_CONV_STEPS = 32


def choose_strategy(has_conv: bool, cohort_size: int, backend: str | None = None,
                    loop_free_steps: int | None = None, per_example: bool = False) -> StrategyChoice:
    """The fastest measured formulation for this backend and model family. ``loop_free_steps``: the number
    of local steps when the client program has no other loop over the model (None: unknown, or it has one);
    ``per_example``: the local steps take per-example gradients (DP-SGD)."""
    backend = backend or jax.default_backend()
    if backend == "cpu":
        cores = len(cpu_devices())  # one device per core (core.host_devices): the cohort spreads over them
        if has_conv and per_example:
            return StrategyChoice("sequential", None, 1, "im2col", devices=cores)
        if has_conv and loop_free_steps is not None and loop_free_steps <= MAX_UNROLLED_CONV_STEPS:
            return StrategyChoice("loop", None, True, "xla" if cores > 1 else "per_layer", devices=cores)
        if has_conv:
            return StrategyChoice("sequential", None, 1, "im2col", devices=cores)
        return StrategyChoice("sequential", None, 1, "xla", devices=cores)
    chunk = max(1, min(cohort_size, 256))
    if backend == "gpu":
        return StrategyChoice("chunked", chunk, True, "im2col")
    return StrategyChoice("chunked", chunk, 1, "xla")
