"""Peak memory of a cohort spread over CPU devices, against the size of the round's shared inputs.

XLA:CPU's host devices do not share buffers: the ``loop`` engine spread over a device per core puts
the shared inputs (model, server state, the round's inputs such as CUAG-PFL's held random matrices)
on every device. ``CohortEngine(max_replicated_bytes=)`` (config ``engine.max_replicated_gb``) runs
the cohort on one device where those copies would pass the limit. Each case runs in its own process
and reports the rise of the process's peak RSS (``ru_maxrss``, the kernel's exact peak) over one
call with a shared matrix of ``--shared-mib`` MiB, and the call's time (one call: compare the
memory, not the seconds).

    python benchmarks/shared_input_copies.py --shared-mib 512 --out
    benchmarks/out/shared_input_copies.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# the repository, so a machine without `pip install -e .` runs it
sys.path.insert(1, os.path.dirname(HERE))

from fedjax_dp.training.results import write_json  # noqa: E402

CASES = {  # name: (devices, max_replicated_bytes)
    "one device": (1, None),
    "two devices, copies allowed": (2, 2**40),
    "two devices, default limit": (2, None),
}


def worker(devices: int, limit: int | None, shared_mib: int, clients: int) -> dict:
    import resource

    import jax
    import jax.numpy as jnp
    import numpy as np

    import fedjax_dp

    fedjax_dp.use_a_device_per_core()  # one CPU device per core, before JAX starts
    from fedjax_dp.core.cohort import CohortEngine

    def client_fn(shared, client):
        return {"measured": shared["matrix"] @ client["x"]}, {"sum": jnp.sum(client["x"])}

    options = {} if limit is None else {"max_replicated_bytes": limit}
    spread = {"devices": tuple(jax.local_devices()[:devices])} if devices > 1 else {}
    engine = CohortEngine(client_fn, "loop", **spread, **options)
    columns = shared_mib * 2**20 // (4 * 1024)
    # compile paths, small
    engine({"matrix": jnp.ones((4, 8))}, {"x": np.ones((clients, 8), np.float32)})
    shared = {"matrix": jax.block_until_ready(jnp.ones((1024, columns), jnp.float32))}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    jax.block_until_ready(engine(shared, {"x": np.ones((clients, columns), np.float32)}))
    seconds = time.perf_counter() - start
    rise_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return {
        "devices": devices,
        "max_replicated_bytes": engine.max_replicated_bytes,
        "shared_mib": shared_mib,
        "peak_rss_rise_mib": rise_mib,
        "seconds": seconds,
        "ran_on_one_device": engine.ran_on_one_device,
        "local_devices": len(jax.local_devices()),
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shared-mib",
        type=int,
        default=1536,
        help="size of the shared matrix (default: over the 1 GiB limit)",
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(HERE, "out", "shared_input_copies.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        devices, limit = json.loads(args.worker)
        print(
            "RESULT " + json.dumps(worker(devices, limit, args.shared_mib, args.clients)),
            flush=True,
        )
        return
    rows = []
    for name, case in CASES.items():
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                json.dumps(case),
                "--shared-mib",
                str(args.shared_mib),
                "--clients",
                str(args.clients),
            ],
            capture_output=True,
            text=True,
        )
        line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        row = {"case": name, **(json.loads(line[0][7:]) if line else {"error": out.stderr[-1500:]})}
        rows.append(row)
        print(
            f"{name:30s} "
            + (
                f"peak RSS +{row['peak_rss_rise_mib']:7.0f} MiB  {row['seconds']:6.2f} s  "
                f"one device: {row['ran_on_one_device']}"
                if "error" not in row
                else "FAILED"
            ),
            flush=True,
        )
    write_json(args.out, {"benchmark": "shared_input_copies", "rows": rows}, indent=None)


if __name__ == "__main__":
    main()
