"""One run over several processes: ``jax.distributed.initialize`` for the ``fedjax-dp
--distributed`` command and ``Experiment.run(..., distributed=True)``.

JAX's multi-controller model: every host runs the same program; ``jax.distributed`` connects them,
and ``jax.devices()`` then lists every process's devices. Where the cluster is found from its
environment (a TPU pod slice, SLURM, Open MPI: JAX's own auto-detection), nothing needs to be given;
elsewhere the coordinator's address, the number of processes and this process's index, as arguments
or as the environment variables below (``python -m fedjax_dp.launch -n N`` sets them to try it on
one machine). On CPU the processes' collectives go through gloo (set here, before JAX starts).

A process that dies or cannot connect: JAX's coordination service notices a missing heartbeat within
``timeout_s`` (``FEDJAX_DP_DISTRIBUTED_TIMEOUT``, default 60 s) and ends every other process ("The
following tasks are unhealthy (stopped sending heartbeats): 1"), so a run never hangs; a collective
waiting on a dead peer fails sooner, when its connection closes (gloo: "Connection closed by peer"
or "Received data size doesn't match"), and ``fedjax-dp-launch`` then names the process that stopped
first. A process other than 0 that finds no coordinator within ``timeout_s`` stops with one line
naming the address; process 0 whose peers do not all arrive within it is ended by JAX
(``DEADLINE_EXCEEDED ... RegisterTask``).
"""

from __future__ import annotations

import logging
import os
import socket
import time

import jax

from fedjax_dp.core.host_devices import use_a_device_per_core

COORDINATOR = "FEDJAX_DP_COORDINATOR"  # host:port of process 0's coordination service
NUM_PROCESSES = "FEDJAX_DP_NUM_PROCESSES"
PROCESS_ID = "FEDJAX_DP_PROCESS_ID"
TIMEOUT = "FEDJAX_DP_DISTRIBUTED_TIMEOUT"  # seconds: connection, and a lost process's heartbeat
DEFAULT_TIMEOUT_S = 60


def _integer(value, name: str, minimum: int):
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum or str(number) != str(value).strip():
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


def settings(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: int | None = None,
) -> dict:
    """The arguments of ``jax.distributed.initialize`` from ours, then the environment; refuses bad
    values by name. Empty where the cluster is to be auto-detected."""
    address = coordinator_address or os.environ.get(COORDINATOR) or None
    count = _integer(
        num_processes if num_processes is not None else os.environ.get(NUM_PROCESSES),
        f"--num_processes ({NUM_PROCESSES})",
        1,
    )
    index = _integer(
        process_id if process_id is not None else os.environ.get(PROCESS_ID),
        f"--process_id ({PROCESS_ID})",
        0,
    )
    timeout = (
        _integer(
            timeout_s if timeout_s is not None else os.environ.get(TIMEOUT),
            f"--distributed_timeout ({TIMEOUT})",
            1,
        )
        or DEFAULT_TIMEOUT_S
    )
    given = {"coordinator_address": address, "num_processes": count, "process_id": index}
    if any(v is not None for v in given.values()) and not all(
        v is not None for v in given.values()
    ):
        missing = [k for k, v in given.items() if v is None]
        raise ValueError(
            "distributed: give all of --coordinator_address, --num_processes and --process_id (or "
            f"{COORDINATOR}, {NUM_PROCESSES}, {PROCESS_ID}), or none of them for the cluster's "
            f"auto-detection; missing {', '.join(missing)}"
        )
    if count is not None and index >= count:
        raise ValueError(f"--process_id={index} must be below --num_processes={count}")
    if address is not None and ":" not in address:
        raise ValueError(f"--coordinator_address must be host:port, got {address!r}")
    extra = {k: v for k, v in given.items() if v is not None}
    return {**extra, "initialization_timeout": timeout, "heartbeat_timeout_seconds": timeout}


def _reach(address: str, timeout_s: int) -> None:
    """Waits until the coordinator (process 0) accepts connections at ``address``; a clear error
    after ``timeout_s``."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"distributed: could not join the run at {address} within {timeout_s} s:"
                    f" nothing accepts connections there ({error.strerror or error}); is process 0"
                    " running?"
                ) from None
            time.sleep(0.2)


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: int | None = None,
) -> None:
    """Joins this process to the run (module docstring). A no-op where JAX's distributed runtime
    already runs; an error naming the setting where JAX's backends started before it (call it
    first)."""
    if jax.distributed.is_initialized():
        return
    arguments = settings(coordinator_address, num_processes, process_id, timeout_s)
    # JAX fixes the CPU device count when it joins: ask first (``core.host_devices``)
    use_a_device_per_core()
    # JAX ends the process from C++ when it cannot register: check first
    if arguments.get("process_id", 0) > 0:
        _reach(arguments["coordinator_address"], arguments["initialization_timeout"])
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except Exception:  # noqa: BLE001  (a JAX without gloo: the accelerator's own collectives are used)
        logging.info("gloo CPU collectives unavailable")
    try:
        jax.distributed.initialize(**arguments)
    except RuntimeError as error:
        text = " ".join(str(error).split())
        if "before any JAX" in text or "backend" in text.lower() and "already" in text.lower():
            raise RuntimeError(
                "distributed: jax.distributed.initialize must run before JAX starts: call "
                "fedjax_dp.distributed.initialize() (or pass distributed=True) before any JAX "
                f"computation ({text[:200]})"
            ) from None
        raise RuntimeError(
            "distributed: could not join the run at"
            f" {arguments.get('coordinator_address', 'the cluster')} within"
            f" {arguments['initialization_timeout']} s: {text[:300]}"
        ) from None
    logging.info(
        "distributed: process %d of %d, %d local and %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
