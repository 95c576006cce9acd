"""Where one core's time goes in workload W's CNN client, and what two cores lose inside one process
(issue 20).

Part 1, on one CPU device (run it pinned to one core, ``taskset -c 1``): forward + backward of each
layer of ``cnn_fedavg`` at its shapes in a local step (batch 10, XLA convolutions, the layers `auto`
uses on a CPU device per core), the whole step, and the whole client (6 steps, delta, clip):
milliseconds and GFLOP/s against the same core's float32 matmul peak, measured in the same run.

Part 2 (``--concurrency``): the client's milliseconds when two clients run at once, (a) in one
process on two CPU devices, every client dispatched up front (the most the engine's ``loop`` could
get from the two devices), and (b) in two processes pinned one per core (what two independent runs
get). JSON out.

    taskset -c 1 python benchmarks/cnn_step_parts.py --out benchmarks/out/cnn_step_parts.json
    python benchmarks/cnn_step_parts.py --concurrency --out benchmarks/out/cnn_step_concurrency.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import best_ms  # noqa: E402


def one_client(devices: int = 1):
    """Workload W's CNN (XLA convolutions, every step unrolled), its jitted client program and one
    client's data."""
    import jax
    from workload_w import WorkloadW

    work = WorkloadW("cnn", "loop", None, True, "xla", devices=devices)
    client = jax.device_put(jax.tree_util.tree_map(lambda x: x[0], work._cohort(0, 1)))
    return work, jax.jit(work.engine.client_fn), client


def layer_parts() -> dict:
    """Part 1: each layer's forward + backward, the step and the client on this process's first
    device."""
    import jax
    import jax.numpy as jnp
    from cohort_throughput import matmul_peak
    from fedjax_dp.models.pooling import max_pool_2x2
    from workload_w_data import BATCH

    b, keys = BATCH, jax.random.split(jax.random.key(0), 8)
    conv = lambda x, w: jax.lax.conv_general_dilated(
        x,
        w,
        (1, 1),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),  # noqa: E731
    )
    relu_pool = lambda a: jnp.sum(max_pool_2x2(jax.nn.relu(a)) ** 2)  # noqa: E731
    labels = jnp.arange(b) % 10

    def dense(d1, d2, h):
        z = jax.nn.relu(h @ d1) @ d2
        return jnp.mean(jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, labels[:, None], 1)[:, 0])

    normal = lambda i, shape, scale=1.0: scale * jax.random.normal(keys[i], shape)  # noqa: E731
    parts = {  # name: (function, arguments, multiply-adds of its forward and backward products)
        "conv1 5x5 1->32, weight gradient": (
            jax.jit(jax.grad(lambda w, x: jnp.sum(conv(x, w) ** 2))),
            # no input gradient
            (normal(0, (5, 5, 1, 32), 0.1), normal(1, (b, 28, 28, 1))),
            2 * b * 28 * 28 * 32 * 25,
        ),
        "conv2 5x5 32->64, weight and input gradients": (
            jax.jit(jax.grad(lambda w, x: jnp.sum(conv(x, w) ** 2), (0, 1))),
            (normal(2, (5, 5, 32, 64), 0.05), normal(3, (b, 14, 14, 32))),
            3 * b * 14 * 14 * 64 * 800,
        ),
        "relu + pool 1 (28x28x32)": (
            jax.jit(jax.grad(relu_pool)),
            (normal(4, (b, 28, 28, 32)),),
            0,
        ),
        "relu + pool 2 (14x14x64)": (
            jax.jit(jax.grad(relu_pool)),
            (normal(5, (b, 14, 14, 64)),),
            0,
        ),
        "dense 3136->512->10 + loss": (
            jax.jit(jax.grad(dense, (0, 1, 2))),
            (normal(6, (3136, 512), 0.02), normal(7, (512, 10), 0.05), normal(1, (b, 3136))),
            3 * b * (3136 * 512 + 5120),
        ),
    }
    work, client_fn, client = one_client()
    batch = jax.tree_util.tree_map(lambda x: x[0], client["batches"])
    step_grad = jax.jit(jax.grad(lambda p, batch: jnp.mean(work.model.per_example_loss(p, batch))))
    peak = matmul_peak("jax")
    rows = {}
    for name, (fn, args, macs) in parts.items():
        ms = best_ms(fn, *args)
        flops = 2 * macs
        rows[name] = {"ms": ms, "gflops": flops / ms / 1e6 if flops else None}
    rows["one step's gradient (flax model)"] = {"ms": best_ms(step_grad, work.params, batch)}
    rows["client: 6 steps, delta, clip"] = {"ms": best_ms(client_fn, work.params, client, calls=20)}
    for row in rows.values():
        if row.get("gflops"):
            row["of_peak"] = row["gflops"] / peak
    return {"matmul_peak_gflops": peak, "parts": rows}


def in_process_two_devices() -> float:
    """Part 2 (a): milliseconds a client, 40 clients dispatched up front round-robin to two CPU
    devices."""
    import jax

    work, fn, _ = one_client(devices=2)
    devices = jax.devices()[:2]
    assert len(devices) == 2, "needs two CPU devices (a machine with two cores or more)"
    clients = work._cohort(0, 40)
    shared = [jax.device_put(work.params, d) for d in devices]
    placed = [
        jax.tree_util.tree_map(lambda x: jax.device_put(x[i], devices[i % 2]), clients)
        for i in range(40)
    ]
    return (
        best_ms(lambda: [fn(shared[i % 2], placed[i]) for i in range(40)], calls=1, repeats=3) / 40
    )


def one_core_client_ms() -> float:
    """Part 2 (b), one of the two processes: compiles, waits for ``START_AT`` (so that the two timed
    loops run together), then times its client."""
    import jax

    work, fn, client = one_client()
    jax.block_until_ready(fn(work.params, client))
    time.sleep(max(0.0, float(os.environ.get("START_AT", 0)) - time.time()))
    return best_ms(fn, work.params, client, calls=20)


def worker(what: str) -> None:
    result = {
        "parts": layer_parts,
        "two_devices": in_process_two_devices,
        "one_core": one_core_client_ms,
    }[what]()
    print("RESULT " + json.dumps(result), flush=True)


def run_worker(
    what: str, core: int | None = None, devices: int = 1, start_at: float = 0.0
) -> subprocess.Popen:
    env = {**os.environ, "FEDJAX_DP_CPU_DEVICES": str(devices), "START_AT": str(start_at)}
    command = [sys.executable, __file__, "--worker", what]
    if core is not None:
        command = ["taskset", "-c", str(core)] + command
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def result_of(process: subprocess.Popen):
    out, _ = process.communicate()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if process.returncode or not lines:
        raise RuntimeError(f"worker failed (exit {process.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def concurrency() -> dict:
    """Part 2: (a) then (b), then (a) again, so a drift of the machine shows."""
    rows = {"one process, two devices": [result_of(run_worker("two_devices", devices=2))]}
    start_at = time.time() + 30  # both processes compiled by then
    pinned = [run_worker("one_core", core=c, start_at=start_at) for c in (0, 1)]
    per_process = [result_of(p) for p in pinned]
    rows["two processes, one core each (each process's client ms)"] = per_process
    rows["one process, two devices"].append(result_of(run_worker("two_devices", devices=2)))
    in_process = min(rows["one process, two devices"])
    two_processes = max(per_process) / 2  # two clients in that many ms
    return {
        "ms_per_client": {
            "one process, two devices": in_process,
            "two pinned processes": two_processes,
        },
        "rows": rows,
        "in_process_loss": in_process / two_processes,
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", action="store_true", help="part 2 instead of part 1")
    parser.add_argument("--out", default=os.path.join(HERE, "out", "cnn_step_parts.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    from xla_cost import write_result

    if args.concurrency:
        result = concurrency()
    else:
        result = result_of(run_worker("parts", devices=1))
        for name, row in result["parts"].items():
            share = f"{row['of_peak']:.0%} of peak" if row.get("of_peak") else ""
            print(f"{name:48s} {row['ms']:7.2f} ms  {share}")
    print(json.dumps(result, indent=1))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
