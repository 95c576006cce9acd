"""Workload W over several processes (issue 76): one DP-FedAvg round of C clients on 1, 2 and 4
local processes with the same 4 CPU devices in all (``fedjax-dp-launch -n P --cpu_devices 4/P``: one
global mesh of 4 devices), and on 1 and 2 processes with one device per core (2 cores),
each process packing and training only its C/P clients; the client sums are added across processes
inside the program (gloo).

Per P, measured in one run: client-updates/s (median round), the cross-process reduction alone (a
jitted sum of one model-sized array per device over the global mesh, what the round adds across
hosts; its median), its share of the round, each process's peak RSS and the bytes of its packed
cohort shard (C/P clients).

One machine cannot show a speed-up: the processes share its cores (P = 4 runs four processes on two
cores), so a round costs the same work plus the reduction. What it gives is the model for a pod
slice, where each host has its own cores and the cohort's compute divides by P:

    t_round(P) = t_client * C / (P * devices_per_host) + t_allreduce(P, model bytes)

with ``t_client`` the measured per-client time on one device and ``t_allreduce`` one model-sized
all-reduce of the hosts' network (ring: 2 (P - 1) / P * bytes / bandwidth + 2 (P - 1) * latency).
The JSON gives the fitted terms and the prediction for the bandwidths named in ``--predict_gbps``:
assumptions, not measurements.

    python benchmarks/distributed.py --out benchmarks/measured/cpu_<date>_distributed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# the repository, so a machine without `pip install -e .` runs it
sys.path.insert(1, os.path.dirname(HERE))


def worker(args) -> None:
    """One process of a P-process run: P rounds' timings, the reduction alone, memory (process 0
    prints them)."""
    from fedjax_dp import distributed

    distributed.initialize()  # the launcher's environment
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from cohort_throughput import PeakRss
    from fedjax_dp.core import hosts
    from fedjax_dp.core.cohort import client_mesh
    from workload_w import WorkloadW

    rss = PeakRss()
    work = WorkloadW(
        args.model, "sequential", None, 1, "xla", population=args.cohort, devices=jax.device_count()
    )
    shard = work._cohort(0, args.cohort)
    shard_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(shard["batches"]))
    # compiles (the server step again in its second call: committed inputs)
    for r in range(-args.warmup, 0):
        work.round(r, args.cohort)
    times = []
    for r in range(1, 1 + args.rounds):
        start = time.perf_counter()
        work.round(r, args.cohort)
        times.append(time.perf_counter() - start)

    size = sum(x.size for x in jax.tree_util.tree_leaves(work.params))
    mesh = client_mesh() if hosts.distributed() else client_mesh(jax.device_count())
    rows = jax.local_device_count()
    local = np.ones((rows, size), np.float32)
    spread = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec(mesh.axis_names[0])), local, (jax.device_count(), size)
    )
    reduce = jax.jit(
        lambda x: jnp.sum(x, axis=0), out_shardings=NamedSharding(mesh, PartitionSpec())
    )
    reduce(spread).block_until_ready()
    reductions = []
    for _ in range(args.reductions):
        start = time.perf_counter()
        reduce(spread).block_until_ready()
        reductions.append(time.perf_counter() - start)
    peak = rss.stop()
    mine = np.array([peak, shard_bytes], np.float64)
    every = hosts.gather_rows(mine[None]) if hosts.distributed() else mine[None]
    if hosts.is_primary():
        print(
            "RESULT "
            + json.dumps(
                {
                    "processes": hosts.process_count(),
                    "devices": jax.device_count(),
                    "devices_per_process": jax.local_device_count(),
                    "model_parameters": int(size),
                    "round_times_s": [round(t, 4) for t in times],
                    "median_round_s": statistics.median(times),
                    "client_updates_per_s": args.cohort / statistics.median(times),
                    "reduction_s": statistics.median(reductions),
                    "reduction_share": statistics.median(reductions) / statistics.median(times),
                    "peak_rss_mib": [float(v) / 2**20 for v in every[:, 0]],
                    "cohort_shard_mib": [float(v) / 2**20 for v in every[:, 1]],
                }
            ),
            flush=True,
        )


def prediction(
    rows: list[dict], cohort: int, gbps: float, latency_s: float, hosts_list, devices_per_host: int
):
    """The cost model's round time at P hosts (module docstring) from one process's measured client
    time (its round x its devices / C: seconds a client costs one device)."""
    # one device per core where measured: no device shares a core
    ones = [r for r in rows if r["processes"] == 1]
    one = next((r for r in ones if r["devices"] == os.cpu_count()), ones[0])
    t_client = one["median_round_s"] * one["devices"] / cohort  # seconds per client on one device
    model_bytes = 4 * one["model_parameters"]
    out = []
    for p in hosts_list:
        allreduce = 2 * (p - 1) / p * model_bytes / (gbps * 1e9 / 8) + 2 * (p - 1) * latency_s
        compute = t_client * cohort / (p * devices_per_host)
        out.append(
            {
                "hosts": p,
                "compute_s": compute,
                "allreduce_s": allreduce,
                "round_s": compute + allreduce,
                "reduction_share": allreduce / (compute + allreduce),
            }
        )
    return {
        "t_client_s": t_client,
        "model_bytes": model_bytes,
        "network_gbps": gbps,
        "latency_s": latency_s,
        "devices_per_host": devices_per_host,
        "rows": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--cohort", type=int, default=1000)
    parser.add_argument(
        "--layouts",
        nargs="*",
        default=["1x4", "2x2", "4x1", "1x2", "2x1"],
        help=(
            "PxD: P processes of D CPU devices each (the first three share one 4-device mesh; the "
            "last two give one device per core of a 2-core machine)"
        ),
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed rounds after the compiling one"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--reductions", type=int, default=20)
    parser.add_argument("--predict_gbps", type=float, nargs="*", default=[10.0, 100.0])
    parser.add_argument("--out", default=os.path.join(HERE, "out", "distributed.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    rows = []
    for layout in args.layouts:
        p, d = (int(v) for v in layout.split("x"))
        command = [
            sys.executable,
            "-m",
            "fedjax_dp.launch",
            "-n",
            str(p),
            "--cpu_devices",
            str(d),
            "--",
            sys.executable,
            __file__,
            "--worker",
            "--model",
            args.model,
            "--cohort",
            str(args.cohort),
            "--rounds",
            str(args.rounds),
            "--warmup",
            str(args.warmup),
            "--reductions",
            str(args.reductions),
        ]
        out = subprocess.run(command, capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise SystemExit(f"P={p} failed ({out.returncode}): {out.stderr[-3000:]}")
        rows.append(json.loads(line[0][len("RESULT ") :]))
        r = rows[-1]
        print(
            f"{p} x {d}: {r['client_updates_per_s']:.0f} client-updates/s, round"
            f" {r['median_round_s']:.3f} s, reduction {1e3 * r['reduction_s']:.2f} ms"
            f" ({100 * r['reduction_share']:.2f} %), peak RSS {max(r['peak_rss_mib']):.0f}"
            f" MiB/process, shard {r['cohort_shard_mib'][0]:.1f} MiB",
            flush=True,
        )
    from fedjax_dp.training.results import write_json

    result = {
        "benchmark": "distributed",
        "model": args.model,
        "cohort": args.cohort,
        "rows": rows,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": " ".join(sys.argv),
        "note": (
            "processes share one machine's cores: no speed-up is possible here; predictions are the"
            " cost model's, from the measured client time and an assumed network"
        ),
        "predictions": [
            prediction(rows, args.cohort, g, 20e-6, [1, 4, 16, 64], 4) for g in args.predict_gbps
        ],
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
