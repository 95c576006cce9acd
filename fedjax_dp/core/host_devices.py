"""One JAX CPU device per core, so the cohort engine can run a client (``loop``) or a shard of the
cohort (a mesh, for the scans) on each core at once.

XLA:CPU gives a process one CPU device by default and threads each operation over the cores. For the
small batches of federated clients that threading scales poorly, and two clients on two single-core
devices beat one client threaded over both (``benchmarks/RESULTS.md``, "one device per core"). The
device count can only be set before JAX starts its backends, so ``Experiment`` and the ``fedjax-dp``
command set it before they run (importing the package changes nothing; a hand-written script calls
``fedjax_dp.use_a_device_per_core()`` before its first JAX computation), unless the user already
chose (``JAX_NUM_CPU_DEVICES``, ``jax_num_cpu_devices``, or
``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``), set ``FEDJAX_DP_CPU_DEVICES`` (an
integer; 1 keeps JAX's default), or JAX already ran something (then nothing changes: the engine uses
the devices that exist). Other JAX code is unaffected: it runs on the first CPU device, as before,
unless it asks for the others.
"""

from __future__ import annotations

import os

import jax

ENV = "FEDJAX_DP_CPU_DEVICES"


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def use_a_device_per_core() -> int | None:
    """Sets ``jax_num_cpu_devices`` (module docstring); returns the count set, or None where it left
    JAX's."""
    requested = os.environ.get(ENV)
    if requested is not None and not (requested.isdigit() and int(requested) >= 1):
        raise ValueError(
            f"{ENV} must be an integer >= 1 (1 = JAX's default, one CPU device), got {requested!r}"
        )
    if (
        jax.config.jax_num_cpu_devices != -1
        or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    ):
        return None  # the user's choice stands
    count = int(requested) if requested is not None else host_cores()
    if count == 1:
        return None
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX's backends already started: keep what exists
        return None
    return count


def cpu_devices() -> tuple:
    """The CPU devices of this process (one unless ``use_a_device_per_core`` ran before JAX
    started)."""
    return tuple(jax.local_devices(backend="cpu"))
