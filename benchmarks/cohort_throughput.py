"""Cohort throughput on workload W for every engine formulation (issue: foundation, item 9).

Each case runs in its own subprocess (fresh peak RSS, fresh compilation cache); the parent also
measures this machine's float32 matmul peak with XLA in the same run, so ``% of peak`` is a ratio
taken under the same conditions. Output: a table on stdout and JSON (``--out``).

    python benchmarks/cohort_throughput.py --out benchmarks/out/cohort_throughput.json
    python benchmarks/cohort_throughput.py --cases cnn:100:auto mlp:1000:sequential:-:full:xla
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# the repository, so a machine without `pip install -e .` runs it
sys.path.insert(1, os.path.dirname(HERE))

from fedjax_dp.training.results import write_json  # noqa: E402

# model:cohort:strategy[:chunk:unroll:conv[:dtype]][^devices][@stream][~plain|~deferred]  ('-' =
# none, unroll 'full' =
# every step unrolled, dtype 'bf16' = bfloat16 compute with float32 parameters, ^devices = an
# explicit strategy spread
# over that many devices as ``auto`` spreads (loop: round-robin; else a mesh), @stream = the cohort
# sent to the device that
# many clients at a time, ``CohortEngine(stream_size=)``, ~plain = local training without deferred
# dense kernels,
# ``engine.deferred_dense='off'``, ~deferred = with them, ``'on'``, whatever the backend)
DEFAULT_CASES = [
    "cnn:10:vmap:-:full:xla",
    "cnn:10:chunked:5:full:im2col",
    "cnn:10:loop:-:full:xla",
    "cnn:10:loop:-:full:im2col",
    "cnn:10:loop:-:1:im2col",
    "cnn:10:sequential:-:1:im2col",
    "cnn:10:auto",
    "cnn:100:loop:-:full:xla",
    "cnn:100:loop:-:1:im2col",
    "cnn:100:sequential:-:1:xla",
    # auto = that loop, round-robin over a CPU device per core
    "cnn:100:loop:-:full:per_layer",
    "cnn:100:auto",
    "cnn:100:auto~plain",
    "cnn:1000:auto",
    "mlp:10:auto",
    "mlp:100:vmap:-:full:xla",
    "mlp:100:auto",
    "mlp:1000:vmap:-:1:xla",
    "mlp:1000:chunked:100:1:xla",
    "mlp:1000:chunked:250:full:xla",
    "mlp:1000:loop:-:full:xla",
    "mlp:1000:sequential:-:1:xla",
    "mlp:1000:auto",
]


def parse_case(text: str) -> dict:
    text, _, plain = text.partition("~")
    text, _, stream = text.partition("@")
    text, _, devices = text.partition("^")
    parts = text.split(":")
    case = {
        "model": parts[0],
        "cohort": int(parts[1]),
        "strategy": parts[2],
        "stream_size": int(stream) if stream else None,
        "deferred_dense": {"plain": False, "deferred": True}.get(plain),
    }
    if case["strategy"] != "auto":
        chunk, unroll, conv, dtype = (parts[3:] + ["-", "1", "xla", "f32"][len(parts) - 3 :])[:4]
        case.update(
            chunk_size=None if chunk == "-" else int(chunk),
            unroll=True if unroll == "full" else int(unroll),
            conv_impl=conv,
            compute_dtype={"f32": None, "bf16": "bfloat16"}[dtype],
            devices=int(devices or 1),
        )
    return case


def device_peak_bytes():
    """Peak bytes the accelerator's allocator held in this process (None on CPU, which reports
    none)."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


class PeakRss:
    """Peak resident memory of this process, sampled every 50 ms."""

    def __init__(self):
        import psutil

        self._process, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self._process.memory_info().rss)


def build_workload(case: dict):
    """Workload W for a parsed case; ``auto`` is resolved as ``run_experiment`` would (recorded in
    ``case``)."""
    sys.path.insert(0, HERE)
    from workload_w import WorkloadW
    from workload_w_data import MODELS, STEPS

    from fedjax_dp.core.strategy import choose_strategy
    from fedjax_dp.models import get_model

    if case["strategy"] == "auto":
        # workload W's client is plain local SGD: no loop but its STEPS steps (what run_experiment
        # would find)
        choice = choose_strategy(
            get_model(MODELS[case["model"]]).has_conv, case["cohort"], loop_free_steps=STEPS
        )
        case.update(
            resolved=choice.strategy,
            chunk_size=choice.chunk_size,
            unroll=choice.unroll,
            conv_impl=choice.conv_impl,
            devices=choice.devices,
        )
    return WorkloadW(
        case["model"],
        case.get("resolved", case["strategy"]),
        case["chunk_size"],
        case["unroll"],
        case["conv_impl"],
        case.get("compute_dtype"),
        population=case["cohort"],
        stream_size=case.get("stream_size"),
        devices=case.get("devices", 1),
        deferred_dense=case.get("deferred_dense"),
    )


def worker(case: dict, rounds: int, warmup: int) -> dict:
    import jax

    rss = PeakRss()
    work = build_workload(case)
    from workload_w_data import FLOPS_PER_CLIENT_UPDATE  # on the path build_workload set

    start = time.perf_counter()
    work.round(0, case["cohort"])
    first_round = time.perf_counter() - start
    for r in range(1, 1 + warmup):
        work.round(r, case["cohort"])
    times = []
    for r in range(1 + warmup, 1 + warmup + rounds):
        start = time.perf_counter()
        work.round(r, case["cohort"])
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    # before the analysis's compile (it may autotune on a GPU)
    peak_rss, device_peak = rss.stop(), device_peak_bytes()
    program_memory = work.program_memory(case["cohort"])
    ups = case["cohort"] / median
    return {
        **case,
        "unroll": "full" if case["unroll"] is True else case["unroll"],
        "round_times_s": [round(t, 4) for t in times],
        "median_round_s": median,
        "client_updates_per_s": ups,
        "compile_s": max(0.0, first_round - median),
        "first_round_s": first_round,
        "achieved_gflops": ups * FLOPS_PER_CLIENT_UPDATE[case["model"]] / 1e9,
        "peak_rss_mib": peak_rss / 2**20,
        "backend": jax.default_backend(),
        "device_peak_mib": None if device_peak is None else device_peak / 2**20,
        "program_memory_mib": {k: v / 2**20 for k, v in program_memory.items()},
        "device": str(jax.local_devices()[0].device_kind),
    }


# (slow case, reference case, least acceptable ratio): formulations that once ran several times
# slower
# than they should. The XLA:CPU convolution inside the padded-step lax.cond made the first case
# 0.16x
# the second (issue 20); fixed, it is ~0.8x. A ratio below the floor is reported as a regression.
REGRESSION_PAIRS = [("cnn:10:loop:-:full:xla", "cnn:10:loop:-:full:im2col", 0.5)]


def regressions(rows_by_case: dict) -> list[dict]:
    """Each regression pair whose two cases ran: the ratio of their throughputs and whether it is
    too low."""
    found = []
    for slow, reference, floor in REGRESSION_PAIRS:
        a, b = rows_by_case.get(slow, {}), rows_by_case.get(reference, {})
        if "client_updates_per_s" in a and "client_updates_per_s" in b:
            ratio = a["client_updates_per_s"] / b["client_updates_per_s"]
            found.append(
                {
                    "case": slow,
                    "reference": reference,
                    "ratio": ratio,
                    "floor": floor,
                    "regression": ratio < floor,
                }
            )
    return found


def matmul_peak(library: str, n: int = 2048, reps: int = 10) -> float:
    """Best-of-``reps`` float32 n x n matmul rate in GFLOP/s with XLA (``jax``) or NumPy's BLAS
    (``numpy``, the peers' reference: about 73 GFLOP/s on this machine)."""
    import numpy as np

    if library == "jax":
        import jax
        import jax.numpy as jnp

        a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
        b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
        dot = jax.jit(jnp.dot)
        run = lambda: dot(a, b).block_until_ready()  # noqa: E731
    else:
        a, b = (np.random.default_rng(s).standard_normal((n, n), dtype=np.float32) for s in (0, 1))
        run = lambda: a @ b  # noqa: E731
    run()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", nargs="*", default=DEFAULT_CASES)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median reported)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds after the compiling one"
    )
    parser.add_argument("--out", default=os.path.join(HERE, "out", "cohort_throughput.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(
            "RESULT " + json.dumps(worker(json.loads(args.worker), args.rounds, args.warmup)),
            flush=True,
        )
        return

    # On a GPU the parent's matmul would otherwise preallocate most of the device's memory and leave
    # the
    # workers (which inherit this) out of memory.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    peaks_before = {lib: matmul_peak(lib) for lib in ("jax", "numpy")}
    rows, rows_by_case = [], {}
    for text in args.cases:
        case = parse_case(text)
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                json.dumps(case),
                "--rounds",
                str(args.rounds),
                "--warmup",
                str(args.warmup),
            ],
            capture_output=True,
            text=True,
        )
        line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if not line:
            rows.append({**case, "error": out.stderr[-1500:]})
            print(
                f"{text:36s} FAILED:"
                f" {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}",
                flush=True,
            )
            continue
        row = json.loads(line[0][7:])
        rows.append(row)
        rows_by_case[text] = row
        print(
            f"{text:36s} {row['client_updates_per_s']:9.2f} updates/s {row['achieved_gflops']:7.2f}"
            f" GFLOP/s compile {row['compile_s']:6.2f}s rss {row['peak_rss_mib']:7.0f} MiB"
            + (
                f"  (auto -> {row['resolved']}, unroll {row['unroll']}, {row['conv_impl']},"
                f" {row['devices']} device(s))"
                if "resolved" in row
                else ""
            ),
            flush=True,
        )
    peaks = {lib: max(before, matmul_peak(lib)) for lib, before in peaks_before.items()}
    for row in rows:
        if "achieved_gflops" in row:
            for lib, peak in peaks.items():
                row[f"percent_of_{lib}_matmul_peak"] = 100 * row["achieved_gflops"] / peak
    report = {
        "benchmark": "cohort_throughput (workload W)",
        "matmul_peak_gflops": peaks,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": rows,
        "regressions": regressions(rows_by_case),
    }
    for check in report["regressions"]:
        print(
            f"{'REGRESSION' if check['regression'] else 'ok'}: {check['case']} runs at"
            f" {check['ratio']:.2f}x {check['reference']} (floor {check['floor']})"
        )
    write_json(args.out, report, indent=2)
    print(
        f"matmul peak: XLA {peaks['jax']:.1f}, numpy {peaks['numpy']:.1f} GFLOP/s; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
