"""``fedjax-dp-launch -n N`` (``python -m fedjax_dp.launch``): N local processes as one distributed
run, to try several hosts on one machine (a cluster starts one process per host itself,
``fedjax_dp.distributed``).

    fedjax-dp-launch -n 2 -- --config dp_fedavg_mnist --workdir results/two   # fedjax-dp
    --distributed ... twice fedjax-dp-launch -n 2 -- python
    my_script.py                             # any program that initializes

Each process gets ``FEDJAX_DP_COORDINATOR`` (127.0.0.1 and a free port), ``FEDJAX_DP_NUM_PROCESSES``
and ``FEDJAX_DP_PROCESS_ID``, and ``--cpu_devices`` CPU devices (``FEDJAX_DP_CPU_DEVICES``; default
the cores shared out). Process 0 prints as usual; the others' lines are prefixed ``[process i]``;
the runtime's own records (XLA's coordination service, gloo, a dying process's stack trace) go to
``launch.log`` in the run's workdir instead (``launch_output``).
When a process fails the others are given ``--timeout`` seconds to notice (JAX's heartbeat) before
they are stopped; the exit status is the first process to fail (128 + the signal where a signal
killed it), or 0. SIGINT / SIGTERM are passed on to every process (each checkpoints and stops).
Where the launcher itself dies without passing anything on (``kill -9``), the kernel kills each
process too (Linux's parent-death signal, SIGKILL: JAX's own SIGTERM handler would keep a process
running), so none trains on, or holds the workdir's lock, after it; ``--resume`` continues from the
last checkpoint.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from fedjax_dp.core.host_devices import host_cores
from fedjax_dp.distributed import COORDINATOR, NUM_PROCESSES, PROCESS_ID, TIMEOUT
from fedjax_dp.launch_output import RuntimeOutput, forward, log_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that started it ends


def _ends_with(parent: int):
    """A ``preexec_fn`` that asks the kernel to kill the child once ``parent`` (the launcher) has
    died; None where the system has no parent-death signal (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    def arrange() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the launcher died before the request: end now
            os.kill(os.getpid(), signal.SIGKILL)

    return arrange


def command_of(rest: list[str]) -> list[str]:
    """The program each process runs: ``fedjax-dp --distributed REST`` when REST is options, else
    REST itself."""
    if rest and not rest[0].startswith("-"):
        return rest
    return [sys.executable, "-m", "fedjax_dp", "--distributed", *rest]


def launch(
    num_processes: int,
    rest: list[str],
    cpu_devices: int | None = None,
    timeout_s: int = 60,
    port: int | None = None,
) -> int:
    """Runs ``command_of(rest)`` as ``num_processes`` processes; returns the exit status (module
    docstring)."""
    if num_processes < 1:
        raise ValueError(f"-n must be >= 1 processes, got {num_processes}")
    devices = cpu_devices or max(1, host_cores() // num_processes)
    address = f"127.0.0.1:{port or free_port()}"
    processes, threads, parent = [], [], os.getpid()
    for index in range(num_processes):
        env = {
            **os.environ,
            COORDINATOR: address,
            NUM_PROCESSES: str(num_processes),
            PROCESS_ID: str(index),
            TIMEOUT: str(timeout_s),
            "FEDJAX_DP_CPU_DEVICES": str(devices),
        }
        process = subprocess.Popen(
            command_of(rest),
            env=env,
            stdout=subprocess.PIPE,
            # process 0's stdout (the summary) stays apart; the others' lines are all prefixed
            stderr=subprocess.PIPE if index == 0 else subprocess.STDOUT,
            preexec_fn=_ends_with(parent),
        )
        processes.append(process)
    # the runtime's own lines (XLA, gloo) into a log file, the terminal keeps the processes' lines
    runtime = RuntimeOutput(log_path(rest))
    streams = [
        (processes[0].stdout, "", sys.stdout, runtime),
        (processes[0].stderr, "", sys.stderr, runtime),
        *((p.stdout, f"[process {i}] ", sys.stderr, runtime) for i, p in enumerate(processes) if i),
    ]
    # the forwarding threads after every start: a preexec_fn is unsafe beside running threads
    for stream in streams:
        threads.append(threading.Thread(target=forward, args=stream, daemon=True))
        threads[-1].start()

    def pass_on(signum, frame):
        for p in processes:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        failures = _watch(processes, timeout_s)
        for thread in threads:
            thread.join(timeout=5)
        if runtime.written():
            print(
                f"fedjax-dp-launch: the runtime's own output ({runtime.lines} lines of XLA and gloo"
                f" records) is in {runtime.path}",
                file=sys.stderr,
            )
        if not failures:
            return 0
        index, code = failures[0]
        print(
            f"fedjax-dp-launch: the run failed: process {index} was the first to stop"
            f" ({_ended(code)})"
            + (
                f"; then {', '.join(f'process {i} ({_ended(c)})' for i, c in failures[1:])}"
                if failures[1:]
                else ""
            ),
            file=sys.stderr,
        )
        return 128 - code if code < 0 else code
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _watch(processes, timeout_s: int) -> list[tuple[int, int]]:
    """Waits for every process; ``(index, exit status)`` of those that failed, in the order they
    stopped. Once one has failed, those still running after ``timeout_s`` + 10 s (JAX's heartbeat
    should have ended them) are killed."""
    failures, seen, first_failure = [], set(), None
    while True:
        running = False
        for index, p in enumerate(processes):
            code = p.poll()
            running |= code is None
            if code is None or index in seen:
                continue
            seen.add(index)
            if code != 0:
                failures.append((index, code))
                first_failure = first_failure or time.monotonic()
                print(
                    f"fedjax-dp-launch: process {index} stopped ({_ended(code)})", file=sys.stderr
                )
        if not running:
            return failures
        if first_failure is not None and time.monotonic() - first_failure > timeout_s + 10:
            for index, p in enumerate(processes):
                if p.poll() is None:
                    print(
                        f"fedjax-dp-launch: process {index} still runs {timeout_s + 10} s after"
                        f" process {failures[0][0]} stopped: killing it",
                        file=sys.stderr,
                    )
                    p.kill()
        time.sleep(0.1)


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = argparse.ArgumentParser(
        prog="fedjax-dp-launch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", "--num_processes", type=int, required=True)
    parser.add_argument("--cpu_devices", type=int, default=None, help="CPU devices per process")
    parser.add_argument(
        "--timeout", type=int, default=60, help="seconds a lost process may go unnoticed"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="the coordinator's port (default: a free one)"
    )
    args = parser.parse_args(ours)
    try:
        return launch(args.num_processes, rest, args.cpu_devices, args.timeout, args.port)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
